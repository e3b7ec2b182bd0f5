"""osm trace's tables: the step table (one row per block), the elements beside the references,
every row of a matrix, the lazy and order checks, and the --dtype view.

Leaves out: computing anything (reports/trace.py), attention's tables (attention.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from rich import box
from rich.console import Group
from rich.text import Text

from .format import VALUES_UP_TO, Table, agreement, arrow, elided, fill, fit, num, values
from .stepmode import frame
from .verdicts import rounding_text

# step_table's variants, tried in order until one fits: (digits, the values column, m and l
# as "before → after"); the narrowest show m and l after each block (the row above holds before)
STEP_VARIANTS = (
    (8, True, True), (7, True, True), (6, True, True), (8, False, True), (7, False, True),
    (6, False, True), (5, False, True), (7, False, False), (6, False, False), (5, False, False),
    (4, False, False),
)


def step_table(trace, show_all: bool = False, width: int = 100) -> Group:
    """One row per block: what entered, and the state (m, α, l) before → after.

    Numbers get 8 significant digits; to fit `width`, fewer (down to 6), then without the
    block's values, then fewer still and m and l shown after each block only.
    """
    return fit(lambda v: _step_table(trace, show_all, *v), width, STEP_VARIANTS)


def form_line(form: str) -> str:
    """What a form's step does, in symbols (above its step table, on the HTML page)."""
    if form == "merge":
        return ("form merge: each block's own m⁽ᵏ⁾ and l⁽ᵏ⁾ = Σ exp(s − m⁽ᵏ⁾), then\n"
                "m = max(m, m⁽ᵏ⁾), α = exp(m_old − m), w = exp(m⁽ᵏ⁾ − m), l = l·α + l⁽ᵏ⁾·w")
    return "form rescale: m = max(m, block max), α = exp(m_old − m), l = l·α + Σ exp(s − m)"


def _step_table(trace, show_all: bool, d: int, with_values: bool = True,
                arrows: bool = True) -> Group:
    merge = trace.form == "merge"
    # merge is the wider table
    show_values = with_values and trace.block <= VALUES_UP_TO and not merge
    title = form_line(trace.form)
    if not with_values and trace.block <= VALUES_UP_TO and not merge:
        title += ("\n(the values column is left out at this width: --explain lists each "
                  "block's scores)")
    if not arrows:
        title += "\nm and l after each block (the row above holds their values before it)"
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    num_col = {"justify": "right", "no_wrap": True}
    t.add_column("#", **num_col)
    t.add_column("keys", **num_col)
    if show_values:  # first few scores of the block, as many as fit in 18 columns
        t.add_column("values", no_wrap=True)
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
    steps, n = trace.steps, trace.step_count
    half = len(steps) // 2  # a long trace keeps its first and last steps only

    def row(i):
        s = steps[i] if i < half else steps[len(steps) - (n - i)]
        cells = [str(s.block), f"{s.start}:{s.stop}"]
        cells += [values(s.values, width=18)] if show_values else []
        if merge:
            cells += [num(s.block_m, d), num(s.block_l, d)]
        else:
            cells += [num(s.block_max, d)]
        alpha = num(s.alpha, d)
        if s.rescaled:
            alpha.stylize("bold yellow")
        if s.lazy_skipped:  # lazy rescale: the block max passed m, m was kept
            alpha.append(" skip", style="magenta")
        cells += [arrow(s.m_prev, s.m, d) if arrows else num(s.m, d), alpha]
        if merge:
            cells += [num(s.block_weight, d)]
        cells += [arrow(s.l_prev, s.l, d) if arrows else num(s.l, d)]
        return cells

    # every step at hand (not a long trace's ends only): never hide one where m moved
    moved = [i for i, s in enumerate(steps) if s.m != s.m_prev] if len(steps) == n else None
    return Group(Text(title), fill(t, n, row, show_all, moved, "blocks"))


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


def element_table(scores, online, stable, naive, show_all: bool = False, width: int = 100, *,
                  index: Sequence[int] | None = None, n: int | None = None) -> Group:
    """Per-element probabilities: online, one-shot stabilized, naive, and their difference.

    Probabilities get 12 significant digits, or fewer (down to 6) as it takes to fit `width`,
    the scores 10 (down to 6), and the narrowest leaves out the naive column (a note says so).
    For a long row the arrays may hold only the elements shown: `index` gives their places in
    the row and n its length.
    """
    return fit(lambda v: _element_table(scores, online, stable, naive, show_all, index, n, *v),
               width, ELEMENT_VARIANTS, part=0)


