"""Tiled attention forward in FlashAttention-2's loop order, with a trace of one query row.

plan → tile loop → assemble. `_plan` checks the inputs once and fixes the tiles; `_q_tile` is
the inner loop over K/V tiles for one Q tile of block_q rows: each tile's scores come from
masks.score_tile and are folded into (m, l, O) by core.fold with core.state's own update step,
vectorized over batch, heads and the tile's rows; `_assemble` divides by l once and shapes the
result. Tiles that the causal mask, the window or the user's mask hide entirely are skipped and
counted (docs/numerics.md#tile-skipping). The N×N score matrix is never formed: memory is
O(N·d) plus one tile.

Conventions: docs/numerics.md#scale, #causal-alignment, #masks, #gqa, #masked-rows.
Leaves out: files (io/), the reference (reference.py), split-KV (split.py), printing (present/).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from osm_cli.core.fold import fold
from osm_cli.core.record import Step
from osm_cli.core.state import (
    State,
    Update,
    finalize,
    initial_state,
    merge_step,
    moved,
    rescale_step,
)
from osm_cli.errors import InputError

from .masks import (
    Band,
    check_mask,
    check_score_range,
    make_band,
    mask_about,
    scale_q,
    score_tile,
    tile_kind,
)
from .options import (
    MASKED_LSE,
    Hooks,
    ScoreOptions,
    Tiling,
    check_masked_lse,
    split_options,
)
from .shapes import (
    bhnd_inputs,
    broadcast_mask,
    check_finite,
    check_traced,
    from_bhnd,
    kv_head,
)

O_SHOWN = 3  # components of O a trace step keeps


@dataclass(frozen=True)
class Attention:
    """What `attention` returns: out and lse, and what the summary shows."""

    out: np.ndarray
    lse: np.ndarray
    scale: float
    shape_q: tuple
    shape_k: tuple
    shape_v: tuple
    block_q: int
    block_k: int
    causal: bool
    align: str
    window: tuple | None
    masked_lse: str
    tiles_computed: int
    tiles_skipped: int
    rescales: int
    masked_rows: int
    trace: tuple[Step, ...] = ()
    traced: tuple = (0, 0, 0)
    trace_out: np.ndarray | None = None
    tiles_total: int = 0
    mask: str = "none"  # the user's mask in a few words (masks.mask_about)
    row_visits: int = 0  # (query row, K/V tile) pairs computed, per head (FA1 Prop. 4's count)
    one_shot: bool = False  # plain attention (precision naive): no tiles


@dataclass
class Counts:
    """What one Q tile's loop counted: K/V tiles computed and skipped, rescales, row visits."""

    computed: int = 0
    skipped: int = 0
    rescales: int = 0
    row_visits: int = 0

    def __iadd__(self, other: Counts) -> Counts:
        self.computed += other.computed
        self.skipped += other.skipped
        self.rescales += other.rescales
        self.row_visits += other.row_visits
        return self


