"""Step records as CSV text: the same rows the step table shows, at full precision.

Floats are written with repr (the shortest text that reads back to the same float64); infinities
as inf / -inf, which Python, numpy and pandas read back. Leaves out: writing the file (io.py).

Example: steps_csv([trace]) -> "form,block,start,stop,block_max,m_prev,m,alpha,l_prev,l,...\\n"
"""

from __future__ import annotations

import csv
import io as _io

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


def steps_csv(traces) -> str:
    """One line per step of each trace (a form column tells --form both's two tables apart)."""
    buf = _io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for t in traces:
        for i, s in enumerate(t.steps):
            w.writerow([_cell(x) for x in (
                t.form, i, s.block, s.start, s.stop, s.block_max, s.m_prev, s.m, s.scale,
                s.l_prev, s.l, bool(s.rescaled), s.skipped, s.block_m, s.block_l, s.block_weight,
            )])
    return buf.getvalue()


__all__ = ["COLUMNS", "steps_csv"]
