"""What a command reports, computed in one place: the run, its oracles and the checks its options
ask for, returned as one frozen record that render.py and documents.py both read.

- `trace_report` (osm trace): online softmax over a score vector or matrix in one or both update
  forms, in a block order or with a lazy-rescale threshold (or rounded to a dtype, precision.py),
  beside the one-shot stabilized and naive softmax, with the per-row differences, the lazy vs
  eager report (lazy.py) and the forward / order / tree check (merge.py).
- `attention_report` (osm attention): the tiled forward (or the precision model of --dtype) in a
  tile order, a split-KV run, the float64 one-shot reference and its errors, and the
  FlashAttention test rule's verdict on a model's run.

Leaves out: the algorithms themselves (online.py, lazy.py, merge.py, precision.py), reading and
writing files (io.py), tables (render.py), JSON (documents.py).

Example: trace_report(np.array([1., 2., 5., 3.]), 2).traces[0].steps[1].scale == exp(2 - 5)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import (
    Attention,
    SplitRun,
    as_bhnd,
    default_blocks,
    errors,
    reference,
    row_of,
    split_kv,
)
from .lazy import LazyReport, lazy_report
from .merge import OrderCheck, block_order, order_check
from .online import FORMS, Trace, online_softmax
from .reference import max_abs_diff, naive_softmax, stable_softmax


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
    in_dtype: tuple = ()  # under a dtype: precision.LowTrace per form (traces are theirs)

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
        from .precision import model, trace_in

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


@dataclass(frozen=True)
class Baseline:
    """The same attention run forward and eagerly, beside a reordered or lazy one (NUMERICS §8)."""

    order: str
    threshold: float
    rescales: int  # (row, tile) updates that moved a finite m in this run
    rescales_eager: int  # the same in the forward, eager run
    max_abs_diff: float  # max |O − O_forward_eager|
    max_lse_diff: float


@dataclass(frozen=True)
class AttentionReport:
    """Everything `osm attention` shows: the run, its split-KV twin, the reference, the verdict."""

    result: Attention
    model: object = None  # precision.Model of --dtype (None: the plain run)
    notes: tuple = ()  # precision.Rounding per input: what rounding to the model's dtype did
    split: SplitRun | None = None  # with splits: the split-KV run merged, against the unsplit
    errors: dict | None = None  # against the float64 reference (None: not compared)
    ref_row: np.ndarray | None = None  # the reference's traced row
    verdict: object = None  # precision.Verdict of a model's run (with the reference)
    baseline: Baseline | None = None  # with --order or a rescale threshold: vs forward, eager

    @property
    def stored_out(self) -> np.ndarray:
        """O as --out writes it: in the model's dtype where numpy has that dtype."""
        if self.model is None:
            return self.result.out
        from .precision import storable

        return storable(self.model, self.result.out)


def _tile_order(q, k, order: str, seed: int, block_k: int | None, layout: str):
    """The K/V tiles as a permutation to visit them in; None for forward (attention's own)."""
    if order == "forward":
        return None
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    bk = block_k or default_blocks(np.shape(q)[-1])[1]
    return block_order(-(-s // bk), order, seed)


def attention_report(
    q, k, v, mask_kw: dict, *, model=None, notes: tuple = (), splits: int | None = None,
    order: str = "forward", seed: int = 0, with_reference: bool = True, progress=None,
    **run_kw,
) -> AttentionReport:
    """Run attention on q, k, v and check it against the float64 one-shot reference.

    q, k, v hold `model`'s values already (precision.prepare, which also gives `notes`).
    mask_kw are attention's mask, scale and layout keywords; run_kw its tile, trace and update
    keywords (block_q, block_k, masked_lse, form, trace_at, threshold). order (forward, reverse,
    shuffle with `seed`) is the order to visit the K/V tiles in; splits also runs split-KV with
    that many chunks; progress(done, total) is called as Q tiles finish.
    """
    from . import precision as prec

    run_kw = {**run_kw, **mask_kw, **prec.run_kwargs(model, splits)}
    layout = mask_kw.get("layout", "bhnd")
    tiles = _tile_order(q, k, order, seed, run_kw.get("block_k"), layout)
    res = prec.run(model, q, k, v, progress=progress, order=tiles, **run_kw)
    split = None if splits is None else split_kv(q, k, v, splits, res, **run_kw)
    base = None
    if tiles is not None or run_kw.get("threshold"):
        plain = prec.run(model, q, k, v, **{**run_kw, "threshold": 0.0, "trace_at": None})
        base = Baseline(order, float(run_kw.get("threshold") or 0.0), res.rescales,
                        plain.rescales, max_abs_diff(res.out, plain.out),
                        max_abs_diff(res.lse, plain.lse))
    if not with_reference:
        return AttentionReport(res, model, notes, split, baseline=base)
    ref_out, ref_lse = reference(q, k, v, **mask_kw)
    errs = errors(res, ref_out, ref_lse)
    ref_row = row_of(ref_out, res.traced, layout)
    verdict = None
    if model is not None:
        verdict = prec.judge_run(model, res, ref_out, ref_lse, q, k, v, **mask_kw)
    return AttentionReport(res, model, notes, split, errs, ref_row, verdict, base)



__all__ = ["AttentionReport", "TraceReport", "attention_report", "trace_report"]