@dataclass(frozen=True)
class Plan:
    """Everything the tile loop needs, fixed once: the inputs grouped by kv head, the tiles,
    the masks, the state's dtype and where the traced row is."""

    q5: np.ndarray  # (B, Hkv, g, t, d): the g query heads that share a kv head
    k3: np.ndarray  # (B·Hkv, s, d)
    v3: np.ndarray  # (B·Hkv, s, dv)
    t: int
    bq: int
    bk: int
    k0: int
    k1: int
    starts: tuple[int, ...]  # first key of each K/V tile, in the order visited
    band: Band | None
    user_mask: np.ndarray | None  # (B, Hkv, g, t, s)
    accum: np.dtype
    scale: float
    traced: tuple  # (batch, head, query) or (-1, -1, -1)
    at_row: tuple  # the traced row as (batch, kv head, query head within its group)

    @property
    def groups(self) -> tuple[int, int, int]:
        b, hk, g = self.q5.shape[:3]
        return b, hk, g


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, opts: ScoreOptions | None = None,
              tiling: Tiling | None = None, hooks: Hooks | None = None,
              masked_lse: str = "neg-inf", trace_at: tuple[int, int, int] | None = (0, 0, 0),
              progress: Callable[[int, int], None] | None = None, **options) -> Attention:
    """softmax(scale·Q·Kᵀ + mask)·V, tile by tile, with the online update of core.state.

    q (…, t, d), k (…, s, d), v (…, s, dv) in opts.layout ("bhnd" PyTorch, "bnhd"
    FlashAttention). opts, tiling and hooks are the records of options.py; their fields may
    also be given as keywords (causal=True, block_k=64, accum=np.float32, …). trace_at =
    (batch, head, query) picks the row whose tiles are recorded (None: none); masked_lse the
    LSE of fully masked rows; progress(done, total) is called as Q tiles finish.

    Example: attention(q, k, v, causal=True).out
    """
    opts, tiling, hooks = split_options(options, opts, tiling, hooks)
    check_masked_lse(masked_lse)
    plan = _plan(q, k, v, opts, tiling, hooks, trace_at)
    b, hk, g = plan.groups
    out5 = np.zeros((b, hk, g, plan.t, plan.v3.shape[-1]), dtype=plan.accum)
    lse5 = np.zeros((b, hk, g, plan.t), dtype=plan.accum)
    step = rescale_step if tiling.form == "rescale" else merge_step
    step_kw = {"p_round": hooks.p_round, **({"threshold": tiling.threshold}
                                            if tiling.threshold else {})}

    def run(i0: int):
        return _q_tile(plan, i0, step, step_kw, out5, lse5)

    # Q tiles are independent (FA2 gives each its own thread block); numpy and BLAS release the
    # GIL, so a thread per core runs them side by side.
    trace: list[Step] = []
    counts = Counts()
    n_q = -(-plan.t // plan.bq)
    workers = max(1, min(n_q, os.cpu_count() or 1))
    # One BLAS thread per worker: OpenBLAS's own threads would fight ours for the same cores.
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        for done, (steps, c) in enumerate(pool.map(run, range(0, plan.t, plan.bq)), 1):
            trace += steps
            counts += c
            if progress is not None:
                progress(done, n_q)
    return _assemble(plan, q, k, v, opts, masked_lse, out5, lse5, trace, counts,
                     n_q * len(plan.starts))


def _plan(q, k, v, opts: ScoreOptions, tiling: Tiling, hooks: Hooks, trace_at) -> Plan:
    """Check the inputs and fix what every Q tile shares."""
    q4, k4, v4 = bhnd_inputs(q, k, v, opts.layout)
    b, hq, t, d = q4.shape
    hk, s, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    g = hq // hk
    bq, bk = tiling.blocks(d)
    accum = hooks.accum
    if accum is None:
        accum = np.float64 if np.float64 in (q4.dtype, k4.dtype, v4.dtype) else np.float32
    q_max, k_max, _ = (check_finite(x, name) for x, name in ((q4, "Q"), (k4, "K"), (v4, "V")))
    check_score_range(q4, k4, opts.scale_for(d), accum, q_max, k_max)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    mask = check_mask(opts.mask)
    user_mask = None
    if mask is not None:
        user_mask = broadcast_mask(mask, (b, hq, t, s)).reshape(b, hk, g, t, s)
    k0, k1 = (0, s) if tiling.keys is None else tiling.keys
    if not 0 <= k0 <= k1 <= s:
        raise InputError(f"key range {k0}:{k1} is outside 0:{s}")
    starts = list(range(k0, k1, bk))
    if tiling.order is not None:
        if sorted(int(i) for i in tiling.order) != list(range(len(starts))):
            raise InputError(f"order must be a permutation of the {len(starts)} K/V tiles")
        starts = [starts[int(i)] for i in tiling.order]
    check_traced(trace_at, (b, hq, t))
    tb, th, ti = trace_at if trace_at is not None else (-1, -1, -1)
    # One matmul per kv head: the g query heads that share it are stacked as rows of one tile
    # (G = B·Hkv batches of g·n rows), so BLAS sees a few large 3-D products, not many small ones.
    return Plan(
        q4.reshape(b, hk, g, t, d), k4.reshape(b * hk, s, d), v4.reshape(b * hk, s, dv), t,
        bq, bk, k0, k1, tuple(starts), band, user_mask, np.dtype(accum), opts.scale_for(d),
        (tb, th, ti), (tb, kv_head(th, hq, hk), th % g),
    )


def _q_tile(plan: Plan, i0: int, step, step_kw: dict, out5, lse5) -> tuple[list[Step], Counts]:
    """The inner loop over K/V tiles for the query rows i0:i0+bq (independent of the others):
    its rows of out5 and lse5 are written; the traced row's steps and the counts returned."""
    b, hk, g = plan.groups
    i1 = min(plan.t, i0 + plan.bq)
    n = i1 - i0
    acc = plan.accum
    d = plan.q5.shape[-1]
    qt = scale_q(plan.q5[..., i0:i1, :], plan.scale, acc).reshape(b * hk, g * n, d)
    tb, _, ti = plan.traced
    traced_here = i0 <= ti < i1
    at = (plan.at_row[0] * hk + plan.at_row[1], plan.at_row[2] * n + ti - i0)
    steps: list[Step] = []
    counts = Counts()

    def tiles():
        """(tile bounds, S or None where the mask hides the tile, V rows) in visiting order."""
        for j0 in plan.starts:
            bounds = ((j0 - plan.k0) // plan.bk, j0, min(plan.k1, j0 + plan.bk))
            j1 = bounds[2]
            um = None
            if plan.user_mask is not None:
                um = plan.user_mask[..., i0:i1, j0:j1].reshape(b * hk, g * n, j1 - j0)
            kind = tile_kind(plan.band, um, i0, i1, j0, j1)
            if kind == "skip":
                yield bounds, None, None
                continue
            vis = np.tile(plan.band.visible(i0, i1, j0, j1), (g, 1)) if kind == "partial" else None
            kT = plan.k3[:, j0:j1, :].astype(acc, copy=False).swapaxes(-1, -2)
            yield bounds, score_tile(qt, kT, vis, um), plan.v3[:, j0:j1, :].astype(acc, copy=False)

    def count(bounds, before: State, up: Update | None) -> None:
        if up is None:
            counts.skipped += 1
        else:
            counts.computed += 1
            counts.row_visits += n
            counts.rescales += int(np.count_nonzero(moved(before.m, up.state.m)))
        if traced_here:
            steps.append(_trace_step(bounds, before, up, at))

    state = start = initial_state(qt.shape[:-1], plan.v3.shape[-1], acc)
    for bounds, before, up, state in fold(start, tiles(), step, **step_kw):  # noqa: B007
        count(bounds, before, up)
    lse, o = finalize(state)
    out5[..., i0:i1, :] = o.reshape(b, hk, g, n, out5.shape[-1])
    lse5[..., i0:i1] = lse.reshape(b, hk, g, n)
    return steps, counts


def _trace_step(bounds: tuple, before: State, up: Update | None, at: tuple) -> Step:
    """The traced row's Step for one K/V tile (up None: the mask hid it, nothing changed)."""
    after = before if up is None else up.state
    o = after.o[at].astype(np.float64)
    return Step(
        *bounds, -np.inf if up is None else float(up.block_max[at]), float(before.m[at]),
        float(after.m[at]), 1.0 if up is None else float(up.alpha[at]), float(before.l[at]),
        float(after.l[at]), masked=up is None, o=o[:O_SHOWN], o_norm=_norm(o),
    )


def _norm(x: np.ndarray) -> float:
    """‖x‖ without overflow on the way (x near 1e300): when the plain norm overflows, again
    scaled by its largest magnitude first."""
    with np.errstate(over="ignore"):
        plain = float(np.linalg.norm(x))
        top = float(np.abs(x).max(initial=0.0))
        if math.isfinite(plain) or not math.isfinite(top):
            return plain
        return top * float(np.linalg.norm(x / top))  # beyond float64 itself: inf, shown so


def _assemble(plan: Plan, q, k, v, opts: ScoreOptions, masked_lse: str, out5, lse5,
              trace: list[Step], counts: Counts, tiles_total: int) -> Attention:
    """The Attention record: out and lse shaped like the inputs, masked rows' LSE by name."""
    b, hk, g = plan.groups
    hq, t = hk * g, plan.t
    empty = np.isneginf(lse5)
    if masked_lse != "neg-inf":
        lse5[empty] = MASKED_LSE[masked_lse]
    nd = np.asarray(q).ndim
    out = from_bhnd(out5.reshape(b, hq, t, out5.shape[-1]), nd, opts.layout)
    lse = from_bhnd(lse5.reshape(b, hq, t)[..., None], nd, opts.layout)[..., 0]
    tb, th, ti = plan.traced
    trace_out = None if tb < 0 else out5[tb, th // g, th % g, ti].copy()
    return Attention(
        out, lse, float(plan.scale), tuple(np.shape(q)), tuple(np.shape(k)),
        tuple(np.shape(v)), plan.bq, plan.bk, opts.causal, opts.causal_align, opts.window,
        masked_lse, counts.computed, counts.skipped, counts.rescales,
        int(np.count_nonzero(empty)), tuple(trace), plan.traced, trace_out, tiles_total,
        mask_about(None if opts.mask is None else np.asarray(opts.mask)), counts.row_visits,
    )


def masked_as(lse: np.ndarray, masked_lse: str) -> np.ndarray:
    """lse with its fully masked rows (-inf) set by the masked_lse convention, in lse's dtype."""
    return np.where(np.isneginf(lse), MASKED_LSE[masked_lse], lse).astype(lse.dtype)


__all__ = ["Attention", "Hooks", "ScoreOptions", "Tiling", "attention", "masked_as"]
