"""Tiled attention forward in FlashAttention-2's loop order, with a trace of some query rows.

plan → tile loop → assemble. plan.py checks the inputs once, fixes the tiles and walks them
(each tile's scores from masks.score_tile); `_q_tile` is the inner loop over K/V tiles for one
Q tile of block_q rows, folding each tile into (m, l, O) by core.fold with core.state's own
update step, vectorized over batch, heads and the tile's rows; `_assemble` divides by l once
and shapes the result. fast.py's fused_q_tiles is the same loop with the rescale step fused in
place, bit for bit the same, and what runs by default (Tiling(fused=False): the loop above).
Q tiles run side by side on a thread per core, the heaviest first. Tiles that the causal
mask, the window or the user's mask hide entirely are skipped and counted
(docs/numerics.md#tile-skipping). The N×N score matrix is never formed: memory is O(N·d) plus
one tile per thread.

Conventions: docs/numerics.md#scale, #causal-alignment, #masks, #gqa, #masked-rows.
Leaves out: files (io/), the reference (reference.py), split-KV (split.py), printing (present/).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

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

from .fast import fused_q_tiles
from .masks import mask_about
from .mods import about_mods
from .options import (
    MASKED_LSE,
    Hooks,
    ScoreOptions,
    Tiling,
    check_masked_lse,
    split_options,
)
from .packed import about, each_sequence, plan_packing, scatter_lse, scatter_rows, tile_pages
from .plan import (
    Counts,
    Plan,
    make_plan,
    marked,
    q_groups,
    q_rows,
    row_step,
    sink_step,
    tiles,
)
from .records import Attention, AttentionTrace, Counters, RunOptions, Shapes, Tiles
from .shapes import from_bhnd, lse_from_bhnd, traced_rows


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, opts: ScoreOptions | None = None,
              tiling: Tiling | None = None, hooks: Hooks | None = None,
              masked_lse: str = "neg-inf", trace_at: tuple | None = (0, 0, 0),
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
    if opts.packing.active:
        return _packed(q, k, v, opts, tiling, hooks, masked_lse, trace_at)
    plan = make_plan(q, k, v, opts, tiling, hooks, trace_at)
    b, hk, g = plan.groups
    out5 = np.zeros((b, hk, g, plan.t, plan.v3.shape[-1]), dtype=plan.accum)
    lse5 = np.zeros((b, hk, g, plan.t), dtype=plan.accum)
    if tiling.fused and _fusable(plan, tiling):
        groups = q_groups(plan)

        def run(group: tuple[int, ...]):
            return fused_q_tiles(plan, group, out5, lse5, threshold=tiling.threshold,
                                 p_round=hooks.p_round)
    else:
        groups = [(i0,) for i0 in plan.q_starts]
        step = rescale_step if tiling.form == "rescale" else merge_step
        step_kw = {"p_round": hooks.p_round, **({"threshold": tiling.threshold}
                                                if tiling.threshold else {})}

        def run(group: tuple[int, ...]):
            return _q_tile(plan, group[0], step, step_kw, out5, lse5)

    trace, counts = _run_q_tiles(plan, groups, run, progress)
    return _assemble(plan, q, k, v, opts, masked_lse, out5, lse5, trace, counts,
                     len(plan.q_starts) * len(plan.starts))


def _fusable(plan: Plan, tiling: Tiling) -> bool:
    """Whether fast.py's fused loop computes this run: the rescale form, and no float mask
    that widens the scores' dtype (S then changes dtype, which only the textbook loop does)."""
    mask = plan.user_mask
    widens = (mask is not None and mask.dtype.kind != "b"
              and np.result_type(plan.accum, mask.dtype) != plan.accum)
    return tiling.form == "rescale" and not widens


def _run_q_tiles(plan: Plan, groups: list[tuple[int, ...]], run: Callable,
                 progress) -> tuple[list[Step], Counts]:
    """run(group) for every group of Q tiles, heaviest first, a thread per core; the steps and
    counts. progress(done, total) counts Q tiles."""
    # Q tiles are independent (FA2 gives each its own thread block); numpy and BLAS release the
    # GIL, so a thread per core runs them side by side. Under a causal mask the Q tiles differ
    # in work, so the heaviest go first and the last to finish are the short ones.
    order = sorted(groups, key=lambda grp: sum(map(plan.tile_work, grp)), reverse=True)
    trace: list[Step] = []
    counts = Counts()
    done = 0
    workers = max(1, min(len(order), os.cpu_count() or 1))
    # One BLAS thread per worker: OpenBLAS's own threads would fight ours for the same cores.
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        for grp, (steps, c) in zip(order, pool.map(run, order), strict=True):
            trace += steps
            counts += c
            done += len(grp)
            if progress is not None:
                progress(done, len(plan.q_starts))
    return trace, counts


