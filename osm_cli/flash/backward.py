"""Tiled attention backward in FlashAttention-2's loop order (FA2 §3.1, Algorithm 2), with the
traces of one key row and some query rows.

plan → tile loop → assemble, as the forward. The forward's plan (plan.py: inputs grouped by
kv head, the tiles, the masks) is reused; D = rowsum(dO ∘ O) is computed once per query row;
then the outer loop walks the K/V tiles (one thread block each on a GPU), the inner loop the Q
tiles, and each (Q tile, K/V tile) pair's scores come from masks.score_tile, exactly as the
forward's, and go through core.backward.backward_step. dK_j and dV_j are accumulated per K/V
tile, dQ_i across all of them (a GPU does this with atomic adds); the score scale is applied
once at the end. Tiles the mask hides are skipped and counted as in the forward
(docs/numerics.md#backward).
Memory is O(N·d) plus one tile per worker: no N×N matrix.

Leaves out: the forward (forward.py), rounding models (precision/), the closed-form reference
(reference.py), printing (present/).

Example: attention_backward(q, k, v, do, causal=True).dq
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from osm_cli.core.backward import backward_step, delta, lse_for_p
from osm_cli.core.record import GradStep
from osm_cli.errors import InputError, ShapeError

from .forward import attention, run_options, shapes_of, summed
from .gradtrace import key_detail, key_rows, query_detail
from .masks import scale_q, score_tile
from .options import Hooks, ScoreOptions, Tiling, split_options
from .packed import (
    about,
    each_sequence,
    lse_parts,
    plan_packing,
    scatter_kv,
    scatter_lse,
    scatter_rows,
)
from .plan import Plan, _norm, make_plan, marked, walk
from .records import Backward, BackwardTrace, Counters, Tiles
from .shapes import (
    check_finite,
    from_bhnd,
    kv_head,
    like_bhnd,
    lse_bht,
    lse_from_bhnd,
    traced_rows,
)


@dataclass(frozen=True)
class Saved:
    """The backward's own inputs, grouped like the plan's q5: (G, g, t, …) per kv head."""

    q: np.ndarray  # Q in the state's dtype, unscaled (dK = scale·dSᵀ·Q)
    qs: np.ndarray  # Q·scale, as the forward's scores start from it
    do: np.ndarray
    lse: np.ndarray  # through lse_for_p: +inf on fully masked rows
    d: np.ndarray  # D = rowsum(dO ∘ O)


def attention_backward(
    q, k, v, do, *, out=None, lse=None, opts: ScoreOptions | None = None,
    tiling: Tiling | None = None, hooks: Hooks | None = None,
    trace_at: tuple | None = (0, 0, 0), trace_key: int = 0,
    progress: Callable[[int, int], None] | None = None, **options,
) -> Backward:
    """dQ, dK, dV of softmax(scale·Q·Kᵀ + mask)·V for the upstream gradient dO, tile by tile.

    q, k, v, do as attention's inputs and output (do shaped like O); opts, tiling, hooks (or
    their fields as keywords) as attention's. out and lse are the forward's saved O and LSE
    (a kernel's, in any masked-row convention: −inf, +inf or 0); without them osm runs its own
    forward first. trace_at = (batch, query head, query) picks the traced query row (the query
    may be a sequence of them, traced side by side), trace_key the key row traced in that
    query head's kv head (None: no traces); progress(done, total) is called as K/V tiles
    finish.

    Example: attention_backward(q, k, v, do, causal=True).dq
    """
    opts, tiling, hooks = split_options(options, opts, tiling, hooks)
    if (out is None) != (lse is None):
        raise InputError("give the forward's O and LSE together (out= and lse=), or neither: "
                         "the backward recomputes P from the LSE and D from O")
    if opts.packing.active:
        return _packed(q, k, v, do, out, lse, opts, tiling, hooks, trace_at, trace_key)
    own = out is None
    if own:
        fwd = attention(q, k, v, opts=opts, tiling=tiling, hooks=hooks, trace_at=None)
        out, lse = fwd.out, fwd.lse
    plan = make_plan(q, k, v, opts, tiling, hooks, trace_at)
    if plan.groups[0] == 0:  # docs/inputs.md#zero-size-inputs
        raise ShapeError("Q, K and V have a batch of 0: the backward needs at least one sequence")
    s = plan.k3.shape[1]
    if trace_at is not None and s and not 0 <= trace_key < s:
        raise InputError(f"traced key {trace_key} is outside K's {s} keys")
    if hooks.kernel is not None and (plan.slopes is not None or opts.score_mod is not None
                                     or (opts.mask is not None
                                         and np.asarray(opts.mask).dtype.kind != "b")):
        raise InputError("a kernel's backward arithmetic takes no ALiBi, score_mod or float "
                         "mask; osm's own backward (no kernel hook) does")
    saved, lse4 = _saved(plan, q, do, out, lse, opts.layout, hooks.kernel)
    grads = _loop(plan, saved, hooks, trace_key if trace_at is not None else -1, progress)
    return _assemble(plan, q, k, v, out, lse, own, opts, hooks, saved, lse4, grads, trace_key)


def _saved(plan: Plan, q, do, out, lse, layout: str, kernel=None) -> tuple[Saved, np.ndarray]:
    """Check dO, O and the LSE against the plan's shapes and group them like q5 (D in the
    kernel's order when a kernel hook is given)."""
    b, hk, g = plan.groups
    hq, t, dv = hk * g, plan.t, plan.v3.shape[-1]
    acc = plan.accum
    shape = (b, hq, t, dv)
    do4 = like_bhnd(do, "dO", shape, layout)
    o4 = like_bhnd(out, "O", shape, layout)
    check_finite(do4, "dO")
    check_finite(o4, "O")
    lse4 = lse_bht(lse, "LSE", (b, hq, t), np.ndim(q), layout)
    if np.isnan(lse4).any():
        raise InputError("LSE holds NaN; a kernel's LSE is finite, or ±inf (or 0) on a row "
                         "whose keys are all masked")
    d = delta(do4, o4, acc) if kernel is None else kernel.delta_of(do4, o4)
    q_acc = plan.q5.astype(acc, copy=False)
    d_q = q_acc.shape[-1]
    group = (b * hk, g, t)
    return Saved(
        q_acc.reshape(*group, d_q), scale_q(q_acc, plan.scale, acc).reshape(*group, d_q),
        do4.astype(acc, copy=False).reshape(*group, dv),
        lse_for_p(lse4.astype(acc)).reshape(group), d.reshape(group),
    ), lse4


@dataclass
class _Grads:
    """The loop's results, per kv group: dQ unscaled, dK and dV per query head."""

    dq: np.ndarray  # (G, g, t, d)
    dk: np.ndarray  # (G, g, s, d)
    dv: np.ndarray  # (G, g, s, dv)
    tiles: list  # plan.walk over every Q tile: each K/V tile's kind for each of them
    key_trace: list
    query_trace: list


def _loop(plan: Plan, saved: Saved, hooks: Hooks, key: int, progress) -> _Grads:
    """Run the K/V tiles (outer) and Q tiles (inner) for every kv group, the groups split among
    threads (each group's arithmetic is the same whichever thread runs it)."""
    b, hk, g = plan.groups
    G, t, d, dv, s = b * hk, plan.t, plan.q5.shape[-1], plan.v3.shape[-1], plan.k3.shape[1]
    acc = plan.accum
    grads = _Grads(np.zeros((G, g, t, d), acc), np.zeros((G, g, s, d), acc),
                   np.zeros((G, g, s, dv), acc), list(walk(plan, tuple(plan.q_starts))), [], [])
    workers = max(1, min(G, os.cpu_count() or 1))
    cuts = np.linspace(0, G, workers + 1).astype(int)
    total = len(plan.starts) * workers
    lock, done = threading.Lock(), [0]

    def tick():
        if progress is not None:
            with lock:
                done[0] += 1
                progress(done[0], total)

    def run(w: int):
        _groups(plan, saved, hooks, grads, int(cuts[w]), int(cuts[w + 1]), key, tick)

    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, range(workers)))
    return grads


