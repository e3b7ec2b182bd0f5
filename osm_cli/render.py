"""Records to rich renderables: the only module that imports rich.

Each function takes the records the core returned and gives back a renderable (a Table or a
Group); cli.py prints it. Numbers are formatted so the digits that differ are visible and so
inf and nan stand out (bold red). Leaves out: computing anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

VALUES_UP_TO = 8  # step tables list a block's first values only for blocks this small
HEAD = 5  # long tables show the first and last HEAD rows around an ellipsis row


def num(x, digits: int = 8) -> Text:
    """A number as text: `digits` significant digits, inf/nan in bold red, -inf (a mask) dim."""
    if x is None:
        return Text("")
    x = float(x)
    if math.isnan(x):
        return Text("nan", style="bold red")
    if math.isinf(x):
        return Text("inf", style="bold red") if x > 0 else Text("-inf", style="cyan")
    return Text(f"{x:.{digits}g}")


def arrow(a, b, digits: int = 8) -> Text:
    """'a → b', or just 'b' when nothing changed."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return num(b, digits)
    return Text.assemble(num(a, digits), " → ", num(b, digits))


def values(xs: np.ndarray, digits: int = 4, most: int = 3) -> Text:
    """A short list of values: the first `most`, then '…'."""
    shown = [num(x, digits) for x in np.asarray(xs)[:most]]
    parts: list = []
    for i, t in enumerate(shown):
        parts += ([", "] if i else []) + [t]
    if len(xs) > most:
        parts.append(f", …{len(xs) - most}")
    return Text.assemble("[", *parts, "]")


def _elided(n: int, show_all: bool) -> list[int | None]:
    """Row indices to show: all, or the first and last HEAD with None for the ellipsis."""
    if show_all or n <= 2 * HEAD + 2:
        return list(range(n))
    return [*range(HEAD), None, *range(n - HEAD, n)]


def _fill(table: Table, n: int, row: Callable[[int], Sequence], show_all: bool) -> Table:
    for i in _elided(n, show_all):
        if i is None:
            table.add_row(*(["⋮"] * len(table.columns)), style="dim")
        else:
            table.add_row(*row(i))
    return table


def step_table(trace, show_all: bool = False, width: int = 100) -> Group:
    """One row per block: what entered, and the state (m, α, l) before → after.

    Numbers get 8 significant digits, or as many fewer (down to 5) as it takes to fit `width`.
    """
    return _fit(lambda d: _step_table(trace, show_all, d), width)


def _fit(make: Callable[[int], Group], width: int, digits=(8, 7, 6, 5), part: int = 1) -> Group:
    """make(digits) with the most digits whose table (the group's `part`) fits `width`."""
    probe = Console(width=10_000)
    for d in digits:
        group = make(d)
        if Measurement.get(probe, probe.options, group.renderables[part]).maximum <= width:
            break
    return group


def _step_table(trace, show_all: bool, d: int) -> Group:
    merge = trace.form == "merge"
    show_values = trace.block <= VALUES_UP_TO and not merge  # merge is the wider table
    title = (
        "form merge: each block's own m⁽ᵏ⁾ and l⁽ᵏ⁾ = Σ exp(s − m⁽ᵏ⁾), then\n"
        "m = max(m, m⁽ᵏ⁾), α = exp(m_old − m), w = exp(m⁽ᵏ⁾ − m), l = l·α + l⁽ᵏ⁾·w"
        if merge
        else "form rescale: m = max(m, block max), α = exp(m_old − m), l = l·α + Σ exp(s − m)"
    )
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    num_col = {"justify": "right", "no_wrap": True}
    t.add_column("#", **num_col)
    t.add_column("keys", **num_col)
    if show_values:  # first few scores of the block; this column wraps before numbers shrink
        t.add_column("values", no_wrap=True, max_width=18)
    if merge:
        t.add_column("m⁽ᵏ⁾", **num_col)
        t.add_column("l⁽ᵏ⁾", **num_col)
    else:
        t.add_column("block max", **num_col)
    t.add_column("m", **num_col)
    t.add_column("α", **num_col)
    if merge:
        t.add_column("w", **num_col)
    t.add_column("l", **num_col)
    steps = trace.steps

    def row(i):
        s = steps[i]
        cells = [str(s.block), f"{s.start}:{s.stop}"]
        cells += [values(s.values)] if show_values else []
        if merge:
            cells += [num(s.block_m, d), num(s.block_l, d)]
        else:
            cells += [num(s.block_max, d)]
        alpha = num(s.scale, d)
        if s.rescaled:
            alpha.stylize("bold yellow")
        if s.skipped:  # lazy rescale: the block max passed m, m was kept
            alpha.append(" skip", style="magenta")
        cells += [arrow(s.m_prev, s.m, d), alpha]
        if merge:
            cells += [num(s.block_weight, d)]
        cells += [arrow(s.l_prev, s.l, d)]
        return cells

    return Group(Text(title), _fill(t, len(steps), row, show_all))