def _q_tile(plan: Plan, i0: int, step, step_kw: dict, out5, lse5) -> tuple[list[Step], Counts]:
    """The inner loop over K/V tiles for the query rows i0:i0+bq (independent of the others):
    its rows of out5 and lse5 are written; the traced row's steps and the counts returned."""
    b, hk, g = plan.groups
    qt, n, ats = q_rows(plan, i0)
    steps: list[Step] = []
    counts = Counts()

    def count(tile, before: State, up: Update | None) -> None:
        if up is None:
            counts.skipped += 1
        else:
            counts.computed += 1
            counts.partial += tile.kinds[0] == "partial"
            counts.row_visits += n
            counts.rescales += int(np.count_nonzero(moved(before.m, up.state.m)))
        for qi, at in ats:
            steps.append(replace(_trace_step(tile.bounds, before, up, at, qi),
                                 **marked(plan, tile.kinds[0])))

    walk = ((tile, None if s is None else s[0], v) for tile, s, v in tiles(plan, (i0,), qt[None]))
    state = start = initial_state(qt.shape[:-1], plan.v3.shape[-1], plan.accum)
    for tile, before, up, state in fold(start, walk, step, **step_kw):  # noqa: B007
        count(tile, before, up)
    if plan.sinks is not None:
        state, sink = sink_step(plan, state, n, ats)
        steps += sink
    lse, o = finalize(state)
    out5[..., i0:i0 + n, :] = o.reshape(b, hk, g, n, out5.shape[-1])
    lse5[..., i0:i0 + n] = lse.reshape(b, hk, g, n)
    return steps, counts