def _groups(plan: Plan, sv: Saved, hooks: Hooks, grads: _Grads, g0: int, g1: int, key: int,
            tick) -> None:
    """The tile loop for kv groups g0:g1: every K/V tile, and inside it every Q tile."""
    b, hk, g = plan.groups
    acc = plan.accum
    th = plan.traced[1]
    at = plan.traced_group - g0  # the traced kv group, within g0:g1
    traced_here = plan.traced_group >= 0 and 0 <= at < g1 - g0
    step_kw = {"heads": g, "p_round": hooks.p_round, "ds_round": hooks.ds_round}
    kern = hooks.kernel
    for tile in grads.tiles:
        j0, j1 = tile.j0, tile.j1
        kj = plan.k3[g0:g1, j0:j1].astype(acc, copy=False)
        vj = plan.v3[g0:g1, j0:j1].astype(acc, copy=False)
        kT, vT = kj.swapaxes(-1, -2), None
        dk_j = grads.dk[g0:g1, :, j0:j1]
        dv_j = grads.dv[g0:g1, :, j0:j1]
        if kern is not None:  # contiguous once a K/V tile (the kernel's matmuls take copies)
            kj, vj, kT = (np.ascontiguousarray(x) for x in (kj, vj, kT))
            vT = np.ascontiguousarray(vj.swapaxes(-1, -2))
            dk_j, dv_j = dk_j.copy(), dv_j.copy()  # the accumulators, written back after
        keyed = traced_here and j0 <= key < j1
        q_tiles = list(zip(plan.q_starts, tile.kinds, strict=True))
        for i0, kind in (q_tiles[::-1] if kern is not None and kern.reverse_q else q_tiles):
            i1 = plan.q_end(i0)
            n = i1 - i0
            here = plan.rows_in(i0, i1) if traced_here else []  # the traced query rows
            if kind == "skip":
                if keyed:
                    grads.key_trace.append(GradStep(i0 // plan.bq, i0, i1, True, 0.0, 0.0,
                                                    *_dkv_norms(plan, dk_j, dv_j, at, key - j0)))
                for qi, _ in here:
                    grads.query_trace.append(GradStep(
                        *tile.bounds, True, 0.0, 0.0,
                        dq_norm=_norm(plan.scale * grads.dq[g0 + at, th % g, qi]), query=qi))
                continue
            rows = (g1 - g0, g * n)
            kv_before = key_rows(plan, dk_j, dv_j, at, key - j0) if keyed else None
            dq_before = {qi: plan.scale * grads.dq[g0 + at, th % g, qi] for qi, _ in here}
            vis = plan.visible(i0, i1, j0, j1) if kind == "partial" else None
            um = plan.mask_tile(i0, i1, j0, j1, g0, g1, partial=kind == "partial")
            if kern is not None:  # the kernel's own arithmetic, its accumulators chained
                up = kern.step(
                    sv.q[g0:g1, :, i0:i1].reshape(*rows, -1), kj, vj,
                    sv.do[g0:g1, :, i0:i1].reshape(*rows, -1),
                    sv.lse[g0:g1, :, i0:i1].reshape(rows), sv.d[g0:g1, :, i0:i1].reshape(rows),
                    scale=plan.scale, heads=g, dk=dk_j, dv=dv_j, visible=vis, mask=um,
                    softcap=plan.softcap, p_round=hooks.p_round, ds_round=hooks.ds_round,
                    kt=kT, vt=vT)
                dk_j, dv_j = up.dk, up.dv
            else:
                up = _osm_step(plan, sv, (g0, g1, i0, i1, j0, j1), rows, kT, kj, vj, vis, um,
                               step_kw)
                dk_j += up.dk
                dv_j += up.dv
            grads.dq[g0:g1, :, i0:i1] += up.dq.reshape(g1 - g0, g, n, -1)
            if keyed:
                c = key - j0
                detail = key_detail(plan, up, sv.d[g0 + at, th % g, i0:i1], at, c, th % g, n,
                                    kv_before, key_rows(plan, dk_j, dv_j, at, c))
                grads.key_trace.append(GradStep(
                    i0 // plan.bq, i0, i1, False, float(up.p[at, :, c].max()),
                    float(up.ds[at, :, c].sum()), *_dkv_norms(plan, dk_j, dv_j, at, c),
                    detail=detail, **marked(plan, kind)))
            for qi, (_, r) in here:
                dq_after = plan.scale * grads.dq[g0 + at, th % g, qi]
                detail = query_detail(plan, up, float(sv.d[g0 + at, th % g, qi]), r, at,
                                      dq_before[qi], dq_after, j1 - j0)
                grads.query_trace.append(GradStep(
                    *tile.bounds, False, float(up.p[at, r].max()),
                    float(up.ds[at, r].sum()), dq_norm=_norm(dq_after), query=qi,
                    detail=detail, **marked(plan, kind)))
        if kern is not None:
            grads.dk[g0:g1, :, j0:j1] = dk_j
            grads.dv[g0:g1, :, j0:j1] = dv_j
        tick()


