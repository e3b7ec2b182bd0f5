"""The one-shot attention references: softmax(scale·Q·Kᵀ + mask)·V and its LSE, its gradients
in closed form, and the errors of a run against them.

Computed in float64 a chunk of query rows at a time (the full t × s matrix is never held),
with the same score_tile, masks and GQA head map as the tiled forward; under a causal mask or
a window, and no modifier, a chunk's scores span only the keys its rows see (key_span: half
the work of a causal run; the other keys' P is 0, so only the sums' rounding moves, within a
few float64 ulps). `_one_shot` is the
computation as written: core.reference's stable_softmax and logsumexp of each chunk, then P·V.
`_one_shot_fused`, what runs, is the same arithmetic on the same chunks with each exp done once
(the stable softmax, its sum and the LSE share it), in place in one buffer per thread, one
(chunk, head) at a time on a thread per core: the same bits (tests/flash/test_fast.py). With `rnd`
each op is rounded instead, which is how precision/model.py's plain same-dtype attention is made.
Leaves out: tiles (forward.py), the softmax oracles themselves (core/reference.py).

Example: out, lse = reference(q, k, v, ScoreOptions(causal=True))
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from osm_cli.core.reference import logsumexp, max_abs_diff, stable_softmax

from .forward import Attention
from .masks import (
    alibi_bias,
    check_score_range,
    make_band,
    scale_q,
    score_tile,
    with_mask_mod,
)
from .mods import MaskMod, ScoreMod, TileMod
from .options import MASKED_LSE, ScoreOptions, check_alibi_reach, split_options
from .packed import each_sequence, plan_packing, scatter_kv, scatter_lse, scatter_rows
from .plan import per_head
from .shapes import (
    bhnd_inputs,
    broadcast_mask,
    check_finite,
    from_bhnd,
    kv_head,
    like_bhnd,
    lse_from_bhnd,
)


def reference(q, k, v, opts: ScoreOptions | None = None, *, rnd: Callable | None = None,
              carry=np.float64, fused: bool = True, **options) -> tuple[np.ndarray, np.ndarray]:
    """The float64 one-shot (out, lse) for the same conventions as `attention`, shaped alike.

    opts (or its fields as keywords: causal=True, …) as attention's. With rnd and carry each
    op is rounded instead (precision/model.py's plain). Rows with every key masked give output
    0 and LSE -inf. fused=False runs `_one_shot` as written (the same numbers, slower).
    """
    if options or opts is None:
        opts = split_options(options, opts)[0]
    if opts.packing.active:
        packed = plan_packing(q, k, v, opts.packing)
        parts = each_sequence(packed, lambda seq, qb, kb, vb, _: reference(
            qb, kb, vb, opts.for_sequence(seq.index), rnd=rnd, carry=carry, fused=fused),
            q, k, v)
        dt = np.dtype(carry)
        return (scatter_rows(packed, [o for o, _ in parts], dt, np.shape(v)[-1]),
                scatter_lse(packed, [lse for _, lse in parts], dt))
    q4, k4, v4 = bhnd_inputs(q, k, v, opts.layout)
    b, hq, t, d = q4.shape
    hk, s = k4.shape[1], k4.shape[2]
    q_max, k_max = (check_finite(x, name) for x, name in ((q4, "Q"), (k4, "K")))
    check_score_range(q4, k4, opts.scale_for(d), carry, q_max, k_max)
    heads = kv_head(np.arange(hq), hq, hk)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    full_mask = None if opts.mask is None else broadcast_mask(np.asarray(opts.mask),
                                                              (b, hq, t, s))
    mods = Mods.of(opts, b, hq, t, s)
    # without modifiers (whose index arrays span every key) a chunk's scores span only the keys
    # its rows can see: a causal chunk computes half the scores of all s
    span = None if band is None or mods.active else (lambda i0, i1: key_span(band, i0, i1, s))
    visible = None if band is None else band.visible
    if fused and rnd is None and np.dtype(carry) == np.float64 and not mods.active:
        out, lse = _one_shot_fused(q4, k4, v4, heads, opts.scale_for(d), visible, full_mask,
                                   span)
    else:
        if hq != hk:  # GQA: each query head its kv head's K and V (no copy without GQA)
            k4, v4 = k4[:, heads], v4[:, heads]
        out, lse = _one_shot(q4, k4, v4, opts.scale_for(d), visible, full_mask, rnd=rnd,
                             carry=carry, mods=mods, span=span)
    nd = np.asarray(q).ndim
    return from_bhnd(out, nd, opts.layout), lse_from_bhnd(lse, nd)


@dataclass(frozen=True)
class Mods:
    """The kernels' score modifiers for a one-shot computation over (B, H, t, s) scores."""

    softcap: float | None = None
    slopes: np.ndarray | None = None  # ALiBi, (B, H)
    sinks: np.ndarray | None = None  # (B, H)
    offset: int = 0  # s − t
    score_mod: ScoreMod | None = None  # FlexAttention's (mods.py)
    mask_mod: MaskMod | None = None
    heads: tuple = (1, 1)  # (B, H)

    @classmethod
    def of(cls, opts: ScoreOptions, b: int, hq: int, t: int, s: int) -> Mods:
        check_alibi_reach(opts.alibi_slopes, t, s)
        slopes, sinks = (None if x is None else per_head(x, name, b, hq, hq, np.float64)
                         .reshape(b, hq) for x, name in ((opts.alibi_slopes, "alibi_slopes"),
                                                          (opts.sinks, "sinks")))
        return cls(opts.softcap, slopes, sinks, s - t, opts.score_mod, opts.mask_mod, (b, hq))

    @property
    def active(self) -> bool:
        return any(x is not None for x in (self.softcap, self.slopes, self.sinks,
                                           self.score_mod, self.mask_mod))

    def index(self, i0: int, i1: int, s: int) -> tuple[np.ndarray, ...]:
        """FlexAttention's (b, h, q_idx, kv_idx) for queries i0:i1 and every key."""
        b, h = self.heads
        return (np.arange(b).reshape(b, 1, 1, 1), np.arange(h).reshape(1, h, 1, 1),
                np.arange(i0, i1).reshape(1, 1, -1, 1), np.arange(s).reshape(1, 1, 1, -1))

    def tile_mod(self, i0: int, i1: int, s: int) -> TileMod | None:
        return None if self.score_mod is None else TileMod(self.score_mod,
                                                           self.index(i0, i1, s))

    def masked(self, mask: np.ndarray | None, i0: int, i1: int, s: int) -> np.ndarray | None:
        """The user's mask for queries i0:i1 (None: none) and-ed with the mask_mod's."""
        if self.mask_mod is None:
            return mask
        b, h = self.heads
        seen = np.broadcast_to(self.mask_mod(*self.index(i0, i1, s)), (b, h, i1 - i0, s))
        return with_mask_mod(mask, seen)

    def bias(self, i0: int, i1: int, s: int, dtype) -> np.ndarray | None:
        """ALiBi's bias for queries i0:i1 and every key: (B, H, i1 − i0, s)."""
        if self.slopes is None:
            return None
        rows = np.broadcast_to(self.slopes[..., None], (*self.slopes.shape, i1 - i0))
        return alibi_bias(rows, np.arange(i0, i1), 0, s, self.offset, dtype)

    def softmax(self, sc: np.ndarray, to) -> tuple[np.ndarray, np.ndarray]:
        """(P, LSE) of a chunk's scores; a sink is one more column, of value 0, dropped from
        P after the softmax (docs/numerics.md#sinks)."""
        if self.sinks is None:
            return stable_softmax(sc), logsumexp(sc)
        col = np.broadcast_to(to(self.sinks)[..., None, None], (*sc.shape[:-1], 1))
        ext = np.concatenate([sc, col.astype(sc.dtype)], axis=-1)
        return stable_softmax(ext)[..., :-1], logsumexp(ext)


SPAN_STEP = 256  # key_span's unit: spans of many sizes fragmented the heap (+34 MB a check)


def key_span(band, i0: int, i1: int, s: int) -> tuple[int, int]:
    """(j0, j1): the keys that some row of i0:i1 sees under the band (its rows' bounds rise
    with the row); all s keys where it bounds no side, or where the rows see none (their
    output 0 and LSE -inf come from all keys masked, as without a span)."""
    lo, _ = band.bounds(i0)  # ±inf for a side the band leaves open
    _, hi = band.bounds(i1 - 1)
    # whole steps of SPAN_STEP keys: a few sizes of temporaries, which the allocator reuses
    j0 = 0 if lo <= 0 else int(lo) // SPAN_STEP * SPAN_STEP
    j1 = s if hi >= s - 1 else min(s, -(-(int(hi) + 1) // SPAN_STEP) * SPAN_STEP)
    return (j0, j1) if j0 < j1 else (0, s)


def _one_shot(q, k, v, scale: float, visible=None, mask=None, rows_per_chunk: int | None = None,
              *, rnd: Callable | None = None, carry=np.float64, mods: Mods = Mods(),
              span=None) -> tuple[np.ndarray, np.ndarray]:
    """reference on (B, H, N, d) arrays whose K/V heads already match Q's (a broadcast view is
    fine). visible(i0, i1, j0, j1) gives the (i1 - i0, j1 - j0) band or None; mask is (B, H,
    t, s) or None; mods the softcap, ALiBi and sinks; span(i0, i1), where given (no mods),
    the keys j0:j1 that rows i0:i1 see (key_span), the others left out (their P is 0)."""
    carry = np.dtype(carry)
    to = rnd or (lambda x: np.asarray(x, dtype=carry))
    b, h, t, _ = q.shape
    s = k.shape[2]
    out = np.zeros((b, h, t, v.shape[-1]), dtype=carry)
    lse = np.full((b, h, t), -np.inf, dtype=carry)
    if mods.sinks is not None:  # a row that sees no key has only its sink: LSE = sink
        lse[...] = to(mods.sinks)[..., None]
    if s == 0:  # no keys at all: every row is fully masked
        return out, lse
    chunk = rows_per_chunk or _chunk_rows(b * h, s)
    kT = to(k).swapaxes(-1, -2)
    vc = to(v)
    # Without modifiers (whose indices span every head) each head of a chunk runs on its own:
    # the same per-head matmuls and per-row softmax, a head's temporaries instead of all heads'
    heads = [slice(0, h)] if mods.active else [slice(j, j + 1) for j in range(h)]
    for i0 in range(0, t, chunk):
        i1 = min(t, i0 + chunk)
        j0, j1 = (0, s) if span is None else span(i0, i1)
        vis = None if visible is None else visible(i0, i1, j0, j1)
        for hs in heads:
            sc = score_tile(scale_q(q[:, hs, i0:i1, :], scale, carry, to), kT[:, hs, :, j0:j1],
                            vis, mods.masked(None if mask is None else
                                             mask[:, hs, i0:i1, j0:j1], i0, i1, s),
                            to, softcap=mods.softcap, bias=mods.bias(i0, i1, s, carry),
                            mod=mods.tile_mod(i0, i1, s))
            p, lse[:, hs, i0:i1] = mods.softmax(sc, to)
            out[:, hs, i0:i1, :] = to(to(p) @ vc[:, hs, j0:j1])
    return out, lse


SOFTMAX_BLOCK = 1 << 17  # scores per pass of the fused softmax: 1 MiB of float64, in L2


def _chunk_rows(heads: int, s: int) -> int:
    """Query rows per chunk: about 2²² scores over all heads at once (32 MiB of float64)."""
    return max(1, (1 << 22) // max(1, heads * s))


def _one_shot_fused(q4, k4, v4, heads: np.ndarray, scale: float, visible=None,
                    mask=None, span=None) -> tuple[np.ndarray, np.ndarray]:
    """_one_shot in float64 without rounding, fused: the same chunks of rows and the same
    matmuls (BLAS's result can depend on its thread count, so they run as _one_shot's do),
    each head of a chunk on its own, S turned into P in one buffer with each exp done once,
    the rows of that work split over a thread per core.

    q4 (B, H, t, d), k4 and v4 (B, Hkv, s, ·), heads[h] the kv head of query head h."""
    b, h, t, _ = q4.shape
    s, dv = k4.shape[2], v4.shape[3]
    out = np.zeros((b, h, t, dv))
    lse = np.full((b, h, t), -np.inf)
    if s == 0:  # no keys at all: every row is fully masked
        return out, lse
    chunk = _chunk_rows(b * h, s)
    buf = np.empty(min(chunk, t) * s)  # a chunk's scores, (rows, keys of its span)
    workers = max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        # (chunk, head) pairs are independent: one head at a time, so that only that head's
        # K and V are held in float64 (as _one_shot holds them: row-major (s, ·) matrices)
        for i in range(b):
            for j in range(h):
                k = np.ascontiguousarray(k4[i, heads[j]], dtype=np.float64)
                v = np.ascontiguousarray(v4[i, heads[j]], dtype=np.float64)
                for i0 in range(0, t, chunk):
                    i1 = min(t, i0 + chunk)
                    j0, j1 = (0, s) if span is None else span(i0, i1)
                    cut = np.linspace(0, i1 - i0, workers + 1).astype(int)
                    sc = score_tile(scale_q(q4[i, j, i0:i1], scale, np.float64), k.T[:, j0:j1],
                                    None if visible is None else visible(i0, i1, j0, j1),
                                    None if mask is None else mask[i, j, i0:i1, j0:j1],
                                    out=buf[:(i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0))
                    parts = [sc[a:z] for a, z in zip(cut[:-1], cut[1:], strict=True)]
                    lse[i, j, i0:i1] = np.concatenate(list(pool.map(_softmax_rows, parts)))
                    out[i, j, i0:i1] = sc @ v[j0:j1]
    return out, lse


def _softmax_rows(sc: np.ndarray) -> np.ndarray:
    """sc overwritten by stable_softmax(sc), and logsumexp(sc) returned, with one exp: the
    maximum (fmax: the same, as sc has no NaN), the guard, the sum and the division of
    core.reference, in its order. A few rows at a time, so that the five passes over them
    find them in the core's cache (a row of 32768 keys is 256 KiB)."""
    lse = np.empty(sc.shape[0])
    step = max(1, SOFTMAX_BLOCK // max(1, sc.shape[1]))
    for r0 in range(0, sc.shape[0], step):
        part = sc[r0:r0 + step]
        m = np.fmax.reduce(part, axis=-1)
        ref = np.where(np.isneginf(m), 0.0, m)  # a row of only -inf subtracts 0: P = 0, LSE -inf
        with np.errstate(over="ignore", divide="ignore"):
            np.exp(np.subtract(part, ref[:, None], out=part), out=part)
            total = np.add.reduce(part, axis=-1)
            lse[r0:r0 + step] = ref + np.log(total)
        np.divide(part, np.where(total == 0, 1, total)[:, None], out=part)
    return lse


class Grads(tuple):
    """(dq, dk, dv), unpacked as a tuple, with the sinks' gradient as .dsink (None without)."""

    dsink: np.ndarray | None = None

    def __new__(cls, dq, dk, dv, dsink=None):
        self = super().__new__(cls, (dq, dk, dv))
        self.dsink = dsink
        return self


def reference_backward(q, k, v, do, opts: ScoreOptions | None = None, *,
                       rnd: Callable | None = None, carry=np.float64, **options) -> Grads:
    """The float64 gradients (dq, dk, dv) of reference()'s output for the upstream gradient do,
    in closed form, shaped like q, k, v (docs/numerics.md#backward); with sinks also dsink,
    one per query head (docs/numerics.md#sinks).

    A chunk of query rows at a time, as the forward reference: S and P = softmax(S) for the chunk,
    O = P·V, D = rowsum(dO ∘ O), dP = dO·Vᵀ, dS = P ∘ (dP − D), times 1 − tanh² through a
    softcap; then dQ = scale·dS·K for the chunk and dK += scale·dSᵀ·Q, dV += Pᵀ·dO, and
    dsink −= Σ exp(sink − LSE)·D. GQA: each kv head's dK and dV sum its query heads'.
    With rnd and carry each op is rounded instead, as autograd does through plain same-dtype
    attention (precision/model.py's plain_backward): P·V, dO·Vᵀ, Pᵀ·dO, the softmax derivative
    (whose D is then rowsum(dP ∘ P)), the softcap's chain, dS·K, dSᵀ·(Q·scale), the scale's
    product and GQA's sum.
    """
    if options or opts is None:
        opts = split_options(options, opts)[0]
    if opts.packing.active:
        return _packed_backward(q, k, v, do, opts, rnd, carry)
    q4, k4, v4 = bhnd_inputs(q, k, v, opts.layout)
    b, hq, t, d = q4.shape
    hk, s, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    carry = np.dtype(carry)
    to = rnd or (lambda x: np.asarray(x, dtype=carry))
    do4 = to(like_bhnd(do, "dO", (b, hq, t, dv), opts.layout))
    q_max, k_max = (check_finite(x, name) for x, name in ((q4, "Q"), (k4, "K")))
    check_finite(do4, "dO")
    scale = opts.scale_for(d)
    check_score_range(q4, k4, scale, carry, q_max, k_max)
    heads = kv_head(np.arange(hq), hq, hk)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    mask = None if opts.mask is None else broadcast_mask(np.asarray(opts.mask), (b, hq, t, s))
    mods = Mods.of(opts, b, hq, t, s)
    qs = scale_q(q4, scale, carry, rnd)
    kh, vh = to(k4[:, heads]), to(v4[:, heads])
    dq = np.zeros((b, hq, t, d), carry)
    dk, dvh = np.zeros((b, hq, s, d), carry), np.zeros((b, hq, s, dv), carry)
    dsink = np.zeros((b, hq), carry)
    chunk = _chunk_rows(b * hq, s)
    kT, vT = kh.swapaxes(-1, -2), vh.swapaxes(-1, -2)
    for i0 in range(0, t if s else 0, chunk):
        i1 = min(t, i0 + chunk)
        sc, dtanh = score_tile(qs[..., i0:i1, :], kT,
                               None if band is None else band.visible(i0, i1, 0, s),
                               mods.masked(None if mask is None else mask[..., i0:i1, :], i0,
                                           i1, s), rnd,
                               softcap=mods.softcap, bias=mods.bias(i0, i1, s, carry),
                               dtanh=True, mod=mods.tile_mod(i0, i1, s))
        p, lse = mods.softmax(sc, to)
        p = to(p)
        g = do4[..., i0:i1, :]
        dp = to(g @ vT)
        # D: rowsum(dO ∘ O) in closed form; autograd's softmax derivative takes rowsum(dP ∘ P)
        d_row = np.einsum("...d,...d->...", g, p @ vh) if rnd is None else (dp * p).sum(-1)
        ds = to(p * (dp - d_row[..., None]))
        if dtanh is not None and (rnd is None or mods.softcap is None):
            ds = to(ds * dtanh)  # the chain through the softcap's tanh and the score_mod
        elif dtanh is not None:  # through C·tanh(x / C) as autograd rounds: dx = dS·(1 − tanh²)
            c = carry.type(mods.softcap)
            ds = to(to(to(ds * c) * dtanh) / c)
        if mods.sinks is not None:
            with np.errstate(under="ignore"):
                dsink -= (np.exp(mods.sinks[..., None] - lse) * d_row).sum(-1)
        dq[..., i0:i1, :] = to(to(ds @ kh) * carry.type(scale))
        # dK = scale·dSᵀ·Q = dSᵀ·(Q·scale); the sum over chunks is one matmul's, rounded once
        dk += ds.swapaxes(-1, -2) @ qs[..., i0:i1, :]
        dvh += p.swapaxes(-1, -2) @ g
    dk, dvh = to(dk), to(dvh)
    group = (b, hk, hq // hk)
    dk = to(dk.reshape(*group, s, d).sum(axis=2))
    dvh = to(dvh.reshape(*group, s, dv).sum(axis=2))
    lay = opts.layout
    return Grads(from_bhnd(dq, np.ndim(q), lay), from_bhnd(dk, np.ndim(k), lay),
                 from_bhnd(dvh, np.ndim(v), lay),
                 None if mods.sinks is None else to(dsink.sum(axis=0)))


def _packed_backward(q, k, v, do, opts: ScoreOptions, rnd, carry) -> Grads:
    """reference_backward of a varlen or paged batch, one sequence at a time (packed.py)."""
    packed = plan_packing(q, k, v, opts.packing)
    parts = each_sequence(packed, lambda seq, qb, kb, vb, dob, _: reference_backward(
        qb, kb, vb, dob, opts.for_sequence(seq.index), rnd=rnd, carry=carry), q, k, v, do)
    dt = np.dtype(carry)
    dk, dv = (scatter_kv(packed, [p[i] for p in parts], x).astype(dt)
              for i, x in ((1, k), (2, v)))
    dsink = None if opts.sinks is None else sum(p.dsink for p in parts)
    return Grads(scatter_rows(packed, [p[0] for p in parts], dt, np.shape(q)[-1]), dk, dv,
                 dsink)


def errors(res: Attention, ref_out: np.ndarray, ref_lse: np.ndarray) -> dict:
    """Max abs and max relative (to max |ref|) error of O, max abs error of LSE.

    The reference's fully masked rows take the same LSE convention as the run.
    """
    diff = np.abs(res.out.astype(np.float64) - ref_out)
    scale = float(np.abs(ref_out).max()) if ref_out.size else 0.0
    ref_lse = np.where(np.isneginf(ref_lse), MASKED_LSE[res.options.masked_lse], ref_lse)
    return {
        "max_abs_err": float(diff.max()) if diff.size else 0.0,
        "max_rel_err": float(diff.max()) / scale if scale else 0.0,
        "max_lse_err": max_abs_diff(res.lse, ref_lse),
    }


__all__ = ["Grads", "Mods", "errors", "reference", "reference_backward"]