def _trace_step(bounds: tuple, before: State, up: Update | None, at: tuple, qi: int) -> Step:
    """Traced row qi's Step for one K/V tile (up None: the mask hid it, nothing changed)."""
    if up is None:
        m, l = before.m[at], before.l[at]
        return row_step(bounds, -np.inf, m, m, 1.0, l, l, before.o[at], masked=True, query=qi)
    return row_step(bounds, up.block_max[at], before.m[at], up.state.m[at], up.alpha[at],
                    before.l[at], up.state.l[at], up.state.o[at], query=qi)


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
    lse = lse_from_bhnd(lse5.reshape(b, hq, t), nd)  # FlashAttention's (B, H, t), any layout
    tb, th, _ = plan.traced
    outs = None if tb < 0 else out5[tb, th // g, th % g, list(plan.queries)].copy()
    return Attention(
        out=out, lse=lse, shapes=shapes_of(q, k, v),
        options=run_options(opts, q, masked_lse, softmax_scale=float(plan.scale)),
        tiles=Tiles(block_q=plan.bq, block_k=plan.bk, computed=counts.computed,
                    skipped=counts.skipped, partial=counts.partial, total=tiles_total),
        counters=Counters(rescales=counts.rescales, masked_rows=int(np.count_nonzero(empty)),
                          row_visits=counts.row_visits),
        trace=attention_trace(plan.traced, plan.queries, trace, outs),
    )


def attention_trace(at: tuple, queries: tuple, steps, outs) -> AttentionTrace:
    """An Attention record's trace: each traced row's steps (in the order of `queries`, picked
    out of `steps` by Step.query) and their outputs (outs: (rows, dv), or None)."""
    rows = tuple(tuple(s for s in steps if s.query == qi) for qi in queries)
    return AttentionTrace(at=tuple(at), queries=tuple(queries), rows=rows, outs=outs)


def shapes_of(q, k, v) -> Shapes:
    """The shapes of Q, K and V as given."""
    return Shapes(q=tuple(np.shape(q)), k=tuple(np.shape(k)), v=tuple(np.shape(v)))


def run_options(opts: ScoreOptions, q, masked_lse: str = "neg-inf", **changes) -> RunOptions:
    """What a run was asked (the scale, the masks, the kernels' inputs) as its record: one
    place for every loop, forward or backward, that builds one; changes override fields
    (softmax_scale: the options' scale for Q's head dim unless given)."""
    fields = dict(
        softmax_scale=float(opts.scale_for(np.shape(q)[-1])),
        causal=bool(opts.causal), causal_align=opts.causal_align, window=opts.window,
        masked_lse=masked_lse, mask=mask_about(None if opts.mask is None else
                                               np.asarray(opts.mask)),
        softcap=opts.softcap, alibi=opts.alibi_slopes is not None, sinks=opts.sinks is not None,
        mods=about_mods(opts),
    )
    return RunOptions(**{**fields, **changes})


def _packed(q, k, v, opts: ScoreOptions, tiling: Tiling, hooks: Hooks, masked_lse: str,
            trace_at, dense: Callable | None = None) -> Attention:
    """attention over a varlen or paged batch (packed.py): each sequence as its own dense
    problem, bottom-right causal against its own keys; O stored like Q, the LSE as
    FlashAttention returns it ((H, total_q), or (B, H, t) for batched Q); the traced row's
    tiles name the pages their keys came from. dense(q, k, v, opts=, masked_lse=, trace_at=)
    runs one sequence (a kernel preset's loop); attention itself by default."""
    if opts.mask is not None:
        raise InputError("a user mask has no meaning for a packed or paged batch (no kernel "
                         "takes both); use the sequences' lengths, causal or a window")
    packed = plan_packing(q, k, v, opts.packing)
    trace_at = traced_rows(trace_at)

    def run(seq, qb, kb, vb, tr):
        if dense is not None:
            return dense(qb, kb, vb, opts=opts.for_sequence(seq.index), masked_lse=masked_lse,
                         trace_at=tr)
        return attention(qb, kb, vb, opts=opts.for_sequence(seq.index), tiling=tiling,
                         hooks=hooks, masked_lse=masked_lse, trace_at=tr)

    parts = each_sequence(packed, run, q, k, v, trace_at=trace_at)
    first = parts[0] if parts else None
    dv = np.shape(v)[-1]
    dtype = first.out.dtype if first is not None else np.float32
    out = scatter_rows(packed, [p.out for p in parts], dtype, dv)
    lse = scatter_lse(packed, [p.lse for p in parts], dtype)
    traced = None if trace_at is None else parts[trace_at[0]]
    paged = () if traced is None else tuple(
        replace(st, pages=tile_pages(packed.seqs[trace_at[0]], st.start, st.stop))
        for tr in traced.trace.rows for st in tr)
    first_tiles = first.tiles if first else Tiles(block_q=0, block_k=0)
    return Attention(
        out=out, lse=lse, shapes=shapes_of(q, k, v),
        options=run_options(opts, q, masked_lse, causal_align="bottom-right",
                            batch=about(packed)),
        tiles=Tiles(block_q=first_tiles.block_q, block_k=first_tiles.block_k,
                    **summed([p.tiles for p in parts], "computed", "skipped", "partial",
                             "total")),
        counters=Counters(**summed([p.counters for p in parts], "rescales", "masked_rows",
                                   "row_visits")),
        trace=attention_trace((0, 0, 0) if trace_at is None else (*trace_at[:2], trace_at[2][0]),
                              () if traced is None else traced.trace.queries, paged,
                              None if traced is None else traced.trace.outs),
    )


def summed(records, *names: str) -> dict:
    """The fields `names` of `records` (Tiles, Counters of several runs) summed, by name."""
    return {name: sum(getattr(r, name) for r in records) for name in names}


def masked_as(lse: np.ndarray, masked_lse: str) -> np.ndarray:
    """lse with its fully masked rows (-inf) set by the masked_lse convention, in lse's dtype."""
    return np.where(np.isneginf(lse), MASKED_LSE[masked_lse], lse).astype(lse.dtype)


# The pieces a kernel preset's own tile loop (precision/emulate.py) shares with this one.
run_q_tiles = _run_q_tiles
assemble = _assemble
packed_attention = _packed

__all__ = ["Attention", "Hooks", "ScoreOptions", "Tiling", "assemble", "attention",
           "attention_trace", "masked_as", "packed_attention", "run_options", "run_q_tiles",
           "shapes_of", "summed"]