def _osm_step(plan: Plan, sv: Saved, at: tuple, rows, kT, kj, vj, vis, um, step_kw):
    """osm's own tile update (core.backward.backward_step) on score_tile's scores, for kv
    groups g0:g1, query rows i0:i1 and keys j0:j1 (at)."""
    g0, g1, i0, i1, j0, j1 = at
    sc, dtanh = score_tile(sv.qs[g0:g1, :, i0:i1].reshape(*rows, -1), kT, vis, um,
                           softcap=plan.softcap, bias=plan.bias(i0, i1, j0, j1, g0, g1),
                           dtanh=True, mod=plan.tile_mod(i0, i1, j0, j1, g0, g1))
    return backward_step(
        sc, sv.lse[g0:g1, :, i0:i1].reshape(rows), sv.d[g0:g1, :, i0:i1].reshape(rows),
        sv.q[g0:g1, :, i0:i1].reshape(*rows, -1), kj, vj,
        sv.do[g0:g1, :, i0:i1].reshape(*rows, -1), ds_factor=dtanh, **step_kw)


def _dkv_norms(plan: Plan, dk_j, dv_j, at: int, c: int) -> tuple[float, float]:
    """‖dK‖ and ‖dV‖ of key c of the tile, in the traced kv group, summed over its heads."""
    return (_norm(plan.scale * dk_j[at, :, c].sum(axis=0)), _norm(dv_j[at, :, c].sum(axis=0)))


