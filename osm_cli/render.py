"""Records to rich renderables: the only module that imports rich.

Each function takes the records the core returned and gives back a renderable (a Table or a
Group); cli.py prints it. Numbers are formatted so the digits that differ are visible and so
inf and nan stand out (bold red). Leaves out: computing anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

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


def _fit(make: Callable[[int], Group], width: int, digits=(8, 7, 6, 5)) -> Group:
    """make(digits) with the most digits whose table (the group's second part) fits `width`."""
    probe = Console(width=10_000)
    for d in digits:
        group = make(d)
        if Measurement.get(probe, probe.options, group.renderables[1]).maximum <= width:
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


def element_table(scores, online, stable, naive, show_all: bool = False) -> Table:
    """Per-element probabilities: online, one-shot stabilized, naive, and their difference."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("i", "score", "online p", "stabilized p", "naive p", "|online−stab|", "ulps"):
        t.add_column(name, justify="right")
    diff = np.abs(online - stable)
    with np.errstate(divide="ignore", invalid="ignore"):
        ulps = np.where(diff == 0, 0.0, diff / np.spacing(np.abs(stable)))

    def row(i):
        return [
            str(i), num(scores[i], 10), num(online[i], 12), num(stable[i], 12),
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
    style = "green" if diff == 0 or diff < 1e-12 else "yellow"
    return Text.assemble(f"{label}: max |difference| = ", Text(f"{diff:.3g}", style=style))


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


def attention_summary(res, ref_err: dict | None) -> Table:
    """Shapes, conventions, tile counts and the error against the float64 reference."""
    t = Table(box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    window = "none" if res.window is None else f"left {res.window[0]}, right {res.window[1]}"
    rows = [
        ("shapes", f"Q {res.shape_q}  K {res.shape_k}  V {res.shape_v}"),
        ("scale", f"{res.scale:.8g}"),
        ("causal", f"yes ({res.align})" if res.causal else "no"),
        ("window", window),
        ("tiles", f"block_q {res.block_q}, block_k {res.block_k}: {res.tiles_computed} computed, "
                  f"{res.tiles_skipped} skipped of {res.extra['tiles_total']}"),
        ("rescales", f"{res.rescales} (row, tile) updates moved a finite running max"),
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
    for k, v in rows:
        t.add_row(k, v)
    return t


def attention_trace(res, ref_row, width: int = 100, show_all: bool = False) -> Group:
    """The traced query row, tile by tile, then its output beside the reference."""
    return _fit(lambda d: _attention_trace(res, ref_row, d, show_all), width, (7, 6, 5, 4))


def _attention_trace(res, ref_row, d: int, show_all: bool) -> Group:
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
        if s.m != s.m_prev and math.isfinite(s.m_prev):
            alpha.stylize("bold yellow")
        return [str(s.tile), f"{s.start}:{s.stop}", num(s.tile_max, d), arrow(s.m_prev, s.m, d),
                alpha, arrow(s.l_prev, s.l, d), values(s.o, max(3, d - 3), shown), num(s.o_norm, d)]

    _fill(t, len(res.trace), row, show_all)
    title = Text(f"trace of batch {b}, head {h}, query {i}: start m = -inf, l = 0, O = 0")
    parts = [title, t]
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