def trace_header(name: str, n_rows: int, n: int, row: int, block: int) -> Text:
    where = f"row {row} of {n_rows}, " if n_rows > 1 else ""
    blocks = -(-n // block)
    return Text(
        f"{name}: {where}{n} scores in {blocks} block{'s' * (blocks != 1)} of {block}\n"
        "start: m = -inf, l = 0",
    )


def final_line(m: float, l: float, lse: float) -> Text:
    return Text.assemble(
        "final: m = ", num(m, 10), ", l = ", num(l, 10), ", LSE = m + ln l = ", num(lse, 10),
        " (natural log)",
    )


def element_table(scores, online, stable, naive, show_all: bool = False,
                  width: int = 100) -> Group:
    """Per-element probabilities: online, one-shot stabilized, naive, and their difference.

    Probabilities get 12 significant digits, or fewer (down to 6) as it takes to fit `width`.
    """
    return _fit(lambda d: Group(_element_table(scores, online, stable, naive, show_all, d)),
                width, (12, 10, 8, 6), part=0)


def _element_table(scores, online, stable, naive, show_all: bool, d: int) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("i", "score", "online p", "stabilized p", "naive p", "|online−stab|", "ulps"):
        t.add_column(name, justify="right")
    diff = np.abs(online - stable)
    with np.errstate(divide="ignore", invalid="ignore"):
        ulps = np.where(diff == 0, 0.0, diff / np.spacing(np.abs(stable)))

    def row(i):
        return [
            str(i), num(scores[i], 10), num(online[i], d), num(stable[i], d),
            num(naive[i], 6), num(diff[i], 3), num(ulps[i], 3),
        ]

    return _fill(t, len(scores), row, show_all)


def rows_table(m, l, lse, max_diff, show_all: bool = False) -> Table:
    """The summary of every row of a score matrix."""
    t = Table(title="all rows", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for name in ("row", "m", "l", "LSE", "max |online−stab|"):
        t.add_column(name, justify="right")
    return _fill(
        t, len(m),
        lambda i: [str(i), num(m[i], 10), num(l[i], 10), num(lse[i], 10), num(max_diff[i], 3)],
        show_all,
    )


def agreement(label: str, diff: float) -> Text:
    """'label: max |difference| = d': d green when (nearly) 0, yellow when not; inf and nan as
    num shows them."""
    shown = num(diff, 3)
    if math.isfinite(diff):
        shown.style = "green" if diff == 0 or diff < 1e-12 else "yellow"
    return Text.assemble(f"{label}: max |difference| = ", shown)


def trace_heads(rep, name: str) -> list:
    """What comes before osm trace's step tables (report.TraceReport): the header, and what a
    lazy threshold does."""
    n_rows, n = np.atleast_2d(rep.scores).shape
    heads = [trace_header(name, n_rows, n, rep.row, rep.block)]
    return heads + ([lazy_note(rep.threshold)] if rep.threshold else [])


def trace_results(rep, show_all: bool = False, width: int = 100) -> Group:
    """What follows osm trace's step tables: the final state, the traced row's elements beside
    the references, every row, and the lazy and order checks asked for."""
    t, row = rep.trace, rep.row
    m, l, lse = (np.atleast_1d(a) for a in (t.m, t.l, t.lse))
    parts: list = [final_line(m[row], l[row], lse[row])]
    if rep.in_dtype:
        lt = rep.in_dtype[0]
        return Group(*parts, dtype_elements(rep.scores, lt, row, show_all),
                     dtype_trace_note(lt, row))
    if rep.forms_diff is not None:
        parts.append(agreement("rescale vs merge", rep.forms_diff))
    rows = np.atleast_2d(rep.scores)
    p, stable, naive = (np.atleast_2d(a)[row] for a in (t.probabilities, rep.reference, rep.naive))
    parts += [element_table(rows[row], p, stable, naive, show_all, width),
              agreement("online vs one-shot stabilized", float(rep.max_diff[row]))]
    if rows.shape[0] > 1:
        parts.append(rows_table(m, l, lse, rep.max_diff, show_all))
    if rep.lazy is not None:
        lz = rep.lazy
        parts += [lazy_summary(lz.rescales, lz.rescales_eager, lz.skipped, lz.max_excess,
                               lz.threshold),
                  agreement("lazy vs eager", lz.max_abs_diff)]
    if rep.check is not None:
        parts.append(order_table(rep.check, rep.seed))
    return Group(*parts)


# ---------------------------------------------------------------------------------------------
# overflow-demo


def overflow_tables(demo) -> Group:
    """Three tables: exp of each value per dtype, softmax by each method, and the all −inf row."""
    xs = demo.values
    head = Table(
        title=f"exp(x) in each dtype (x = {', '.join(f'{x:g}' for x in xs)})",
        box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
    )
    head.add_column("dtype")
    head.add_column("largest finite", justify="right")
    head.add_column("exp overflows above", justify="right")
    head.add_column("exp underflows below", justify="right")
    for x in xs:
        head.add_column(f"exp({x:g})", justify="right")
    for d in demo.rows:
        head.add_row(
            d.dtype, num(d.max_finite, 4), num(d.overflow_at, 6), num(d.underflow_at, 6),
            *(num(e, 4) for e in d.exp),
        )
    soft = Table(title="softmax(x)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    soft.add_column("dtype")
    soft.add_column("method")
    for i in range(len(xs)):
        soft.add_column(f"p[{i}]", justify="right")
    for d in demo.rows:
        if not d.fits:
            continue
        for method, p in (("naive", d.naive), ("stabilized", d.stable), ("online", d.online)):
            soft.add_row(d.dtype if method == "naive" else "", method, *(num(v, 6) for v in p))
        soft.add_section()
    masked = Table(
        title="a fully masked row, x = [-inf, -inf, -inf] (float32)",
        box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
    )
    masked.add_column("method")
    masked.add_column("probabilities")
    masked.add_column("why", ratio=1)
    for method, p, why in demo.masked:
        masked.add_row(method, values(p, 6), why)
    return Group(
        head, Text(demo.overflow_note + "\n"), soft, Text(""), masked, Text(demo.masked_note)
    )


# ---------------------------------------------------------------------------------------------
# attention


def _kv_table(rows) -> Table:
    """(label, value) rows, the labels in bold, without a header: summaries and verdicts."""
    t = Table(box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def attention_summary(res, ref_err: dict | None) -> Table:
    """Shapes, conventions, tile counts and the error against the float64 reference."""
    window = "none" if res.window is None else f"left {res.window[0]}, right {res.window[1]}"
    rows = [
        ("shapes", f"Q {res.shape_q}  K {res.shape_k}  V {res.shape_v}"),
        ("scale", f"{res.scale:.8g}"),
        ("causal", f"yes ({res.align})" if res.causal else "no"),
        ("window", window),
        ("mask", res.extra["mask"]),
    ]
    if res.extra.get("one_shot"):
        rows.append(("tiles", "none: plain attention computes all scores at once"))
    else:
        rows += [
            ("tiles", f"block_q {res.block_q}, block_k {res.block_k}: {res.tiles_computed} "
                      f"computed, {res.tiles_skipped} skipped of {res.extra['tiles_total']}"),
            ("rescales", f"{res.rescales} (row, tile) updates moved a finite running max"),
        ]
    rows += [
        ("fully masked rows", f"{res.masked_rows} (output 0, LSE {res.masked_lse})"),
    ]
    if ref_err is None:
        rows.append(("reference", "skipped (--no-reference)"))
    else:
        rows += [
            ("max |O − ref|", num(ref_err["max_abs_err"], 3)),
            ("max relative err of O", num(ref_err["max_rel_err"], 3)),
            ("max |LSE − ref|", num(ref_err["max_lse_err"], 3)),
        ]
    return _kv_table(rows)


def attention_heads(rep) -> list:
    """What comes before osm attention's trace (report.AttentionReport): the summary, and under
    --dtype the precision model, the inputs' rounding and the verdict."""
    heads = [attention_summary(rep.result, rep.errors)]
    if rep.model is not None:
        heads.append(precision_summary(rep.model, rep.notes, rep.verdict))
    if rep.baseline is not None:
        heads.append(baseline_lines(rep.baseline))
    return heads


def baseline_lines(b) -> Text:
    """A reordered or lazy attention run against the same run forward and eager."""
    what = []
    if b.order != "forward":
        what.append(f"K/V tiles {b.order}")
    if b.threshold:
        what.append(f"lazy rescale τ = {b.threshold:g} (natural log)")
    saved = f" ({b.rescales_eager - b.rescales} saved)" if b.threshold else ""
    return Text.assemble(
        f"{', '.join(what)}: {b.rescales} rescales, {b.rescales_eager} forward and eager{saved}",
        "\n", agreement("O vs the forward, eager run", b.max_abs_diff), "\n",
        agreement("LSE vs the forward, eager run", b.max_lse_diff),
    )


def attention_trace(res, width: int = 100, show_all: bool = False) -> Group:
    """The traced query row, tile by tile (attention_results shows its output)."""
    return _fit(lambda d: _attention_trace(res, d, show_all), width, (7, 6, 5, 4))


def _attention_trace(res, d: int, show_all: bool) -> Group:
    b, h, i = res.traced
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    nc = {"justify": "right", "no_wrap": True}
    for name in ("tile", "keys", "tile max", "m", "α", "l"):
        t.add_column(name, **nc)
    shown = len(res.trace[0].o) if res.trace else 0
    t.add_column(f"O[:{shown}] (unnormalised)", no_wrap=True)
    t.add_column("‖O‖", **nc)

    def row(n):
        s = res.trace[n]
        if s.skipped:
            return [str(s.tile), f"{s.start}:{s.stop}", Text("skipped", style="dim"),
                    num(s.m, d), "", num(s.l, d), "", ""]
        alpha = num(s.alpha, d)
        if s.rescaled:
            alpha.stylize("bold yellow")
        if s.rescale_skipped:  # lazy rescale: the tile max passed m, m was kept
            alpha.append(" skip", style="magenta")
        return [str(s.tile), f"{s.start}:{s.stop}", num(s.tile_max, d), arrow(s.m_prev, s.m, d),
                alpha, arrow(s.l_prev, s.l, d), values(s.o, max(3, d - 3), shown), num(s.o_norm, d)]

    _fill(t, len(res.trace), row, show_all)
    title = Text(f"trace of batch {b}, head {h}, query {i}: start m = -inf, l = 0, O = 0")
    return Group(title, t)


def attention_output(res, ref_row, show_all: bool = False) -> Group:
    """The traced row's output O / l beside the reference (empty without a traced row)."""
    parts: list = []
    if res.trace_out is not None:
        o = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("j", "output", "reference", "|diff|"):
            o.add_column(name, justify="right")
        n = len(res.trace_out)

        def orow(j):
            r = None if ref_row is None else ref_row[j]
            return [str(j), num(res.trace_out[j], 10), num(r, 10),
                    num(None if r is None else abs(res.trace_out[j] - r), 3)]

        parts += [Text("output row O / l"), _fill(o, n, orow, show_all)]
    return Group(*parts)


def attention_results(rep, show_all: bool = False) -> Group:
    """What follows osm attention's trace (report.AttentionReport): the traced row's output
    beside the reference, then the splits of --splits."""
    split = [] if rep.split is None else [split_table(rep.split)]
    return Group(attention_output(rep.result, rep.ref_row, show_all), *split)


def attention_step_frame(headers: Sequence, res, upto: int, width: int = 100) -> Group:
    """attention --step: the headers, the traced row's tiles up to `upto` (that row
    highlighted) and a hint."""
    return _frame(headers, res.trace, upto, "tile",
                  lambda shown: attention_trace(replace(res, trace=shown), width))


def progress_bar(console: Console):
    """A transient progress bar for long runs (the caller decides when to show it)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("Q tiles"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeRemainingColumn(), console=console, transient=True)


def split_table(run) -> Group:
    """Flash-Decoding's splits for the traced row: each (LSE_s, O_s) and its merge weight."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("split", "keys", "LSE_s", "weight exp(LSE_s − L)", "O_s[:3] (normalised)"):
        t.add_column(name, justify="right" if name != "O_s[:3] (normalised)" else "left")
    for s in run.splits:
        t.add_row(str(s.split), f"{s.start}:{s.stop}", num(s.lse, 8), num(s.weight, 8),
                  values(s.o, 5, 3))
    return Group(
        Text("split-KV (Flash-Decoding): each split run to (O_s, LSE_s), then\n"
             "L = logsumexp LSE_s, O = Σ exp(LSE_s − L)·O_s"),
        t,
        agreement("merged vs unsplit O", run.max_abs_diff),
        agreement("merged vs unsplit LSE", run.max_lse_diff),
    )


# ---------------------------------------------------------------------------------------------
# trace extras: step mode, lazy rescale, block order; osm merge, sweep, cost


def step_frame(headers: Sequence, trace, upto: int, width: int = 100) -> Group:
    """Step mode: the header, the step table up to block `upto` (that row highlighted), a hint."""
    return _frame(headers, trace.steps, upto, "block",
                  lambda shown: step_table(replace(trace, steps=shown), False, width))


def _frame(headers: Sequence, steps: Sequence, upto: int, unit: str,
           table: Callable[[Sequence], Group]) -> Group:
    """One step-mode frame: the headers, table(the steps up to `upto`) (a title, then the table,
    whose last row is highlighted) and the hint."""
    group = table(steps[: upto + 1])
    group.renderables[1].rows[-1].style = "reverse"
    return Group(*headers, *group.renderables, step_hint(upto, len(steps), unit))


def step_hint(upto: int, n: int, unit: str = "block") -> Text:
    """Where step mode is and which keys move it on."""
    hint = (
        f"{unit} {upto + 1} of {n} · Enter or space: next {unit} · q: quit"
        if upto + 1 < n else f"{unit} {n} of {n}: done"
    )
    return Text(hint, style="bold")


def lazy_note(threshold: float) -> Text:
    """What --rescale-threshold τ does, in the units it is given in."""
    return Text(
        f"lazy rescale, τ = {threshold:g} (natural log; {threshold / math.log(2):.4g} in log2): "
        "m moves only when a block max\nexceeds it by more than τ. 'skip': the block max passed m, "
        "and the old state was not rescaled"
    )


def lazy_summary(lazy: int, eager: int, skipped: int, excess: float, threshold: float) -> Text:
    """Rescales counted with and without τ, and the largest exponent the stale m let through."""
    saved = eager - lazy
    ex = "none" if not math.isfinite(excess) else (
        f"{excess:.6g} (exp ≤ {math.exp(excess):.6g}; bound e^τ = {math.exp(threshold):.6g})"
    )
    return Text.assemble(
        f"rescales: {lazy} lazy (τ = {threshold:g}) vs {eager} eager: ",
        Text(f"{saved} saved", style="green" if saved > 0 else ""),
        f", {skipped} skipped\nlargest block max − m (the exponent a stale m lets through): {ex}",
    )


def _order_text(indices) -> str:
    idx = [str(int(i)) for i in indices]
    return " ".join(idx) if len(idx) <= 24 else " ".join(idx[:12] + ["…"] + idx[-12:])


def order_table(check, seed: int | None = None) -> Group:
    """Forward fold vs the chosen block order vs a pairwise (tree) merge of block states."""
    label = check.order + (f" (seed {seed})" if check.order == "shuffle" else "")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("comparison", "max |Δp|", "max |ΔLSE|"):
        t.add_column(name, justify="left" if name == "comparison" else "right")
    t.add_row(f"forward vs {check.order}", num(check.p_order, 3), num(check.lse_order, 3))
    t.add_row("forward vs tree merge", num(check.p_tree, 3), num(check.lse_tree, 3))
    t.add_row(f"{check.order} vs tree merge", num(check.p_order_tree, 3), Text(""))
    return Group(
        Text(f"block order {label}: {_order_text(check.indices)}\n"
             "tree merge: each block's own (m, l), merged pairwise ((0⊕1)⊕(2⊕3))…, all rows"),
        t,
    )


def merge_table(names: Sequence[tuple[str, str]], rep) -> Group:
    """osm merge (merge.MergeReport): one row per split (empty rows, LSE and weight ranges, the
    chosen row), then the merged result; names are the (O, LSE) file pairs."""
    stats, merged, row = rep.stats, rep.merged, rep.row
    base = "log2" if merged.lse_base == "2" else "natural log"
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
              title=f"splits (LSE in {base}; weight = exp(LSE_s − L), L = logsumexp LSE_s)")
    for name in ("split", "files O, LSE", "empty rows", "+inf", "LSE range", "weight range",
                 f"row {row}: LSE_s", "weight"):
        t.add_column(name, justify="left" if name.startswith("files") else "right",
                     no_wrap=not name.startswith("files"))
    for st, (o_name, l_name), row_lse, row_w in zip(stats, names, rep.row_lses, rep.row_weights,
                                                    strict=True):
        if st.empty < st.rows:
            lse_range = Text.assemble(num(st.lse_min, 5), " … ", num(st.lse_max, 5))
            w_range = Text.assemble(num(st.weight_min, 4), " … ", num(st.weight_max, 4))
        else:
            lse_range = w_range = Text("all empty", style="dim")
        t.add_row(
            str(st.split), f"{Path(o_name).name}, {Path(l_name).name}", f"{st.empty}/{st.rows}",
            str(st.pos_inf), lse_range, w_range, num(row_lse, 8), num(row_w, 8),
        )
    live = merged.lse[np.isfinite(merged.lse)]
    summary = Text.assemble(
        f"merged: O {tuple(merged.out.shape)}, LSE {tuple(merged.lse.shape)} ({base}); ",
        f"{rep.empty_rows} of {merged.lse.size} row(s) empty in every split (O = 0, LSE = -inf)",
        *((";\nLSE range ", num(live.min(), 8), " … ", num(live.max(), 8)) if live.size else ()),
        f"\nrow {row}: L = ", num(rep.row_lse, 10), ", O[:4] = ", values(rep.row_out, 8, 4),
    )
    return Group(t, summary)


def bytes_text(n: int, binary: bool = False) -> str:
    """A byte count for people: 1.64 GB (1000-based) or, binary, 97 KiB (1024-based)."""
    step, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB")) if binary else (
        1000, ("B", "kB", "MB", "GB", "TB"))
    x = float(n)
    for unit in units:
        if abs(x) < step or unit == units[-1]:
            return f"{int(x)} B" if unit == "B" else f"{x:.3g} {unit}"
        x /= step
    return f"{n} B"  # pragma: no cover


def attention_sweep_about(result, shapes, mask_kw: dict, accum: str) -> str:
    """osm sweep Q K V: the `about` lines of sweep_table (shapes, mask, sizes, state dtype)."""
    masks = [f"causal ({mask_kw['causal_align']})"] if mask_kw["causal"] else []
    masks += [] if mask_kw["window"] is None else ["window {},{}".format(*mask_kw["window"])]
    masks += [] if mask_kw["mask"] is None else ["--mask"]
    sq, sk, sv = (tuple(x) for x in shapes)
    return (f"Q {sq}  K {sk}  V {sv}, {', '.join(masks) or 'no mask'}\nB = {result.batch}, "
            f"H = {result.heads}, {result.n_q} queries × {result.n_k} keys per head: the tiled "
            f"forward at each block_k (state in {accum})")


def sweep_table(result, source: str, about: str | None = None) -> Group:
    """osm sweep: per block size the measured error and rescales beside the modelled costs.

    about: for a Q/K/V sweep, the lines that describe the run (shapes, mask, state dtype); the
    error is then of O, the tiles are computed or skipped, and when the mask skipped tiles a
    column gives FA1's block-sparse traffic in place of the std/tiled ratio.
    """
    r = result
    qkv = about is not None
    sparse = qkv and any(x.sparse for x in r.rows)
    first = f"{source}: {about}" if qkv else (
        f"{source}: {r.n_q} row(s) × {r.n_k} keys, measured per block size")
    d_text = f"d = {r.d} (Q's)" if qkv else f"head dim d = {r.d}"
    head = Text(
        f"{first}\n"
        f"model: {d_text}, {r.dtype_bytes} bytes per element, tiles of {r.block_q} "
        f"query rows, SRAM {bytes_text(r.sram_bytes, True)}\n"
        f"(M = {r.sram_bytes // r.dtype_bytes} elements: FA1 would pick B_r = {r.fa1_block[0]}, "
        f"B_c = {r.fa1_block[1]})\nstandard attention, forward: {bytes_text(r.hbm_standard)} "
        "of HBM traffic (model)"
    )
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    names = ("block", "tiles", "skipped" if qkv else "masked", "rescales",
             "max |O−ref|" if qkv else "max |p−ref|", "max |ΔLSE|", "tile bytes", "fits",
             "HBM tiled", "HBM skip" if sparse else "std/tiled")
    for name in names:
        t.add_column(name, justify="right", no_wrap=True)
    for row in r.rows:
        m = row.measure
        last = (bytes_text(row.hbm_skipping) if sparse else
                f"{r.hbm_standard / row.hbm_flash:.3g}×")
        t.add_row(
            str(row.block), str(m.tiles), str(m.skipped), str(m.rescales), num(m.max_error, 3),
            num(m.lse_error, 3), bytes_text(row.tile_bytes, True),
            Text("yes", style="green") if row.fits else Text("no", style="bold red"),
            bytes_text(row.hbm_flash), last,
        )
    what = ("skipped: tiles the mask hides entirely, not computed (tiles counted per head)."
            if qkv else "masked: tiles whose scores are all -inf (a kernel with the mask skips "
            "them).")
    skip = ("\nHBM skip: the same model with the skipped tiles left out (FA1 Prop. 4, "
            "block-sparse)." if sparse else "")
    note = Text(
        "tile bytes: one tile step's working set, Q_i, K_j, V_j in the input dtype and S, the "
        f"O accumulator,\nm, l in fp32. {what}\nHBM bytes (forward) are FA1's I/O model "
        f"(Algorithms 0 and 1), not a measurement.{skip}",
        style="dim",
    )
    return Group(head, t, note)


def cost_table(c) -> Group:
    """osm cost: modelled HBM traffic of standard and tiled attention for one shape."""
    head = Text(
        f"N = {c.N}, d = {c.d}, {c.heads} heads, batch {c.batch}, {c.dtype_bytes} bytes per "
        f"element\nSRAM {bytes_text(c.sram_bytes, True)}: M = {c.sram_bytes // c.dtype_bytes} "
        f"elements, FA1 tiles B_c = ceil(M/4d) = {c.block_k}, B_r = min(B_c, d) = {c.block_q}"
    )
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("HBM reads + writes (model)", "standard", "tiled (FlashAttention)", "ratio"):
        t.add_column(name, justify="left" if name.startswith("HBM") else "right")
    for label, std, fl in (
        ("forward", c.standard_fwd, c.flash_fwd),
        ("forward + backward", c.standard_fwd_bwd, c.flash_fwd_bwd),
        ("forward + backward, mask and dropout as\nseparate kernels in standard",
         c.standard_fwd_bwd_passes, c.flash_fwd_bwd),
    ):
        t.add_row(label, bytes_text(std), bytes_text(fl), f"{std / fl:.3g}×")
    note = Text(
        f"matmul FLOPs (both): {c.flops_fwd / 1e9:.4g} G forward, {c.flops_fwd_bwd / 1e9:.4g} G "
        "forward + backward. GB = 10⁹ bytes.\nThis is FA1's I/O model (Theorem 2; Algorithms 0, "
        "1, 3 and 4 counted line by line),\nnot a measurement: caches, kernel launches and "
        "recomputation are left out.",
        style="dim",
    )
    return Group(head, t, note)


# ---------------------------------------------------------------------------------------------
# precision: --dtype, the verdict, osm check


def pass_fail(passed: bool) -> Text:
    return Text("PASS", style="bold green") if passed else Text("FAIL", style="bold red")


def rounding_text(notes) -> Text:
    """Per rounded array: values moved, overflowed to inf (bold red), underflowed to 0 (yellow)."""
    parts: list = []
    for i, r in enumerate(notes):
        parts += ["; " if i else "", f"{r.name} {r.changed} of {r.size} moved"]
        if r.changed > r.overflowed:
            parts.append(f" (max |Δ| {r.max_abs_change:.3g})")
        if r.overflowed:
            parts += [", ", Text(f"{r.overflowed} overflowed to inf", style="bold red")]
        if r.underflowed:
            parts += [", ", Text(f"{r.underflowed} underflowed to 0", style="yellow")]
    return Text.assemble(*parts)


def _rule_text(r, what: str = "out") -> Text:
    line = Text.assemble(
        f"max|{what} − ref| = ", num(r.err, 3), " ≤ 2·" if r.passed else " > 2·",
        num(r.pt_err, 3), " + 2·",
        num(r.rounding, 3), " = ", num(r.bound, 3), "  ", pass_fail(r.passed),
    )
    if r.note:
        line.append(f"  ({r.note})", style="yellow")
    return line


def _verdict_rows(v, model_err: float | None = None, label: str = "this run") -> list:
    ratio = f"  ({v.plain_err / v.err:.3g}× {label})" if v.err else ""
    rows = [(f"max |O − ref64|, {label}", num(v.err, 3))]
    if model_err is not None:
        rel = f"  ({v.err / model_err:.3g}× the model)" if model_err else ""
        rows.append(("max |O − ref64|, osm flash model", Text.assemble(num(model_err, 3), rel)))
    rows += [
        (f"max |O − ref64|, plain {v.dtype}", Text.assemble(num(v.plain_err, 3), ratio)),
        ("FlashAttention test rule", _rule_text(v.rule)),
    ]
    if v.lse is not None:
        rows += [
            ("max |LSE − ref64|", Text.assemble(num(v.lse_err, 3), "  (plain ",
                                                num(v.plain_lse_err, 3), ")")),
            ("LSE rule", _rule_text(v.lse, "lse")),
        ]
    return rows


def precision_summary(model, notes, verdict) -> Table:
    """osm attention --dtype: the precision model, what rounding the inputs did, the verdict."""
    rows = [("precision", model.describe()), (f"inputs in {model.name}", rounding_text(notes))]
    if verdict is None:
        rows.append(("verdict", "skipped (--no-reference)"))
    else:
        rows += _verdict_rows(verdict)
    return _kv_table(rows)


def check_report(rep, name: str, top: int) -> Group:
    """osm check: the verdict, then the worst rows and heads against the dtype-rounded reference."""
    v = rep.verdict
    head = Text(f"{name}: shape {rep.shape}, judged as {v.dtype} against the float64 reference "
                f"of the {v.dtype}-rounded Q, K, V")
    t = _kv_table([("inputs", rounding_text(rep.notes)),
                   *_verdict_rows(v, rep.model_err, "the kernel"),
                   ("rows over the bound", f"{rep.rows_over} of {rep.total_rows}"),
                   ("verdict", pass_fail(v.passed))])
    rows = Table(title=f"worst {min(top, len(rep.rows))} rows (ulp of {v.dtype} at the row's "
                 "largest |ref|)", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for c in ("batch", "head", "query", "max |out − ref|", "ulps", "|LSE − ref|"):
        rows.add_column(c, justify="right")
    for r in rep.rows:
        err = num(r.err, 3)
        if r.err > v.rule.bound:  # nan is bold red already
            err.style = "bold red"
        rows.add_row(str(r.batch), str(r.head), str(r.query), err, num(r.ulps, 3),
                     num(r.lse_err, 3))
    heads = Table(title="worst heads", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for c in ("batch", "head", "max |out − ref|", "rows over the bound"):
        heads.add_column(c, justify="right")
    for h in rep.heads:
        heads.add_row(str(h.batch), str(h.head), num(h.err, 3), str(h.rows_over))
    parts = [head, t, rows, heads]
    if rep.hint:
        parts.append(Text(rep.hint, style="yellow"))
    return Group(*parts)


def dtype_trace_note(lt, row: int) -> Text:
    """osm trace --dtype: how the scores were rounded, where the state was held, the difference."""
    m = lt.model
    where = (f"m, α, l held in {m.accum.name}, p rounded to {m.name} (precision flash)"
             if m.precision == "flash" else f"m, α, l and p held in {m.name} (precision naive)")
    diff = float(np.atleast_1d(lt.max_diff)[row])
    ulps = np.atleast_2d(lt.ulps)[row]
    worst = float(np.nanmax(ulps)) if np.isfinite(ulps).any() else math.nan
    parts: list = [f"rounded to {m.name}: ", rounding_text([lt.rounding]), f"\n{where}\n",
                   "vs float64 on the unrounded scores: max |p − p64| = ", num(diff, 3),
                   " (", num(worst, 3), f" ulps of {m.name})"]
    if lt.p_underflowed:
        parts += ["; ", Text(f"{lt.p_underflowed} p underflowed to 0", style="yellow")]
    if lt.alpha_underflowed:
        blocks = ", ".join(str(b) for b in lt.alpha_underflowed)
        parts += ["; ", Text(f"α underflowed to 0 at block {blocks}", style="yellow")]
    return Text.assemble(*parts)


def dtype_elements(scores, lt, row: int, show_all: bool = False) -> Table:
    """Per element: the score as given and as the dtype holds it, p, the float64 p, naive p."""
    m = lt.model
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for c in ("i", "score", f"in {m.name}", "online p", "float64 p", "naive p", "|p − p64|",
              "ulps", ""):
        t.add_column(c, justify="right" if c else "left")
    s, held = np.atleast_2d(scores)[row], np.atleast_2d(lt.scores)[row]
    p, exact = np.atleast_2d(lt.probabilities)[row], np.atleast_2d(lt.exact)[row]
    naive, ulps = np.atleast_2d(lt.naive)[row], np.atleast_2d(lt.ulps)[row]

    def cells(i):
        note = ""
        if np.isfinite(s[i]) and not np.isfinite(held[i]):
            note = Text("overflow → " + ("inf" if np.isinf(held[i]) else "nan"), style="bold red")
        elif s[i] != 0 and held[i] == 0:
            note = Text("underflow → 0", style="yellow")
        elif p[i] == 0 and exact[i] > 0:
            note = Text("p underflows to 0", style="yellow")
        return [str(i), num(s[i], 10), num(held[i], 8), num(p[i], 8), num(exact[i], 10),
                num(naive[i], 6), num(abs(p[i] - exact[i]), 3), num(ulps[i], 3), note]

    return _fill(t, len(s), cells, show_all)


def overflow_report(demo) -> Group:
    """overflow-demo: its tables, then the values as each dtype holds them, if a dtype moved any."""
    moved = any(not np.array_equal(r.held, demo.values) for r in demo.rows)
    return Group(overflow_tables(demo), *([held_table(demo)] if moved else []))


def held_table(demo) -> Table:
    """overflow-demo: the values as each dtype holds them (shown when a dtype moved them)."""
    t = Table(title="x as each dtype holds it", box=box.SIMPLE_HEAD, title_justify="left",
              pad_edge=False)
    t.add_column("dtype")
    for i in range(len(demo.values)):
        t.add_column(f"x[{i}] = {demo.values[i]:g}", justify="right")
    for d in demo.rows:
        t.add_row(d.dtype, *(num(x, 6) for x in d.held))
    return t