def _assemble(plan: Plan, q, k, v, out, lse, own: bool, opts: ScoreOptions, hooks: Hooks,
              saved: Saved, lse4, grads: _Grads, key: int) -> Backward:
    """Scale, sum each kv head's query heads, shape the gradients like q, k, v."""
    b, hk, g = plan.groups
    hq, t, s = hk * g, plan.t, plan.k3.shape[1]
    scale = plan.scale
    acc = plan.accum
    d, dv_dim = grads.dq.shape[-1], grads.dv.shape[-1]
    dq = (grads.dq * acc.type(scale)).reshape(b, hq, t, d)
    if hooks.kernel is not None and hooks.kernel.group_fp32:  # the group summed, then scaled
        dk = (hooks.kernel.group_sum(grads.dk) * acc.type(scale)).reshape(b, hk, s, d)
        dv = hooks.kernel.group_sum(grads.dv).reshape(b, hk, s, dv_dim)
    else:
        dk_h = grads.dk * acc.type(scale)
        dv_h = grads.dv
        if hooks.head_round is not None and g > 1:
            dk_h, dv_h = hooks.head_round(dk_h), hooks.head_round(dv_h)
        dk = dk_h.sum(axis=1).reshape(b, hk, s, d)
        dv = dv_h.sum(axis=1).reshape(b, hk, s, dv_dim)
    nq, nk, nv = np.ndim(q), np.ndim(k), np.ndim(v)
    lay = opts.layout
    d_out = lse_from_bhnd(saved.d.reshape(b, hq, t), nq)  # shaped like attention's LSE
    kinds = [kd for tile in grads.tiles for kd in tile.kinds]
    skipped = kinds.count("skip")
    th = plan.traced[1]
    dsink = None
    if plan.sinks is not None:  # dsink = −Σ_rows exp(sink − LSE)·D, LSE holding the sink
        with np.errstate(under="ignore"):
            p_sink = np.exp(plan.sinks[..., None] - saved.lse)  # (G, g, t); +inf LSE gives 0
        dsink = -(p_sink * saved.d).sum(axis=-1).reshape(b, hq).sum(axis=0)
    return Backward(
        dq=from_bhnd(dq, nq, lay), dk=from_bhnd(dk, nk, lay), dv=from_bhnd(dv, nv, lay),
        delta=d_out, out=np.asarray(out), lse=np.asarray(lse), own_forward=own, dsink=dsink,
        shapes=shapes_of(q, k, v), options=run_options(opts, q, softmax_scale=float(scale)),
        tiles=Tiles(block_q=plan.bq, block_k=plan.bk, computed=len(kinds) - skipped,
                    skipped=skipped, partial=kinds.count("partial"), total=len(kinds)),
        counters=Counters(masked_rows=int(np.count_nonzero(~np.isfinite(lse4)))),
        trace=backward_trace(plan.traced, plan.queries, grads.query_trace, key=key,
                             kv_head=int(kv_head(max(th, 0), hq, hk)), group=g,
                             key_steps=tuple(grads.key_trace)),
    )


