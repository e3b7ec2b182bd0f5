"""osm attention's tables: the summary, the traced row tile by tile, its output beside the
reference, the split-KV table, and the progress bar of long runs.

Leaves out: computing anything (reports/attention.py), the verdict's rows (verdicts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rich import box
from rich.console import Console, Group
from rich.text import Text

from osm_cli.flash.notebook import convention_rows, tiles_text

from .format import Table, agreement, arrow, fill, fit, kv_table, num, values
from .stepmode import frame
from .verdicts import precision_summary


def kernel_text(name: str, block_k: int | None = None, splits: int = 1, *, mma: str,
                dtype: str | None = None, block_k_given: bool = False) -> str:
    """One line on the kernel a run modelled (precision/presets.py): its tile width (block_k;
    None: not said) and order, split-KV, exp, lazy rescale, FP8's offset, the normalisation,
    the matmuls, how verified."""
    from osm_cli.precision.presets import PRESETS

    p = PRESETS[name]
    title = "osm's own readable loop (attention/)" if name == "tiles" else p.title
    order = "last to first" if p.reverse else "first to last"
    width = f"{block_k} (--block-k, not the kernel's own)" if block_k_given else f"{block_k}"
    parts = [f"K/V tiles of {width} visited {order}" if block_k is not None else
             f"K/V tiles visited {order}"]
    if splits > 1:
        parts.append(f"split-KV: {splits} key ranges merged in float32")
    parts.append({"exp2-fma": "exp2 on an FMA",
                  "exp2-unfused": "exp2 of S·c rounded, minus m·c",
                  "exp2-emu": "exp2 on an FMA, some columns by a degree-3 polynomial",
                  "exp": "exp(S − m)"}[p.exp])
    if dtype is not None and p.threshold(dtype) > 0:
        parts.append(f"lazy rescale τ = {p.threshold(dtype):g} (log2)")
    if dtype is not None and p.max_offset(dtype):
        parts.append(f"P = exp2(… + {p.max_offset(dtype)}) before FP8")
    parts.append("O·(1/l)" if p.normalise.startswith("reciprocal") else "O / l")
    if name != "tiles":  # a preset's matmuls: its own, or BLAS's quick approximation
        parts.append("tensor cores' truncating accumulation" if mma == "tensor-core" else
                     "matmuls by BLAS (--mma blas: within an ulp)")
    line = f"{name}: {title}: {'; '.join(parts)}"
    if name == "fa4-sm100":
        line += "; unverified on hardware (modelled from source)"
    return line


def attention_summary(res, ref_err: dict | None, kernel: str | None = None) -> Table:
    """Shapes, conventions, tile counts and the error against the float64 reference; kernel
    (kernel_text's line) is the summary's line on the kernel modelled, None for none."""
    rows = convention_rows(res)
    if kernel is not None:
        rows.append(("kernel", kernel))
    if res.options.one_shot:
        rows.append(("tiles", "none: plain attention computes all scores at once"))
    else:
        rows += [
            ("tiles", tiles_text(res)),
            ("rescales",
             f"{res.counters.rescales} times a tile raised a row's m (l and O then × α < 1)"),
        ]
    rows += [
        ("fully masked rows",
         f"{res.counters.masked_rows} (output 0, LSE {res.options.masked_lse})"),
    ]
    if ref_err is None:
        rows.append(("reference", "skipped (--no-reference)"))
    else:
        rows += [
            ("max |O − ref|", num(ref_err["max_abs_err"], 3)),
            ("max relative err of O", num(ref_err["max_rel_err"], 3)),
            ("max |LSE − ref|", num(ref_err["max_lse_err"], 3)),
        ]
    return kv_table(rows)


def attention_heads(rep) -> list:
    """What comes before osm attention's trace (report.AttentionReport): the summary, and under
    --dtype the precision model, the inputs' rounding and the verdict."""
    kernel = None
    if rep.shown and rep.kernel is not None:
        res = rep.result
        kernel = kernel_text(rep.kernel, res.tiles.block_k, res.options.splits, mma=rep.mma,
                             block_k_given=rep.block_k_given,
                             dtype=rep.model.name if rep.model is not None else None)
    heads = [attention_summary(rep.result, rep.errors, kernel)]
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


# attention_trace's variants, tried in order until one fits: (digits, the O[:3] column, m and
# l as "before → after"); the narrowest show m and l after each tile (the row above: before)
TRACE_VARIANTS = (
    (7, 3, True), (6, 3, True), (7, 3, False), (6, 3, False), (5, 3, False), (6, 2, False),
    (5, 2, False), (5, 1, False), (7, 0, True), (6, 0, True), (7, 0, False), (6, 0, False),
    (5, 0, False), (4, 0, False),
)


def attention_trace(res, width: int = 100, show_all: bool = False) -> Group:
    """The traced query row, tile by tile (attention_results shows its output).

    Numbers get 7 significant digits; to fit `width`, 6, then m and l shown after each tile
    only, then fewer of O's leading components (‖O‖ stays; the title says what is left out).
    The steps are attention's Step records, so a backward trace can render through this too.
    """
    return fit(lambda v: _attention_trace(res, show_all, *v), width, TRACE_VARIANTS)


def _attention_trace(res, show_all: bool, d: int, o_shown: int = 3,
                     arrows: bool = True) -> Group:
    if len(res.trace.rows) > 1:
        from .rows import rows_trace

        return rows_trace(res, show_all, d, o_shown, arrows)
    b, h, i = res.trace.at
    steps = res.trace.steps
    t, cols = trace_table(res, steps, o_shown)
    moved = [n for n, s in enumerate(steps) if s.m != s.m_prev]
    fill(t, len(steps), lambda n: step_cells(steps[n], d, arrows, cols), show_all, moved,
         "tiles")
    what = "sequence" if res.options.batch else "batch"
    title = f"trace of {what} {b}, head {h}, query {i}: start m = -inf, l = 0, O = 0"
    return Group(Text(title + trace_notes(res, steps, cols, arrows)), t)


def trace_table(res, steps, o_shown: int, query: bool = False) -> tuple[Table, dict]:
    """The trace table's columns (a query column first after the keys for several rows) and
    what its cells need: {"shown": O's components shown, "held": those the steps hold,
    "pages": a pages column, "fp8": a P max column}."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    nc = {"justify": "right", "no_wrap": True}
    for name in ("tile", "keys", *(("query",) if query else ()), "tile max", "m", "α", "l"):
        t.add_column(name, **nc)
    held = len(steps[0].o) if steps and steps[0].o is not None else 0
    shown = min(held, o_shown)
    dv = res.out.shape[-1] if getattr(res, "out", None) is not None else held
    if shown:
        t.add_column(f"O[:{shown}]" + (f" of {dv}" if dv > shown else ""), no_wrap=True)
    t.add_column("‖O‖", **nc)
    cols = {"shown": shown, "held": held, "pages": any(st.pages for st in steps),
            "fp8": any(st.p_max is not None for st in steps)}
    if cols["pages"]:
        t.add_column("pages", **nc)
    if cols["fp8"]:  # FP8: P's largest before rounding, and how many of the row's P saturate
        t.add_column("P max (sat)", **nc)
    return t, cols


def step_cells(s, d: int, arrows: bool, cols: dict, query: str | None = None) -> list:
    """One step's cells in a trace_table (query: the query column's text, for several rows)."""
    shown, with_o = cols["shown"], cols["shown"] > 0
    extra = [",".join(map(str, s.pages or ()))] if cols["pages"] else []
    if cols["fp8"]:
        extra.append(_p_top(s, d))
    q = [] if query is None else [query]
    if s.masked:
        return [str(s.block), f"{s.start}:{s.stop}", *q, Text("skipped", style="dim"),
                num(s.m, d), "", num(s.l, d), *([""] if with_o else []), "", *extra]
    m = arrow(s.m_prev, s.m, d) if arrows else num(s.m, d)
    l_ = arrow(s.l_prev, s.l, d) if arrows else num(s.l, d)
    o = [values(s.o, max(3, d - 3), shown)] if with_o else []
    if s.sink:  # not a tile: the sink joins l as a key of value 0
        return ["sink", "", *q, Text.assemble("σ ", num(s.block_max, d)), m, num(s.alpha, d),
                l_, *o, num(s.o_norm, d), *extra]
    alpha = num(s.alpha, d)
    if s.rescaled:
        alpha.stylize("bold yellow")
    if s.lazy_skipped:  # lazy rescale: the tile max passed m, m was kept
        alpha.append(" skip", style="magenta")
    tile = str(s.block) if s.kind is None else f"{s.block} {s.kind[0]}"  # full / partial
    return [tile, f"{s.start}:{s.stop}", *q, num(s.block_max, d), m, alpha, l_, *o,
            num(s.o_norm, d), *extra]


def trace_notes(res, steps, cols: dict, arrows: bool) -> str:
    """The lines under a trace's title: what a narrow width left out of O, a single tile
    holding every key, m and l shown after each tile only, the block mask's letters."""
    title = ""
    shown, held = cols["shown"], cols["held"]
    if shown < held:
        title += (f"\n(O[{shown}:{held}] left out at this width: --json or --csv has it, "
                  "--explain its arithmetic)")
    tiles = [s for s in steps if not s.sink]
    keys = tiles[0].stop - tiles[0].start if len(tiles) == 1 else 0
    if keys > 1:  # the whole row in one tile: nothing online to see
        title += (f"\n(one K/V tile holds all {keys} keys, so no online step shows: "
                  f"--block-k {max(1, keys // 4)} makes tiles of {max(1, keys // 4)} keys)")
    if not arrows:
        title += "\nm and l after each tile (the row above holds their values before it)"
    if any(st.kind is not None for st in steps):
        title += "\nblock mask: f a full tile (no mask applied), p a partial one (masked)"
    return title


