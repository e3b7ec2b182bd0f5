"""What `osm trace` reports, computed in one place: online softmax over a score vector or
matrix in one or both update forms, in a block order or with a lazy-rescale threshold (or
rounded to a dtype), beside the one-shot stabilized and naive softmax, with the per-row
differences, the lazy vs eager report and the forward / order / tree check.

A long trace is never held whole: the report keeps the traced row's first and last steps
(keep) and, per row, what the one-shot references subtract and divide by (RowStats); the
probabilities and references are computed a piece at a time (`piece`, `elements`) and the
steps made again when all are needed (`iter_steps`, or `iter_columns` a chunk of columns at a
time, through core/fastfold.py for a plain trace), so memory stays that of the state and one
piece. The lazy, order and --dtype checks compare whole runs and hold them in memory.

Leaves out: the algorithms themselves (core/, studies/, precision/), files (io/), tables and
JSON (present/).

Example: trace_report(np.array([1., 2., 5., 3.]), 2).traces[0].steps[1].alpha == exp(2 - 5)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.fold import Folding, Trace, online_softmax
from osm_cli.core.record import Step, StepColumns
from osm_cli.core.reference import naive_from, naive_total, softmax_stats, stable_from
from osm_cli.core.state import FORMS, State, finalize, probabilities, with_sink
from osm_cli.errors import OsmError
from osm_cli.studies.lazy import LazyReport, lazy_report
from osm_cli.studies.order import OrderCheck, block_order, order_check

CHUNK = 1 << 20  # scores handled at once when the rows are read a piece at a time


def row_pieces(rows: int, n: int) -> Iterator[tuple[int, int, int, int]]:
    """(r0, r1, a, b) pieces covering a (rows, n) array in row-major order: whole rows, about
    CHUNK scores at a time; a row longer than CHUNK in pieces of CHUNK."""
    if n <= CHUNK:
        per = max(1, CHUNK // max(n, 1))
        for r0 in range(0, rows, per):
            yield r0, min(rows, r0 + per), 0, n
        return
    for r in range(rows):
        for a in range(0, n, CHUNK):
            yield r, r + 1, a, min(n, a + CHUNK)


@dataclass(frozen=True)
class RowStats:
    """Per row, (rows, 1): what the one-shot references subtract and divide by."""

    m: np.ndarray  # the row max (0 on a row of only -inf): stable softmax subtracts it
    total: np.ndarray  # Σ exp(s − m): stable softmax divides by it
    naive: np.ndarray  # Σ exp(s): naive softmax divides by it (inf once it overflows)


def row_stats(s2: np.ndarray) -> RowStats:
    """RowStats of every row of s2, a piece at a time (core.reference.softmax_stats and
    naive_total; a row that fits one piece gets exactly their numbers)."""
    rows, n = s2.shape
    if n <= CHUNK:
        parts = [(softmax_stats(s2[r0:r1]), naive_total(s2[r0:r1]))
                 for r0, r1, _, _ in row_pieces(rows, n)]
        return RowStats(*(np.concatenate(x) for x in (
            [m for (m, _), _ in parts], [t for (_, t), _ in parts], [z for _, z in parts])))
    m = np.full((rows, 1), -np.inf)
    for r0, r1, a, b in row_pieces(rows, n):
        m[r0:r1] = np.maximum(m[r0:r1], s2[r0:r1, a:b].max(axis=-1, keepdims=True))
    m = np.where(np.isneginf(m), 0.0, m)
    total, naive = np.zeros((rows, 1)), np.zeros((rows, 1))
    with np.errstate(over="ignore"):
        for r0, r1, a, b in row_pieces(rows, n):
            piece = s2[r0:r1, a:b]
            total[r0:r1] += np.exp(piece - m[r0:r1]).sum(axis=-1, keepdims=True)
            naive[r0:r1] += naive_total(piece)
    return RowStats(m, total, naive)


@dataclass(frozen=True)
class TraceReport:
    """Everything `osm trace` shows: the traces, the references and the checks asked for."""

    scores: np.ndarray  # as given: a vector, or a matrix of rows
    block: int
    form: str  # as asked: rescale, merge or both
    row: int  # the traced row
    traces: tuple[Trace, ...]  # one per form, rescale first
    stats: RowStats | None  # what the one-shot references need, per row (None under a dtype)
    max_diff: np.ndarray  # per row: max |p − reference|
    forms_diff: float | None = None  # both forms: max |p_merge − p_rescale| over every row
    order: str | None = None  # the block order asked for (None: forward, no order check)
    seed: int = 0
    threshold: float = 0.0  # lazy rescale τ, natural log (0: eager)
    lazy: LazyReport | None = None  # with a threshold: lazy vs eager
    eager: Trace | None = None  # with a threshold: the eager (τ = 0) trace
    check: OrderCheck | None = None  # with an order: forward vs that order vs a tree merge
    in_dtype: tuple = ()  # under a dtype: precision.lowtrace.LowTrace per form (traces are theirs)
    softcap: float | None = None  # the scores were capped: s → C·tanh(s/C) (scores holds them)
    sink: float | None = None  # a sink logit joined every row's denominator after the last block
    sink_steps: tuple[Step, ...] = ()  # per trace: the traced row's sink step (block −1)

    @property
    def trace(self) -> Trace:
        """The trace the report is about: the first form's."""
        return self.traces[0]

    @property
    def rows(self) -> np.ndarray:
        """The scores as (rows, n)."""
        return np.atleast_2d(self.scores)

    def piece(self, name: str, r0: int, r1: int, a: int, b: int, t: int = 0) -> np.ndarray:
        """Rows r0:r1, columns a:b of "scores", "probabilities" (of trace t), "reference" (the
        one-shot stabilized softmax, float64) or "naive" (exp(s) / Σ exp(s))."""
        s = self.rows[r0:r1, a:b]
        if name == "scores":
            return s
        if self.in_dtype:
            lt = self.in_dtype[t]
            full = {"probabilities": lt.probabilities, "reference": lt.exact,
                    "naive": lt.naive}[name]
            return np.atleast_2d(full)[r0:r1, a:b]
        tr = self.traces[t]
        if name == "probabilities":
            if tr.probabilities is not None:
                return np.atleast_2d(tr.probabilities)[r0:r1, a:b]
            m, l = np.atleast_1d(tr.m)[r0:r1], np.atleast_1d(tr.l)[r0:r1]
            return probabilities(s, State(m, l))
        st = self.stats
        if name == "reference":
            return stable_from(s, st.m[r0:r1], st.total[r0:r1])
        if name == "naive":
            return naive_from(s, st.naive[r0:r1])
        raise ValueError(f"no array {name!r}")

    def pieces(self, name: str, t: int = 0) -> Iterator[tuple[int, int, int, int, np.ndarray]]:
        """(r0, r1, a, b, values) covering the whole array `name` (see piece), in row order."""
        for r0, r1, a, b in row_pieces(*self.rows.shape):
            yield r0, r1, a, b, self.piece(name, r0, r1, a, b, t)

    def whole(self, name: str, t: int = 0) -> np.ndarray:
        """The whole array `name`, shaped like the scores (for small inputs and tests)."""
        out = None
        for r0, r1, a, b, values in self.pieces(name, t):
            if out is None:
                out = np.empty(self.rows.shape, dtype=values.dtype)
            out[r0:r1, a:b] = values
        return out.reshape(np.shape(self.scores))

    @property
    def reference(self) -> np.ndarray:
        return self.whole("reference")

    @property
    def naive(self) -> np.ndarray:
        return self.whole("naive")

    def elements(self, index: Sequence[int], t: int = 0) -> dict[str, np.ndarray]:
        """The traced row's scores, probabilities, reference and naive values at `index`."""
        idx = np.asarray(index, dtype=np.intp)
        r = self.row
        if self.in_dtype:
            return {name: self.piece(name, r, r + 1, 0, self.rows.shape[1], t)[0][idx]
                    for name in ("scores", "probabilities", "reference", "naive")}
        s = np.asarray(self.rows[r, idx])[None]
        tr = self.traces[t]
        if tr.probabilities is not None:
            p = np.atleast_2d(tr.probabilities)[r, idx]
        else:
            p = probabilities(s, State(np.atleast_1d(tr.m)[r:r + 1],
                                       np.atleast_1d(tr.l)[r:r + 1]))[0]
        st = self.stats
        return {"scores": s[0], "probabilities": p,
                "reference": stable_from(s, st.m[r:r + 1], st.total[r:r + 1])[0],
                "naive": naive_from(s, st.naive[r:r + 1])[0]}

    def iter_steps(self, t: int = 0) -> Iterator[Step]:
        """Every step of trace t: the ones kept, or (when only the ends were kept) all of them
        made again, a chunk at a time."""
        tr = self.traces[t]
        if tr.step_count == len(tr.steps):
            yield from tr.steps
            return
        run = Folding(self.scores, self.block, tr.form, row=self.row)
        for cols in run.columns():
            yield from run.records(cols)

    def iter_columns(self, t: int = 0, batch: int = 4096) -> Iterator[StepColumns]:
        """Every step of trace t as StepColumns, a chunk at a time: the ones kept, or (when
        only the ends were kept) all of them made again (core.fastfold for a plain trace)."""
        tr = self.traces[t]
        if tr.step_count == len(tr.steps):
            for a in range(0, len(tr.steps), batch):
                yield StepColumns.from_steps(tr.steps[a:a + batch])
            return
        yield from Folding(self.scores, self.block, tr.form, row=self.row).columns()


