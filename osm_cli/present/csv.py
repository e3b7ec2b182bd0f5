"""Step records as CSV text: the same rows the step tables show, at full precision.

Floats are written with repr (the shortest text that reads back to the same float64); infinities
as inf / -inf, which Python, numpy and pandas read back. A long trace's steps (over bulk.LONG
scores) are written from their columns by bulk.py, their floats spelled as orjson spells them
(the same digits; 1e-7 for repr's 1e-07). Leaves out: writing the file (io/save.py).

Example: steps_csv([trace]) -> "form,block,start,stop,block_max,m_prev,m,alpha,l_prev,l,...\\n"
         tiles_csv(attention_result) -> "batch,head,query,step,tile,start,stop,skipped,...\\n"
         sweep_csv(sweep_result) -> "block,tiles,skipped,rescales,max_error,lse_error,...\\n"
         grad_trace_csv(backward_result) -> "trace,batch,head,row,tile,start,stop,...\\n"
"""

from __future__ import annotations

import csv
import io as _io

import numpy as np

from . import bulk

COLUMNS = (
    "form", "step", "block", "start", "stop", "block_max", "m_prev", "m", "alpha", "l_prev", "l",
    "rescaled", "skipped", "block_m", "block_l", "block_weight",
)


def _cell(x) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return repr(x)
    return str(x)


def _csv(header, rows) -> str:
    """CSV text: the header, then each row of values written by _cell, lines ending in \\n."""
    return "".join(_csv_chunks(header, rows))


def _csv_chunks(header, rows, batch: int = 4096):
    """The same CSV text as _csv, yielded `batch` rows at a time (a long trace's file is written
    as it is computed, never held whole)."""
    buf = _io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for n, row in enumerate(rows, 1):
        w.writerow([_cell(x) for x in row])
        if n % batch == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def steps_csv(traces) -> str:
    """One line per step of each trace (a form column tells --form both's two tables apart)."""
    return "".join(steps_csv_chunks([(t.form, t.steps) for t in traces]))


def steps_csv_chunks(forms_steps):
    """steps_csv's text in pieces, from (form, steps) pairs whose steps may be a generator
    (reports.trace.TraceReport.iter_steps: a long trace's steps made again, never all held)."""
    return _csv_chunks(COLUMNS, (
        (form, i, s.block, s.start, s.stop, s.block_max, s.m_prev, s.m, s.alpha, s.l_prev, s.l,
         bool(s.rescaled), s.lazy_skipped, s.block_m, s.block_l, s.block_weight)
        for form, steps in forms_steps for i, s in enumerate(steps)
    ))


def trace_csv_chunks(rep):
    """osm trace --csv (reports.trace.TraceReport): steps_csv's text of every trace, in pieces,
    made as they are written; for a long trace from its step columns, as bytes."""
    if rep.rows.size <= bulk.LONG:
        return steps_csv_chunks([(t.form, rep.iter_steps(i)) for i, t in enumerate(rep.traces)])
    return _long_csv(rep)


def _long_csv(rep):
    yield (",".join(COLUMNS) + "\n").encode()
    for i, t in enumerate(rep.traces):
        done = 0
        for cols in rep.iter_columns(i):
            for a in range(0, len(cols), SUB):
                part = cols.take(slice(a, a + SUB))
                yield csv_rows(t.form, part, done)
                done += len(part)


SUB = 1 << 14  # steps laid out at once (bulk.rows)
CSV_NONFINITE = {"inf": b"inf", "-inf": b"-inf", "nan": b"nan"}


def csv_rows(form: str, cols, first: int) -> memoryview:
    """steps_csv's lines for the steps of cols (core.record.StepColumns), numbered from first."""
    def num(x, repeats=False):
        return bulk.numbers(x, CSV_NONFINITE, repeats=repeats)

    merge = (b",", b",", b",") if cols.block_l is None else (
        b",", num(cols.block_m), b",", num(cols.block_l), b",", num(cols.block_weight))
    cells = [num(np.arange(first, first + len(cols))), num(cols.block), num(cols.start),
             num(cols.stop), num(cols.block_max), num(cols.m_prev, True), num(cols.m, True),
             num(cols.alpha, True), num(cols.l_prev), num(cols.l), num(cols.rescaled),
             num(cols.lazy_skipped)]
    pieces: list = [f"{form},".encode()]
    for n, c in enumerate(cells):
        pieces += [b","] * bool(n) + [c]
    return bulk.rows([*pieces, *merge, b"\n"], len(cols))