# element_table's variants, tried in order: (digits of p, digits of the score, naive p shown)
ELEMENT_VARIANTS = ((12, 10, True), (10, 10, True), (8, 10, True), (8, 8, True), (6, 8, True),
                    (6, 6, True), (8, 8, False), (6, 6, False), (5, 5, False))


def _element_table(scores, online, stable, naive, show_all: bool, index, n, d: int,
                   ds: int = 10, with_naive: bool = True) -> Group:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("i", "score", "online p", "stabilized p", "naive p", "|online−stab|", "ulps"):
        if name != "naive p" or with_naive:
            t.add_column(name, justify="right", no_wrap=True)
    diff = np.abs(online - stable)
    with np.errstate(divide="ignore", invalid="ignore"):
        ulps = np.where(diff == 0, 0.0, diff / np.spacing(np.abs(stable)))
    at = {int(i): k for k, i in enumerate(range(len(scores)) if index is None else index)}

    def row(i):
        k = at[i]
        return [
            str(i), num(scores[k], ds), num(online[k], d), num(stable[k], d),
            *([num(naive[k], 6)] if with_naive else []), num(diff[k], 3), num(ulps[k], 3),
        ]

    table = fill(t, len(scores) if n is None else n, row, show_all)
    ulps_note = Text(ULPS, style="dim")
    if with_naive:
        return Group(table, ulps_note)
    return Group(table, ulps_note,
                 Text("(naive p left out at this width: --json has it)", style="dim"))


# the ulps column, said under the table that first prints it
ULPS = "ulps: |online−stab| in units in the last place of stabilized p (float64's)"


def masked_row_note() -> Text:
    """A traced row with every score -inf: the one explanation overflow-demo gives too, and
    which of the table's columns is which form."""
    from osm_cli.studies.overflow import MASKED_ROW

    return Text(MASKED_ROW + " Here online p and stabilized p are osm's guarded forms (0 for "
                "every entry); naive p is 0 / 0 = nan.")