def _max_diffs(rep: TraceReport) -> tuple[np.ndarray, float | None]:
    """Per row max |p − reference|, and with both forms max |p_merge − p_rescale|."""
    rows = rep.rows.shape[0]
    diff = np.zeros(rows)
    forms = 0.0 if len(rep.traces) > 1 else None
    for r0, r1, a, b, p in rep.pieces("probabilities"):
        ref = rep.piece("reference", r0, r1, a, b)
        diff[r0:r1] = np.maximum(diff[r0:r1], np.abs(p - ref).max(axis=-1, initial=0.0))
        if forms is not None:
            other = rep.piece("probabilities", r0, r1, a, b, 1)
            forms = max(forms, float(np.abs(other - p).max(initial=0.0)))
    return diff, forms


def capped(scores: np.ndarray, softcap: float) -> np.ndarray:
    """Scores through softcap·tanh(s / softcap); a masked −inf stays −inf (the kernels cap
    before they mask, docs/numerics.md#softcap). Example: capped([0., -inf], 2) -> [0, -inf]"""
    s = np.asarray(scores, dtype=np.float64)
    # a softcap far below the scores overflows s / softcap to ±inf, and tanh(±inf) = ±1: the
    # capped score is ±softcap, as it should be (issue 19's fuzz found the warning)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isneginf(s), -np.inf, softcap * np.tanh(s / softcap))


