"""Several traced query rows side by side (`--query 0:4`, `--query 0,2,5`): under each K/V tile
one line per traced row, so a tile's lines are the m, l and O vectors a kernel holds for its Q
tile; the rows' outputs (and backward's dQ_i rows) a line a row, beside the reference.

The rows' steps are the records' own (Attention.trace.rows, Backward.trace.rows: one tuple of
steps per row, step k of every row the same K/V tile). Long traces elide whole tiles, never a
tile where any row's m moved.
Leaves out: the one-row tables (attention.py, backward.py), the arithmetic (explain.py).
"""

from __future__ import annotations

import numpy as np
from rich import box
from rich.console import Group
from rich.text import Text

from .format import Table, elided, fill, fit, num, values


def queries_text(queries) -> str:
    """'queries 0:4' for consecutive rows, 'queries 0, 2, 5' otherwise."""
    qs = list(queries)
    if len(qs) > 2 and qs == list(range(qs[0], qs[-1] + 1)):
        return f"queries {qs[0]}:{qs[-1] + 1}"
    return "queries " + ", ".join(map(str, qs))


def tile_groups(table: Table, traces, show_all: bool, line, unit: str = "tiles") -> Table:
    """Step k of every row as one group of lines (line(row, k, first) gives a line's cells),
    a rule under each group; the tiles elided as one trace's rows are (a ⋮ line for each run
    left out, never a tile where some row's m moved), with a caption saying how many."""
    n = min(len(tr) for tr in traces)
    moved = [k for k in range(n) if any(_moved(tr[k]) for tr in traces)]
    shown = elided(n, show_all, moved)
    for k in shown:
        if k is None:
            table.add_row(*(["⋮"] * len(table.columns)), style="dim", end_section=True)
            continue
        for r in range(len(traces)):
            table.add_row(*line(r, k, r == 0), end_section=r == len(traces) - 1)
    hidden = n - sum(k is not None for k in shown)
    if hidden:
        table.caption = (f"⋮ {hidden} {unit} not shown, where no row's m moved (--all shows "
                         "every tile)")
        table.caption_justify = "left"
        table.caption_style = "dim"
    return table


def _moved(step) -> bool:
    m, before = getattr(step, "m", None), getattr(step, "m_prev", None)
    return m is not None and m != before


def rows_trace(res, show_all: bool, d: int, o_shown: int, arrows: bool) -> Group:
    """attention's trace of several rows (res.trace.rows), as attention.trace_table's rows."""
    from .attention import step_cells, trace_notes, trace_table

    b, h, _ = res.trace.at
    steps = [s for tr in res.trace.rows for s in tr]
    t, cols = trace_table(res, steps, o_shown, query=True)

    def line(r, k, first):
        cells = step_cells(res.trace.rows[r][k], d, arrows, cols, str(res.trace.queries[r]))
        if not first and cells[0] != "sink":  # the tile and its keys once, on its first line
            cells[0] = cells[1] = ""
        elif not first:
            cells[0] = ""
        return cells

    tile_groups(t, res.trace.rows, show_all, line)
    what = "sequence" if res.options.batch else "batch"
    title = (f"trace of {what} {b}, head {h}, {queries_text(res.trace.queries)}: start m = -inf, "
             "l = 0, O = 0\n(a line per row under each tile: the m, l and O vectors a kernel "
             "holds)")
    notes = trace_notes(res, res.trace.steps, cols, arrows).replace(
        "(the row above holds their values before it)", "(the tile above: before it)")
    return Group(Text(title + notes), t)


# row_lines' variants: (digits, components) tried until the table fits
LINE_VARIANTS = ((8, 4), (7, 4), (6, 4), (7, 3), (6, 3), (5, 3), (5, 2), (4, 2), (4, 1))


def row_lines(title: str, name: str, queries, rows, refs, show_all: bool = False,
              width: int = 100) -> Group:
    """Several traced rows of one output (rows: (queries, n)), a line a row: its query, its
    leading components (as many as `width` allows, "…" for the rest) and, given refs, its
    largest difference from the float64 reference; long lists elided as the traces are."""
    rows = np.asarray(rows, dtype=np.float64)
    diffs = None if refs is None else np.abs(rows - np.asarray(refs, np.float64)).max(
        axis=-1, initial=0.0)
    n = rows.shape[-1]

    def make(v):
        digits, most = v
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        t.add_column("query", justify="right")
        t.add_column(f"{name}[:{most}] of {n}" if n > most else name, no_wrap=True)
        if diffs is not None:
            t.add_column(f"max |{name} − ref|", justify="right", no_wrap=True)

        def line(r):
            cells = [str(queries[r]), values(rows[r], digits, most)]
            return cells + ([] if diffs is None else [num(diffs[r], 3)])

        fill(t, len(rows), line, show_all, unit="rows")
        more = " (--json has every component)" if n > most else ""
        return Group(Text(title + more), t)

    return fit(make, width, LINE_VARIANTS)


def rows_output(res, ref_rows, show_all: bool = False, width: int = 100) -> Group:
    """The traced rows' outputs O / l, a line a row, each against the float64 reference
    (ref_rows: (rows, dv), or None)."""
    if res.trace.outs is None:
        return Group()
    return row_lines("output rows O / l", "O", res.trace.queries, res.trace.outs, ref_rows,
                     show_all, width)


__all__ = ["queries_text", "row_lines", "rows_output", "rows_trace", "tile_groups"]