def rows_table(m, l, lse, max_diff, show_all: bool = False) -> Table:
    """The summary of every row of a score matrix."""
    t = Table(title="all rows", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for name in ("row", "m", "l", "LSE", "max |online−stab|"):
        t.add_column(name, justify="right")
    return fill(
        t, len(m),
        lambda i: [str(i), num(m[i], 10), num(l[i], 10), num(lse[i], 10), num(max_diff[i], 3)],
        show_all,
    )


def trace_heads(rep, name: str) -> list:
    """What comes before osm trace's step tables (report.TraceReport): the header, and what a
    lazy threshold and a softcap do."""
    n_rows, n = np.atleast_2d(rep.scores).shape
    heads = [trace_header(name, n_rows, n, rep.row, rep.block)]
    if rep.softcap is not None:
        c = f"{rep.softcap:g}"
        heads.append(Text(f"softcap {c}: every score s became {c}·tanh(s/{c}) first; the "
                          "tables show the capped scores"))
    return heads + ([lazy_note(rep.threshold)] if rep.threshold else [])


def sink_line(st, sink: float) -> Text:
    """The sink joining the denominator after the last block: a score σ whose V row is 0."""
    return Text.assemble(
        "sink σ = ", num(sink, 8), ": one more score, whose V row is 0 (it adds to l, not to "
        "O), merged after the last block:\n",
        "m = ", arrow(st.m_prev, st.m), ", α = ", num(st.alpha), ", l = l·α + exp(σ − m) = ",
        arrow(st.l_prev, st.l), "\n(l now exceeds the scores' own Σ exp(s − m); the "
        "probabilities sum to ", num(st.l_prev * st.alpha / st.l, 8), ")")


def trace_results(rep, show_all: bool = False, width: int = 100) -> Group:
    """What follows osm trace's step tables: the final state, the traced row's elements beside
    the references, every row, and the lazy and order checks asked for."""
    t, row = rep.trace, rep.row
    m, l, lse = (np.atleast_1d(a) for a in (t.m, t.l, t.lse))
    parts: list = [] if rep.sink is None else [sink_line(rep.sink_steps[0], rep.sink)]
    parts.append(final_line(m[row], l[row], lse[row]))
    if rep.in_dtype:
        lt = rep.in_dtype[0]
        return Group(*parts, dtype_elements(rep.scores, lt, row, show_all, width),
                     dtype_trace_note(lt, row))
    if rep.forms_diff is not None:
        parts.append(agreement("rescale vs merge", rep.forms_diff))
    n_rows, n = rep.rows.shape
    shown = [i for i in elided(n, show_all) if i is not None]
    e = rep.elements(shown)
    parts += [element_table(e["scores"], e["probabilities"], e["reference"], e["naive"],
                            show_all, width, index=shown, n=n),
              agreement("online vs one-shot stabilized", float(rep.max_diff[row]))]
    if n and np.isneginf(np.asarray(rep.rows[row], dtype=np.float64)).all():
        parts.append(masked_row_note())
    if n_rows > 1:
        parts.append(rows_table(m, l, lse, rep.max_diff, show_all))
    if rep.lazy is not None:
        lz = rep.lazy
        parts += [lazy_summary(lz.rescales, lz.rescales_eager, lz.skipped, lz.max_excess,
                               lz.threshold),
                  agreement("lazy vs eager", lz.max_abs_diff)]
    if rep.check is not None:
        parts.append(order_table(rep.check, rep.seed))
    return Group(*parts)


def step_frame(headers: Sequence, trace, upto: int, width: int = 100) -> Group:
    """Step mode: the header, the step table up to block `upto` (that row highlighted), the
    block's arithmetic and a hint."""
    from .explain import trace_step

    return frame(headers, trace.steps, upto, "block",
                  lambda shown: step_table(replace(trace, steps=shown, n_steps=None), False, width),
                  trace_step(trace, upto))


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
    if lt.overflow_note:
        parts += ["\n", Text(lt.overflow_note, style="bold red")]
    return Text.assemble(*parts)


# dtype_elements' variants, tried in order: (digits of the score and float64 p, of the values
# held in the dtype, naive p shown, the notes in a column (else in a line under the table))
DTYPE_VARIANTS = ((10, 8, True, True), (8, 8, True, True), (8, 6, True, True), (6, 6, True, True),
                  (8, 6, False, True), (6, 6, False, True), (6, 6, False, False),
                  (5, 5, False, False), (4, 4, False, False))


def dtype_elements(scores, lt, row: int, show_all: bool = False, width: int = 100) -> Group:
    """Per element: the score as given and as the dtype holds it, p, the float64 p, naive p;
    fewer digits, then no naive column, then the notes under the table, to fit `width`."""
    return fit(lambda v: _dtype_elements(scores, lt, row, show_all, *v), width, DTYPE_VARIANTS,
               part=0)


def _dtype_elements(scores, lt, row: int, show_all: bool, dx: int, dh: int, with_naive: bool,
                    note_column: bool) -> Group:
    m = lt.model
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for c in ("i", "score", f"in {m.name}", "online p", "float64 p", "naive p", "|p − p64|",
              "ulps"):
        if c != "naive p" or with_naive:
            t.add_column(c, justify="right", no_wrap=True)
    if note_column:
        t.add_column("", justify="left")
    s, held = np.atleast_2d(scores)[row], np.atleast_2d(lt.scores)[row]
    p, exact = np.atleast_2d(lt.probabilities)[row], np.atleast_2d(lt.exact)[row]
    naive, ulps = np.atleast_2d(lt.naive)[row], np.atleast_2d(lt.ulps)[row]

    def note(i) -> Text | str:
        if np.isfinite(s[i]) and not np.isfinite(held[i]):
            return Text("overflow → " + ("inf" if np.isinf(held[i]) else "nan"), style="bold red")
        if s[i] != 0 and held[i] == 0:
            return Text("underflow → 0", style="yellow")
        if p[i] == 0 and exact[i] > 0:
            return Text("p underflows to 0", style="yellow")
        return ""

    def cells(i):
        return [str(i), num(s[i], dx), num(held[i], dh), num(p[i], dh), num(exact[i], dx),
                *([num(naive[i], 6)] if with_naive else []), num(abs(p[i] - exact[i]), 3),
                num(ulps[i], 3), *([note(i)] if note_column else [])]

    table = fill(t, len(s), cells, show_all)
    under: list = [] if with_naive else ["naive p left out at this width (--json has it)"]
    if not note_column:  # each note with the shown elements it is about
        notes: dict[str, list[str]] = {}
        for i in (i for i in elided(len(s), show_all) if i is not None):
            if (n := note(i)):
                notes.setdefault(n.plain, []).append(str(i))
        under += [f"{what}: i = {', '.join(where)}" for what, where in notes.items()]
    ulps_note = Text(f"ulps: |p − p64| in units in the last place of p in {m.name}", style="dim")
    return Group(table, ulps_note, *([Text("; ".join(under), style="dim")] if under else []))