def _with_sink(traces: tuple, stats: RowStats, sink: float, row: int, scores: np.ndarray):
    """Each trace's final state with the sink joined (core.state.with_sink), its traced row's
    sink Step, and the references' statistics with the sink as one more score of value 0."""
    out, steps = [], []
    for tr in traces:
        m0, l0 = np.atleast_1d(tr.m), np.atleast_1d(tr.l)
        new, alpha = with_sink(State(m0, l0), np.full(m0.shape, sink))
        lse, _ = finalize(new)
        one = np.ndim(tr.m) == 0
        pick = (lambda a: a[0]) if one else (lambda a: a)
        steps.append(Step(-1, 0, 0, sink, float(m0[row]), float(new.m[row]), float(alpha[row]),
                          float(l0[row]), float(new.l[row]), sink=True))
        probs = None
        if tr.probabilities is not None:  # made again against the denominator with the sink
            probs = pick(probabilities(np.atleast_2d(scores), new))
        out.append(replace(tr, m=pick(new.m), l=pick(new.l), lse=pick(lse), probabilities=probs))
    m = np.maximum(stats.m, sink)
    with np.errstate(over="ignore"):
        total = stats.total * np.exp(stats.m - m) + np.exp(sink - m)
        naive = stats.naive + np.exp(sink)
    return tuple(out), RowStats(m, total, naive), tuple(steps)


