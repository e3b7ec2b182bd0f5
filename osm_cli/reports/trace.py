"""What `osm trace` reports, computed in one place: online softmax over a score vector or
matrix in one or both update forms, in a block order or with a lazy-rescale threshold (or
rounded to a dtype), beside the one-shot stabilized and naive softmax, with the per-row
differences, the lazy vs eager report and the forward / order / tree check.

Leaves out: the algorithms themselves (core/, studies/, precision/), files (io/), tables and
JSON (present/).

Example: trace_report(np.array([1., 2., 5., 3.]), 2).traces[0].steps[1].alpha == exp(2 - 5)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.fold import Trace, online_softmax
from osm_cli.core.reference import naive_softmax, stable_softmax
from osm_cli.core.state import FORMS
from osm_cli.studies.lazy import LazyReport, lazy_report
from osm_cli.studies.order import OrderCheck, block_order, order_check


@dataclass(frozen=True)
class TraceReport:
    """Everything `osm trace` shows: the traces, the references and the checks asked for."""

    scores: np.ndarray  # as given: a vector, or a matrix of rows
    block: int
    form: str  # as asked: rescale, merge or both
    row: int  # the traced row
    traces: tuple[Trace, ...]  # one per form, rescale first
    reference: np.ndarray  # one-shot stabilized softmax in float64 (of the unrounded scores)
    naive: np.ndarray  # exp(s) / Σ exp(s) as written (computed in the dtype under a dtype)
    max_diff: np.ndarray  # per row: max |p − reference|
    forms_diff: float | None = None  # both forms: max |p_merge − p_rescale| over every row
    order: str | None = None  # the block order asked for (None: forward, no order check)
    seed: int = 0
    threshold: float = 0.0  # lazy rescale τ, natural log (0: eager)
    lazy: LazyReport | None = None  # with a threshold: lazy vs eager
    eager: Trace | None = None  # with a threshold: the eager (τ = 0) trace
    check: OrderCheck | None = None  # with an order: forward vs that order vs a tree merge
    in_dtype: tuple = ()  # under a dtype: precision.lowtrace.LowTrace per form (traces are theirs)

    @property
    def trace(self) -> Trace:
        """The trace the report is about: the first form's."""
        return self.traces[0]


def _forms_diff(traces) -> float | None:
    if len(traces) < 2:
        return None
    return float(np.abs(traces[1].probabilities - traces[0].probabilities).max())


def trace_report(
    scores: np.ndarray, block: int = 2, form: str = "rescale", *, row: int = 0,
    order: str | None = None, seed: int = 0, threshold: float = 0.0, dtype: str | None = None,
    precision: str | None = None,
) -> TraceReport:
    """Run online softmax over `scores` in `form` (rescale, merge or both) and check it.

    order (forward, reverse, shuffle with `seed`) folds the blocks in that order and adds the
    order check; threshold τ > 0 runs the lazy rescale and adds the lazy vs eager report; dtype
    (a name) runs it on the scores rounded to that dtype instead, the state held as `precision`
    (flash, the default, or naive) holds it.
    """
    forms = FORMS if form == "both" else (form,)
    if dtype is not None:
        # precision/ imports ml_dtypes (about 0.8 s): only a trace in a dtype pays for it
        from osm_cli.precision.lowtrace import trace_in
        from osm_cli.precision.model import model

        lab = model(dtype, precision)
        low = tuple(trace_in(scores, lab, block, f, row) for f in forms)
        traces = tuple(x.trace for x in low)
        return TraceReport(scores, block, form, row, traces, low[0].exact, low[0].naive,
                           low[0].max_diff, _forms_diff(traces), seed=seed, in_dtype=low)
    n = np.atleast_2d(scores).shape[1]
    idx = None if order is None else block_order(-(-n // block), order, seed)
    traces = tuple(online_softmax(scores, block, f, row=row, order=idx, threshold=threshold)
                   for f in forms)
    lazy = eager = check = None
    if threshold:
        lazy, eager = lazy_report(scores, block, threshold, row=row, order=idx, lazy=traces[0])
    if order is not None:
        check = order_check(scores, block, traces[0].form, order, seed, threshold,
                            chosen=traces[0])
    stable = stable_softmax(scores)
    diff = np.abs(np.atleast_2d(traces[0].probabilities) - np.atleast_2d(stable)).max(axis=-1)
    return TraceReport(scores, block, form, row, traces, stable, naive_softmax(scores), diff,
                       _forms_diff(traces), order, seed, threshold, lazy, eager, check)


__all__ = ["TraceReport", "trace_report"]
