"""What `osm attention` reports, computed in one place: the tiled forward (or the precision
model of --dtype) in a tile order, a split-KV run, the float64 one-shot reference and its
errors, and the FlashAttention test rule's verdict on a model's run.

Leaves out: the algorithms themselves (attention/, precision/), files (io/), tables and JSON
(present/).

Example: attention_report(q, k, v, ScoreOptions(causal=True), Tiling()).errors["max_abs_err"]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from osm_cli.attention.forward import Attention, ScoreOptions, Tiling
from osm_cli.attention.options import default_blocks
from osm_cli.attention.packed import plan_packing, traced_row
from osm_cli.attention.reference import errors, reference
from osm_cli.attention.shapes import as_bhnd, row_of
from osm_cli.attention.split import SplitRun, split_kv
from osm_cli.core.reference import max_abs_diff
from osm_cli.errors import OsmError
from osm_cli.precision.dtypes import Rounding
from osm_cli.precision.model import Model, hooks_for, judge_run, run, storable
from osm_cli.precision.rule import Verdict
from osm_cli.studies.order import block_order


@dataclass(frozen=True)
class Baseline:
    """The same attention run forward and eagerly, beside a reordered or lazy one
    (docs/numerics.md#order, #lazy-rescale)."""

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
    model: Model | None = None  # the precision model of --dtype (None: the plain run)
    notes: tuple[Rounding, ...] = ()  # per input: what rounding to the model's dtype did
    split: SplitRun | None = None  # with splits: the split-KV run merged, against the unsplit
    errors: dict | None = None  # against the float64 reference (None: not compared)
    ref_row: np.ndarray | None = None  # the reference's traced row
    verdict: Verdict | None = None  # of a model's run (with the reference)
    baseline: Baseline | None = None  # with --order or a rescale threshold: vs forward, eager

    @property
    def stored_out(self) -> np.ndarray:
        """O as --out writes it: in the model's dtype where numpy has that dtype."""
        if self.model is None:
            return self.result.out
        return storable(self.model, self.result.out)


def _tile_order(q, k, order: str, seed: int, block_k: int | None, layout: str):
    """The K/V tiles as a permutation to visit them in; None for forward (attention's own)."""
    if order == "forward":
        return None
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    bk = block_k or default_blocks(np.shape(q)[-1])[1]
    return block_order(-(-s // bk), order, seed)


def attention_report(
    q, k, v, opts: ScoreOptions, tiling: Tiling, *, model: Model | None = None,
    notes: tuple = (), splits: int | None = None, order: str = "forward", seed: int = 0,
    with_reference: bool = True, progress=None, **run_kw,
) -> AttentionReport:
    """Run attention on q, k, v and check it against the float64 one-shot reference.

    q, k, v hold `model`'s values already (precision.model.prepare, which also gives `notes`).
    opts and tiling are attention's records; run_kw its masked_lse and trace_at. order
    (forward, reverse, shuffle with `seed`) is the order to visit the K/V tiles in; splits also
    runs split-KV with that many chunks; progress(done, total) is called as Q tiles finish.
    """
    if opts.packing.active and (splits is not None or order != "forward"):
        raise OsmError("--splits and --order run on one dense batch; a varlen or paged batch "
                       "runs its sequences one by one")
    hooks = hooks_for(model, splits)
    run_kw = {**run_kw, "opts": opts, "hooks": hooks}
    tiles = _tile_order(q, k, order, seed, tiling.block_k, opts.layout)
    res = run(model, q, k, v, progress=progress, tiling=replace(tiling, order=tiles), **run_kw)
    split = None if splits is None else split_kv(q, k, v, splits, res, tiling=tiling, **run_kw)
    base = None
    if tiles is not None or tiling.threshold:
        plain = run(model, q, k, v, **{**run_kw, "tiling": replace(tiling, threshold=0.0),
                                       "trace_at": None})
        base = Baseline(order, float(tiling.threshold or 0.0), res.rescales, plain.rescales,
                        max_abs_diff(res.out, plain.out), max_abs_diff(res.lse, plain.lse))
    if not with_reference:
        return AttentionReport(res, model, notes, split, baseline=base)
    ref_out, ref_lse = reference(q, k, v, opts)
    errs = errors(res, ref_out, ref_lse)
    if opts.packing.active:
        ref_row = traced_row(plan_packing(q, k, v, opts.packing), ref_out, res.traced)
    else:
        ref_row = row_of(ref_out, res.traced, opts.layout)
    verdict = None
    if model is not None:
        verdict = judge_run(model, res, ref_out, ref_lse, q, k, v, opts)
    return AttentionReport(res, model, notes, split, errs, ref_row, verdict, base)


__all__ = ["AttentionReport", "Baseline", "attention_report"]