def trace_report(
    scores: np.ndarray, block: int = 2, form: str = "rescale", *, row: int = 0,
    order: str | None = None, seed: int = 0, threshold: float = 0.0, dtype: str | None = None,
    precision: str | None = None, keep: int | None = None, softcap: float | None = None,
    sink: float | None = None,
) -> TraceReport:
    """Run online softmax over `scores` in `form` (rescale, merge or both) and check it.

    order (forward, reverse, shuffle with `seed`) folds the blocks in that order and adds the
    order check; threshold τ > 0 runs the lazy rescale and adds the lazy vs eager report; dtype
    (a name) runs it on the scores rounded to that dtype instead, the state held as `precision`
    (flash, the default, or naive) holds it. keep=K keeps only the first and last K steps of
    a plain trace (no order, threshold or dtype): iter_steps and iter_columns make all of them
    again. softcap caps the scores first; sink joins every row's denominator after the last
    block (docs/numerics.md#softcap, #sinks).
    """
    forms = FORMS if form == "both" else (form,)
    block = min(int(block), max(1, np.shape(np.atleast_2d(scores))[-1]))  # past the end: one
    if dtype is not None and (softcap is not None or sink is not None):
        raise OsmError("`softcap` and `sink` trace the float64 state; with `dtype` osm models "
                       "a kernel's rounding of plain scores only (osm attention `dtype` takes "
                       "both)")
    if softcap is not None:
        scores = capped(scores, softcap)
    if dtype is not None:
        # precision/ imports ml_dtypes (about 0.8 s): only a trace in a dtype pays for it
        from osm_cli.precision.lowtrace import trace_in
        from osm_cli.precision.model import model

        lab = model(dtype, precision)
        low = tuple(trace_in(scores, lab, block, f, row) for f in forms)
        traces = tuple(x.trace for x in low)
        forms_diff = None if len(traces) < 2 else float(
            np.abs(traces[1].probabilities - traces[0].probabilities).max())
        return TraceReport(scores, block, form, row, traces, None, low[0].max_diff, forms_diff,
                           seed=seed, in_dtype=low)
    n = np.atleast_2d(scores).shape[1]
    idx = None if order is None else block_order(-(-n // block), order, seed)
    whole = order is not None or bool(threshold)  # the checks compare whole runs
    traces = tuple(online_softmax(scores, block, f, row=row, order=idx, threshold=threshold,
                                  keep=None if whole else keep, with_probabilities=whole)
                   for f in forms)
    lazy = eager = check = None
    if threshold:
        lazy, eager = lazy_report(scores, block, threshold, row=row, order=idx, lazy=traces[0])
    if order is not None:
        check = order_check(scores, block, traces[0].form, order, seed, threshold,
                            chosen=traces[0])
    stats = row_stats(np.atleast_2d(scores))
    sink_steps: tuple = ()
    if sink is not None:
        traces, stats, sink_steps = _with_sink(traces, stats, float(sink), row, scores)
    rep = TraceReport(scores, block, form, row, traces, stats, np.zeros(0), None, order, seed,
                      threshold, lazy, eager, check, softcap=softcap, sink=sink,
                      sink_steps=sink_steps)
    diff, forms_diff = _max_diffs(rep)
    return replace(rep, max_diff=diff, forms_diff=forms_diff)


__all__ = ["CHUNK", "RowStats", "TraceReport", "row_pieces", "row_stats", "trace_report"]
