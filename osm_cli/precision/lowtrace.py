"""A score vector traced in a dtype (osm trace --dtype): online softmax of the rounded scores,
the state held where the precision model holds it, beside a float64 run.

Leaves out: attention (model.py), printing (present/).

Example: trace_in(np.array([2., 4., 1., 3.]), model("bf16", "naive")).trace.steps[0].l
-> 1.1328125 (e^-2 + 1 in bfloat16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.fold import Trace, online_softmax
from osm_cli.core.reference import naive_softmax, stable_softmax
from osm_cli.errors import OsmError

from .dtypes import Rounding, finfo, has_inf, round_to, rounding, ulp
from .model import Model


@dataclass(frozen=True)
class LowTrace:
    """online softmax of dtype-rounded scores, beside a float64 run on the unrounded scores.

    precision flash holds m, α, l in float32 (as kernels do) and rounds the final p to the dtype;
    naive holds every value (m, α, l, p) in the dtype itself. All arrays are float64 holding the
    dtype's values; rows are the rows of the input (a vector is one row).
    """

    model: Model
    scores: np.ndarray  # as the dtype holds them; -inf (a mask) stays -inf
    rounding: Rounding
    trace: Trace
    probabilities: np.ndarray  # p as the dtype holds it
    naive: np.ndarray  # naive softmax computed in the dtype
    exact: np.ndarray  # float64 stabilized softmax of the unrounded scores
    max_diff: np.ndarray  # per row max |p − exact|
    ulps: np.ndarray  # per element |p − exact| in ulps of the dtype at exact
    p_underflowed: int  # p = 0 in the dtype where the float64 p > 0
    alpha_underflowed: tuple[int, ...] = ()  # blocks whose α rounded to 0 from a finite m
    overflow_note: str = ""  # why p is nan, when some scores do not fit the dtype


def _overflow_note(note: Rounding, m: Model) -> str:
    """Why the trace shows nan when `note.overflowed` scores do not fit m's dtype."""
    if not note.overflowed:
        return ""
    big = float(finfo(m.dtype).max)
    if has_inf(m.dtype):
        held, why = "inf", "m becomes inf, and exp(s − m) is exp(inf − inf) = nan or 0"
    else:
        held, why = f"nan ({m.name} has no inf)", "m becomes nan, and so does every exp(s − m)"
    return (f"{note.overflowed} score(s) do not fit {m.name} (largest finite {big:.4g}) and are "
            f"held as {held}: {why}, so the probabilities are nan. A kernel given these scores "
            f"in {m.name} fails the same way; scale the scores, or pick a wider `dtype`.")


def trace_in(scores, m: Model, block: int = 2, form: str = "rescale", row: int = 0) -> LowTrace:
    """Round the scores to m's dtype and run online softmax the way m's precision holds values.

    Example: trace_in(np.array([2., 4., 1., 3.]), model("bf16", "naive")).trace.steps[0].l
    -> 1.1328125 (e^-2 + 1 in bfloat16)
    """
    s64 = np.asarray(scores, dtype=np.float64)
    held = np.where(np.isneginf(s64), -np.inf, round_to(s64, m.dtype, np.float64))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if m.precision == "naive":
            if not has_inf(m.dtype):
                raise OsmError(f"{m.name} has no -inf, so a running max cannot start at "
                               "m = -inf in it; use `precision` flash (m, l in float32)")
            tr = online_softmax(held.astype(m.dtype), block, form, row=row)
            p = np.asarray(tr.probabilities).astype(m.dtype).astype(np.float64)
        else:
            tr = online_softmax(held.astype(m.accum), block, form, row=row)
            p = round_to(tr.probabilities, m.dtype, np.float64)
        naive = naive_softmax(held.astype(m.dtype)).astype(np.float64)
    # The dtype's values as float64, so that records print and serialise like any other.
    tr = replace(tr, m=np.asarray(tr.m, dtype=np.float64), l=np.asarray(tr.l, dtype=np.float64),
                 lse=np.asarray(tr.lse, dtype=np.float64), probabilities=p)
    exact = stable_softmax(s64)
    diff = np.abs(p - exact)
    with np.errstate(invalid="ignore"):
        ulps = diff / ulp(exact, m.dtype)
    max_diff = np.atleast_2d(diff).max(axis=-1)
    gone = tuple(st.block for st in tr.steps
                 if st.alpha == 0 and math.isfinite(st.m_prev) and math.isfinite(st.m))
    note = rounding("scores", s64, held)
    return LowTrace(m, held, note, tr, p, naive, exact, max_diff, ulps,
                    int(np.count_nonzero((p == 0) & (exact > 0))), gone, _overflow_note(note, m))