TILE_COLUMNS = (
    "batch", "head", "query", "step", "tile", "start", "stop", "skipped", "tile_max", "m_prev",
    "m", "alpha", "l_prev", "l", "rescaled", "o_norm",
)


def tiles_csv(res) -> str:
    """One line per K/V tile of attention's traced row (core.record.Step records), in the
    order the tiles were visited; for several traced rows (--query 0:4) one line per row of
    each tile, the rows of a step together, as the table shows them. o_0, o_1, … are the first
    components of the unnormalised O after the tile; rescaled: the row's finite running max
    moved, so its state was scaled by α. A skipped tile (the mask hides it) has tile_max -inf
    and leaves the state as it was.
    """
    traces = res.trace.rows or (res.trace.steps,)
    queries = res.trace.queries or (res.trace.at[2],)
    shown = max((len(s.o) for tr in traces for s in tr), default=0)
    b, h, _ = res.trace.at
    return _csv([*TILE_COLUMNS, *(f"o_{j}" for j in range(shown))], (
        (b, h, i, n, s.block, s.start, s.stop, s.masked, s.block_max, s.m_prev, s.m, s.alpha,
         s.l_prev, s.l, s.rescaled, s.o_norm, *(float(x) for x in s.o))
        for n in range(min(map(len, traces)))
        for i, s in ((i, tr[n]) for i, tr in zip(queries, traces, strict=True))
    ))


GRAD_COLUMNS = (
    "trace", "batch", "head", "row", "tile", "start", "stop", "masked", "p_max", "ds_sum",
    "dk_norm", "dv_norm", "dq_norm",
)


def grad_trace_csv(res) -> str:
    """osm backward --csv: one line per tile of both traces (core.record.GradStep records).
    trace "key": key row `row` of kv head `head`, its tiles the Q tiles (start:stop are query
    rows); trace "query": query row `row` of head `head`, its tiles the K/V tiles (keys), each
    traced query row's in turn (--query 0:4)."""
    b, h, i = res.trace.at
    queries = res.trace.queries or (i,)
    rows = res.trace.rows or (res.trace.steps,)
    traces = ((("key", b, res.trace.kv_head, res.trace.key), res.trace.key_steps),
              *((("query", b, h, qi), tr) for qi, tr in zip(queries, rows, strict=True)))
    return _csv(GRAD_COLUMNS, (
        (*who, s.block, s.start, s.stop, s.masked, s.p_max, s.ds_sum, s.dk_norm, s.dv_norm,
         s.dq_norm)
        for who, steps in traces for s in steps))


SWEEP_COLUMNS = (
    "block", "tiles", "skipped", "rescales", "max_error", "lse_error", "tile_bytes", "fits",
    "hbm_tiled", "hbm_skipping", "hbm_standard", "row_visits",
)


def sweep_csv(result) -> str:
    """One line per block size of a sweep (sweep.Sweep): what was measured beside the model.

    max_error is of the probabilities (scores) or of O (Q/K/V); hbm_* are modelled bytes;
    hbm_skipping and row_visits are empty where nothing is skipped.
    """
    def row(r):
        m = r.measure
        return (r.block, m.tiles, m.skipped, m.rescales, float(m.max_error), float(m.lse_error),
                r.tile_bytes, bool(r.fits), r.hbm_flash, r.hbm_skipping, result.hbm_standard,
                m.row_visits)

    return _csv(SWEEP_COLUMNS, map(row, result.rows))


__all__ = [
    "COLUMNS", "GRAD_COLUMNS", "SWEEP_COLUMNS", "TILE_COLUMNS", "csv_rows", "grad_trace_csv",
    "steps_csv", "steps_csv_chunks", "sweep_csv", "tiles_csv", "trace_csv_chunks",
]