def backward_trace(at: tuple, queries: tuple, steps, **key) -> BackwardTrace:
    """A Backward record's trace: each traced query row's steps (in the order of `queries`,
    picked out of `steps` by GradStep.query); key: the traced key's fields (key, kv_head,
    group, key_steps)."""
    rows = tuple(tuple(s for s in steps if s.query == qi) for qi in queries)
    return BackwardTrace(at=tuple(at), queries=tuple(queries), rows=rows, **key)


def _packed(q, k, v, do, out, lse, opts: ScoreOptions, tiling: Tiling, hooks: Hooks,
            trace_at, trace_key: int) -> Backward:
    """attention_backward over a varlen or paged batch (packed.py), one sequence at a time:
    dQ stored like Q, dK and dV like K and V (a key read by several sequences, a shared page,
    gets the sum), D like FlashAttention's LSE. trace_at is (sequence, head, query)."""
    if opts.mask is not None:
        raise InputError("a user mask has no meaning for a packed or paged batch (no kernel "
                         "takes both); use the sequences' lengths, causal or a window")
    packed = plan_packing(q, k, v, opts.packing)
    trace_at = traced_rows(trace_at)
    own = out is None
    if own:
        fwd = attention(q, k, v, opts=opts, tiling=tiling, hooks=hooks, trace_at=None)
        out, lse = fwd.out, fwd.lse
    lses = lse_parts(packed, lse)

    def run(seq, qb, kb, vb, dob, ob, tr):
        return attention_backward(qb, kb, vb, dob, out=ob, lse=lses[seq.index],
                                  opts=opts.for_sequence(seq.index), tiling=tiling, hooks=hooks,
                                  trace_at=tr, trace_key=trace_key if tr else 0)

    parts = each_sequence(packed, run, q, k, v, do, out, trace_at=trace_at)
    traced = None if trace_at is None else parts[trace_at[0]]
    dt = parts[0].dq.dtype if parts else np.float32
    dq = scatter_rows(packed, [p.dq for p in parts], dt, np.shape(q)[-1])
    dk, dv = (scatter_kv(packed, [getattr(p, n) for p in parts], x).astype(dt)
              for n, x in (("dk", k), ("dv", v)))
    dsink = None if opts.sinks is None else sum(p.dsink for p in parts)
    ref = traced or (parts[0] if parts else None)
    tiles = ref.tiles if ref else Tiles(block_q=0, block_k=0)
    tr = None if traced is None else traced.trace
    return Backward(
        dq=dq, dk=dk, dv=dv, delta=scatter_lse(packed, [p.delta for p in parts], dt),
        out=np.asarray(out), lse=np.asarray(lse), own_forward=own, dsink=dsink,
        shapes=shapes_of(q, k, v),
        options=run_options(opts, q, causal_align="bottom-right", mask="none", mods="",
                            batch=about(packed)),
        tiles=Tiles(block_q=tiles.block_q, block_k=tiles.block_k,
                    **summed([p.tiles for p in parts], "computed", "skipped", "total")),
        counters=Counters(**summed([p.counters for p in parts], "masked_rows")),
        trace=backward_trace(
            (0, 0, 0) if trace_at is None else (*trace_at[:2], trace_at[2][0]),
            () if tr is None else tr.queries,
            () if tr is None else [s for row in tr.rows for s in row], key=trace_key,
            kv_head=ref.trace.kv_head if ref else 0, group=ref.trace.group if ref else 1,
            key_steps=() if tr is None else tr.key_steps),
    )


__all__ = ["Backward", "attention_backward", "backward_trace"]
