"""What `osm attention` reports, computed in one place: the tiled forward (or the precision
model of --dtype) in a tile order, a split-KV run, the float64 one-shot reference and its
errors, and the FlashAttention test rule's verdict on a model's run.

Leaves out: the algorithms themselves (flash/, precision/), files (io/), tables and JSON
(present/).

Example: attention_report(q, k, v, ScoreOptions(causal=True), Tiling()).errors["max_abs_err"]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.reference import max_abs_diff
from osm_cli.errors import OsmError
from osm_cli.flash.forward import Attention, ScoreOptions, Tiling
from osm_cli.flash.options import default_blocks
from osm_cli.flash.packed import plan_packing, traced_row
from osm_cli.flash.reference import errors, reference
from osm_cli.flash.shapes import as_bhnd, row_of
from osm_cli.flash.split import SplitRun, split_kv
from osm_cli.precision.check import descaled_inputs
from osm_cli.precision.dtypes import Rounding
from osm_cli.precision.gpu_ops import LOG2E
from osm_cli.precision.kernels import run_flash
from osm_cli.precision.model import Model, hooks_for, judge_run, run, storable
from osm_cli.precision.presets import kernel_for, mma_for, preset_refusals
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
    ref_row: np.ndarray | None = None  # the reference's traced row (the first)
    verdict: Verdict | None = None  # of a model's run (with the reference)
    baseline: Baseline | None = None  # with --order or a rescale threshold: vs forward, eager
    kernel: str | None = "tiles"  # the kernel preset that ran (presets.py); None: naive
    mma: str = "blas"  # how the matmuls rounded (presets.mma_for: resolved, never None)
    block_k_given: bool = False  # --block-k replaced a preset's own tile width
    shown: bool = False  # the kernel named on the screen (a model ran, or --kernel was given)
    ref_rows: np.ndarray | None = None  # the reference's traced rows, (rows, dv), as queries

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
    with_reference: bool = True, progress=None, kernel: str | None = None, mma: str | None = None,
    descale=None, rescale_threshold: float | None = None, **run_kw,
) -> AttentionReport:
    """Run attention on q, k, v and check it against the float64 one-shot reference.

    q, k, v hold `model`'s values already (precision.model.prepare, which also gives `notes`).
    opts and tiling are attention's records; run_kw its masked_lse and trace_at. order
    (forward, reverse, shuffle with `seed`) is the order to visit the K/V tiles in; splits also
    runs split-KV with that many chunks; progress(done, total) is called as Q tiles finish.
    kernel names the preset (kernel_for's default); a preset runs its own loop (emulate.py)
    with mma (presets.mma_for: its tensor cores by default), FP8's descale (emulate.Descale)
    and rescale_threshold (natural log, given to the kernel in log2 units; None: the kernel's
    own), tiling.block_k replacing its tile width.
    """
    if opts.packing.active and (splits is not None or order != "forward"):
        raise OsmError("`splits` and `order` run on one dense batch; a varlen or paged batch "
                       "runs its sequences one by one")
    shown = model is not None or kernel is not None
    name = kernel_for(model, kernel, opts)
    mma = mma_for(name, mma)
    tau = rescale_threshold
    if name not in (None, "tiles"):
        preset_refusals(name, order=order, form=tiling.form, splits=splits,
                        block_q=tiling.block_q, descale=descale, dtype=model.name)
        return _preset_report(q, k, v, opts, tiling, model, notes, name, mma, descale, tau,
                              with_reference, progress, shown, run_kw)
    preset_refusals(name or "tiles", descale=descale)
    if tau is not None:
        tiling = replace(tiling, threshold=tau)
    hooks = hooks_for(model, splits)
    run_kw = {**run_kw, "opts": opts, "hooks": hooks}
    if run_kw.get("masked_lse") is None:  # osm's own loop: −inf, as since 0.1
        run_kw["masked_lse"] = "neg-inf"
    tiles = _tile_order(q, k, order, seed, tiling.block_k, opts.layout)
    res = run(model, q, k, v, progress=progress, tiling=replace(tiling, order=tiles), **run_kw)
    split = None if splits is None else split_kv(q, k, v, splits, res, tiling=tiling, **run_kw)
    base = None
    if tiles is not None or tiling.threshold:
        plain = run(model, q, k, v, **{**run_kw, "tiling": replace(tiling, threshold=0.0),
                                       "trace_at": None})
        base = Baseline(order, float(tiling.threshold or 0.0), res.counters.rescales,
                        plain.counters.rescales,
                        max_abs_diff(res.out, plain.out), max_abs_diff(res.lse, plain.lse))
    extra = {"kernel": name, "mma": mma, "shown": shown}
    if not with_reference:
        return AttentionReport(res, model, notes, split, baseline=base, **extra)
    errs, ref_rows, verdict = _judged(res, model, (q, k, v), opts)
    return AttentionReport(res, model, notes, split, errs, ref_rows[0], verdict, base,
                           ref_rows=ref_rows, **extra)


def _judged(res: Attention, model: Model | None, qkv: tuple, opts: ScoreOptions) -> tuple:
    """A run against the float64 reference of qkv (the descaled inputs of an FP8 run): its
    errors, the reference's traced rows ((rows, dv), as res.trace.queries) and, for a model's run,
    the FlashAttention rule's verdict."""
    ref_out, ref_lse = reference(*qkv, opts)
    errs = errors(res, ref_out, ref_lse)
    b, h, _ = res.trace.at
    queries = res.trace.queries or (res.trace.at[2],)
    if opts.packing.active:
        packed = plan_packing(*qkv, opts.packing)
        ref_rows = np.stack([traced_row(packed, ref_out, (b, h, i)) for i in queries])
    else:
        ref_rows = row_of(ref_out, (b, h, list(queries)), opts.layout)
    verdict = None if model is None else judge_run(model, res, ref_out, ref_lse, *qkv, opts)
    return errs, ref_rows, verdict


def _preset_report(q, k, v, opts, tiling, model, notes, name, mma, descale, tau,
                   with_reference, progress, shown, run_kw) -> AttentionReport:
    """A kernel preset's run (emulate.py): its loop, its masked-row LSE unless given, the
    baseline of a given threshold against its eager run, the reference of the descaled inputs."""
    kw = {**run_kw, "opts": opts, "tiling": Tiling(block_k=tiling.block_k), "mma": mma,
          "descale": descale}
    if kw.get("masked_lse") is None:
        kw.pop("masked_lse", None)
    log2 = None if tau is None else float(tau) * LOG2E
    eff = (q, k, v) if descale is None else descaled_inputs(q, k, v, descale, opts)  # checked
    res = run_flash(model, q, k, v, kernel=name, progress=progress, threshold=log2, **kw)
    base = None
    if tau:
        eager = run_flash(model, q, k, v, kernel=name, **{**kw, "threshold": 0.0,
                                                          "trace_at": None})
        base = Baseline("forward", float(tau), res.counters.rescales, eager.counters.rescales,
                        max_abs_diff(res.out, eager.out), max_abs_diff(res.lse, eager.lse))
    extra = {"kernel": name, "mma": mma, "block_k_given": tiling.block_k is not None,
             "shown": shown}
    if not with_reference:
        return AttentionReport(res, model, notes, baseline=base, **extra)
    errs, ref_rows, verdict = _judged(res, model, eff, opts)
    return AttentionReport(res, model, notes, None, errs, ref_rows[0], verdict, base,
                           ref_rows=ref_rows, **extra)


__all__ = ["AttentionReport", "Baseline", "attention_report"]
