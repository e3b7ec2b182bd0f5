"""What the block size buys: one run per block size, beside the FA1 cost model (costmodel.py).

`sweep(blocks, run, ...)` takes any `run(block) -> Measure`: `score_runner(scores)` runs online
softmax over a score matrix; `attention_runner(q, k, v)` runs flash/'s tiled forward with
block_k = the block size; `sweep_scores` and `sweep_attention` pair each with its sizes. Per
block size it reports the measured error and rescale count next to the modelled per-tile working
set and HBM traffic of tiled vs standard attention (and, when a mask skips tiles, FA1's
block-sparse traffic of the tiles actually computed).
Leaves out: files, printing, plotting.

Example: sweep([2, 4], score_runner(np.array([[1., 2., 5., 3.]])), n_q=1, n_k=4, d=64).rows[0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.fold import block_bounds, online_softmax
from osm_cli.core.reference import logsumexp, stable_softmax
from osm_cli.errors import InputError
from osm_cli.flash.forward import Hooks, ScoreOptions, Tiling, attention
from osm_cli.flash.options import split_options
from osm_cli.flash.reference import errors, reference
from osm_cli.flash.shapes import as_bhnd

from .costmodel import fa1_blocks, hbm_bytes_flash, hbm_bytes_standard, tile_bytes


@dataclass(frozen=True)
class Measure:
    """What one run at one block size measured (over every row)."""

    max_error: float  # max |result − one-shot float64 reference| (probabilities or outputs)
    lse_error: float  # max |LSE − reference LSE| over rows with a visible key
    rescales: int  # steps where a row's running max moved and its old state was scaled down
    tiles: int  # tiles of block_q rows × block keys
    skipped: int  # of which every score is masked (-inf): a kernel with the mask skips them
    row_visits: int | None = None  # (query row, key tile) pairs computed, per head; None: all
    ref_max: float = 1.0  # max |reference| (p or O): the magnitude whose ulps rounding is in


@dataclass(frozen=True)
class SweepRow:
    block: int  # keys per block, FA's block_k / B_c
    measure: Measure
    tile_bytes: int  # on-chip working set of one tile step
    fits: bool  # tile_bytes ≤ the SRAM size
    hbm_flash: int  # modelled HBM bytes of the tiled forward with this block_k
    hbm_skipping: int | None = None  # the same, skipping masked tiles (FA1 Prop. 4)

    @property
    def sparse(self) -> bool:
        """Tiles were skipped here, so the block-sparse traffic (hbm_skipping) differs."""
        return self.hbm_skipping is not None and self.measure.skipped > 0


@dataclass(frozen=True)
class Sweep:
    rows: tuple[SweepRow, ...]
    n_q: int
    n_k: int
    d: int
    heads: int
    batch: int
    dtype_bytes: int
    sram_bytes: int
    block_q: int
    hbm_standard: int  # modelled HBM bytes of standard attention's forward
    fa1_block: tuple[int, int]  # FA1's (B_r, B_c) for this SRAM
    kernel: str | None = None  # Q/K/V: the kernel preset each run modelled (presets.py)
    dtype: str | None = None  # … in this dtype (None: the inputs unrounded, state in accum)
    mma: str | None = None  # … with these matmuls (presets.mma_for; None: no model ran)


def sweep(
    blocks: Sequence[int], run: Callable[[int], Measure], *, n_q: int, n_k: int, d: int,
    heads: int = 1, batch: int = 1, dtype_bytes: int = 2, sram_bytes: int = 192 * 1024,
    block_q: int = 128,
) -> Sweep:
    """Run `run(block)` for each block size and put the cost model beside each measurement.
    A block longer than the n_k keys is one block of n_k (docs/inputs.md#zero-size-inputs)."""
    if not blocks or min(blocks) < 1:
        raise InputError("block sizes must be whole numbers of at least 1")
    M = sram_bytes // dtype_bytes
    rows = []
    for b in dict.fromkeys(min(int(b), max(1, n_k)) for b in blocks):
        tb = tile_bytes(block_q, b, d, dtype_bytes)
        model = dict(heads=heads, batch=batch, dtype_bytes=dtype_bytes, block_k=b, n_q=n_q)
        flash = hbm_bytes_flash(n_k, d, **model)
        m = run(b)
        sparse = None if m.row_visits is None else hbm_bytes_flash(
            n_k, d, **model, row_visits=m.row_visits)
        rows.append(SweepRow(b, m, tb, tb <= sram_bytes, flash, sparse))
    standard = hbm_bytes_standard(n_k, d, heads, batch, dtype_bytes, n_q=n_q)
    return Sweep(
        tuple(rows), n_q, n_k, d, heads, batch, dtype_bytes, sram_bytes, block_q, standard,
        fa1_blocks(M, d) if M >= 1 else (0, 0),
    )


def score_runner(
    scores: np.ndarray, dtype=np.float64, block_q: int = 128
) -> Callable[[int], Measure]:
    """run(block): online softmax (rescale form) over every row of `scores` in `dtype`, against
    the float64 one-shot reference.
    """
    s64 = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    s = s64.astype(dtype)
    ref_p = stable_softmax(s64)
    ref_lse = logsumexp(s64)
    rows, n = s.shape
    row_tiles = -(-rows // block_q)
    top = float(np.abs(ref_p[np.isfinite(ref_p)]).max(initial=0.0))

    def run(block: int) -> Measure:
        tr = online_softmax(s, block)
        skipped = 0
        for _, a, b in block_bounds(n, block):
            masked = np.isneginf(s[:, a:b]).all(axis=-1)
            for r in range(row_tiles):
                skipped += bool(masked[r * block_q:(r + 1) * block_q].all())
        p = tr.probabilities.astype(np.float64)
        seen = np.isfinite(ref_lse)
        lse_err = np.abs(tr.lse.astype(np.float64)[seen] - ref_lse[seen])
        return Measure(
            float(np.abs(p - ref_p).max()), float(lse_err.max(initial=0.0)), tr.rescales,
            row_tiles * -(-n // block), skipped, ref_max=top,
        )

    return run


def attention_runner(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int | None = None,
    accum=np.float64, opts: ScoreOptions | None = None, model=None, kernel: str = "tiles",
    mma: str | None = None, **options,
) -> Callable[[int], Measure]:
    """run(block): attention with block_k = block (block_q fixed) over all of Q/K/V, the state
    in `accum`, against the float64 one-shot reference, computed once here.

    opts (or its fields as keywords: causal, causal_align, window, mask, scale, layout) as
    attention's. max_error is max |O − ref|; tiles and skipped count (Q tile, K/V tile) pairs
    per head, as attention does, and so do row_visits. model (precision.model.Model; q, k, v
    hold its values) runs the flash model of `kernel` (a preset's own loop with its block_k
    replaced, or osm's tiles) with `mma`, in place of the plain run in `accum`.
    """
    opts = split_options(options, opts)[0]
    ref_out, ref_lse = reference(q, k, v, opts)
    o = np.asarray(ref_out, dtype=np.float64)
    top = float(np.abs(o[np.isfinite(o)]).max(initial=0.0))

    def run(block: int) -> Measure:
        if model is not None:
            from osm_cli.precision.kernels import run_flash

            extra = {"mma": mma} if kernel != "tiles" else {"block_q": block_q}
            res = run_flash(model, q, k, v, kernel=kernel, opts=opts, block_k=block,
                            trace_at=None, **extra)
        else:
            res = attention(q, k, v, opts=opts, tiling=Tiling(block_q=block_q, block_k=block),
                            hooks=Hooks(accum=accum), trace_at=None)
        err = errors(res, ref_out, ref_lse)
        return Measure(
            err["max_abs_err"], err["max_lse_err"], res.counters.rescales, res.tiles.total,
            res.tiles.skipped, res.counters.row_visits, ref_max=top,
        )

    return run


def sweep_scores(
    blocks: Sequence[int], scores: np.ndarray, *, accum=np.float64, block_q: int | None = None,
    head_dim: int | None = None, dtype_bytes: int = 2, sram_bytes: int = 192 * 1024,
) -> Sweep:
    """sweep of score_runner over the rows of `scores`, the state in `accum`; the model is for
    head dim `head_dim` (default 64) and tiles of `block_q` rows (default 128)."""
    bq = 128 if block_q is None else block_q
    rows = np.atleast_2d(scores)
    return sweep(blocks, score_runner(rows, np.dtype(accum), bq), n_q=rows.shape[0],
                 n_k=rows.shape[1], d=64 if head_dim is None else head_dim,
                 dtype_bytes=dtype_bytes, sram_bytes=sram_bytes, block_q=bq)


def sweep_attention(
    blocks: Sequence[int], q: np.ndarray, k: np.ndarray, v: np.ndarray, *, accum=np.float64,
    block_q: int | None = None, dtype_bytes: int = 2, sram_bytes: int = 192 * 1024,
    opts: ScoreOptions | None = None, dtype: str | None = None, kernel: str | None = None,
    mma: str | None = None, **options,
) -> Sweep:
    """sweep of attention_runner over all of Q/K/V (block_q default 128), the state in `accum`;
    the model takes d, the lengths, heads and batch from Q and K. opts (or its fields as
    keywords) as attention's. dtype rounds Q, K, V to it and runs the flash model of `kernel`
    (default: fa2 for 16-bit, fa4-sm100 for FP8, tiles otherwise) at each block_k."""
    from osm_cli.precision.presets import default_kernel, mma_for, preset_refusals

    opts = split_options(options, opts)[0]
    if kernel not in (None, "tiles"):
        preset_refusals(kernel, block_q=block_q)  # a named preset runs its own query tiles
    m = None
    name = kernel or "tiles"
    if dtype is not None:
        from osm_cli.precision.dtypes import round_inputs
        from osm_cli.precision.model import model as make_model

        m = make_model(dtype)
        name = kernel or default_kernel(m.name, opts)
        (q, k, v), _ = round_inputs({"Q": q, "K": k, "V": v}, m.dtype)
    elif name != "tiles":
        raise InputError(f"`kernel` {name} models a 16-bit or FP8 kernel; give `dtype`")
    mma = mma_for(name, mma)
    (b, hq, t, d), s = as_bhnd(q, opts.layout, "Q").shape, as_bhnd(k, opts.layout, "K").shape[2]
    bq = 128 if block_q is None else block_q
    runner = attention_runner(q, k, v, block_q=block_q if m is not None else bq,
                              accum=np.dtype(accum), opts=opts, model=m, kernel=name, mma=mma)
    res = sweep(blocks, runner, n_q=t, n_k=s, d=d, heads=hq, batch=b, dtype_bytes=dtype_bytes,
                sram_bytes=sram_bytes, block_q=bq)
    return replace(res, kernel=name, dtype=None if m is None else m.name,
                   mma=None if m is None else mma)


__all__ = [
    "Measure", "Sweep", "SweepRow", "attention_runner", "score_runner", "sweep",
    "sweep_attention", "sweep_scores",
]