def _p_top(s, d: int) -> Text:
    """'256' or, where some saturate, '16384 (128)' in red; '' for a tile not computed."""
    if s.p_max is None:
        return Text("")
    if not s.saturated:
        return num(s.p_max, d)
    return Text.assemble(num(s.p_max, d), (f" ({s.saturated})", "bold red"))


def attention_output(res, ref_row, show_all: bool = False) -> Group:
    """The traced row's output O / l beside the reference (empty without a traced row)."""
    parts: list = []
    if res.trace.out is not None:
        o = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("j", "output", "reference", "|diff|"):
            o.add_column(name, justify="right")
        n = len(res.trace.out)

        def orow(j):
            r = None if ref_row is None else ref_row[j]
            return [str(j), num(res.trace.out[j], 10), num(r, 10),
                    num(None if r is None else abs(res.trace.out[j] - r), 3)]

        parts += [Text("output row O / l"), fill(o, n, orow, show_all)]
    return Group(*parts)


def attention_results(rep, show_all: bool = False, width: int = 100) -> Group:
    """What follows osm attention's trace (report.AttentionReport): the traced row's output
    beside the reference, then the splits of --splits."""
    split = [] if rep.split is None else [split_table(rep.split)]
    if len(rep.result.trace.queries) > 1:
        from .rows import rows_output

        return Group(rows_output(rep.result, rep.ref_rows, show_all, width), *split)
    return Group(attention_output(rep.result, rep.ref_row, show_all), *split)


def attention_step_frame(headers: Sequence, res, upto: int, width: int = 100) -> Group:
    """attention --step: the headers, the traced row's tiles up to `upto` (that row
    highlighted), the tile's arithmetic and a hint."""
    from .explain import attention_step

    def upto_step(shown):
        n = len(shown)
        return replace(res, trace=replace(res.trace, rows=tuple(tr[:n] for tr in res.trace.rows)))

    return frame(headers, res.trace.steps, upto, "tile",
                  lambda shown: attention_trace(upto_step(shown), width),
                  attention_step(res, upto), lines=max(1, len(res.trace.rows)))


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
