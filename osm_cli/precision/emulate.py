"""A kernel preset's own tile loop: its schedule and its float32 arithmetic, step by step
(docs/numerics.md#kernel-presets).

Where osm's readable loop (flash/forward.py) scales Q and takes exp(S − m), FlashAttention's
kernels keep S = Q·Kᵀ unscaled and fold the scale into exp2: with c = scale·log2(e) in float32,
P = exp2(fma(S, c, −m·c)), α = exp2((m_old − m)·c), l summed by each of the four threads of a
quad over its own columns (8j + 2·lane + {0, 1}) and the four partial sums added at the end,
O normalised by a reciprocal then a multiply, LSE in the kernel's own formula. P is rounded
to the input dtype before P·V. This module runs that, for every preset of presets.py,
vectorized over batch, heads and a Q tile's rows, with a trace of one row in natural-log units
(m·scale), the same Step records as flash/.

The matmuls (mma, presets.mma_for) are the tensor cores' float32 accumulation by default
("tensor-core"): products summed 16 at a time (the k of one MMA instruction), each term aligned
to the largest and truncated 2 bits below float32's precision, the accumulator truncated
toward zero (docs/numerics.md#tensor-cores), compiled (mma.py), bit-faithful; mma="blas", the
quick approximation, takes numpy's float32 BLAS, within an ulp of float32.

Leaves out: the presets themselves (presets.py), where inputs are rounded (dtypes.py), the
backward (backward.py), the verdict (rule.py).

Example: run_kernel(preset("fa2"), model("bf16"), q, k, v, causal=True).out
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.record import Step
from osm_cli.core.state import block_max as max_of
from osm_cli.errors import InputError, OsmError
from osm_cli.flash.forward import (
    Attention,
    Hooks,
    ScoreOptions,
    Tiling,
    assemble,
    packed_attention,
    run_q_tiles,
)
from osm_cli.flash.masks import apply_masks
from osm_cli.flash.mods import about_mods
from osm_cli.flash.options import split_options
from osm_cli.flash.plan import Counts, Plan, make_plan, marked, q_groups, row_step, walk

from .descale import Descale, check_reach
from .dtypes import DTYPES, bits
from .gpu_libm import recip as recip_rn
from .gpu_ops import (
    F32,
    LN2,
    LOG2E,
    Ops,
    exp2_emulated,
    fma,
    matmul,
    quad_sum,
    row_sums,
)
from .model import Model
from .presets import EIGHT, Preset, mma_for, refuse_scale
from .splitkv import split_kv_run


@dataclass(frozen=True)
class Arith:
    """The numbers every tile of one run shares (float32, as the kernel holds them): c =
    scale·log2e per kv group (G, 1, 1), the factor from S's units to natural-log units, the
    offset, v's descale (G, 1, 1) and how the two matmuls round."""

    c: np.ndarray
    nat: np.ndarray
    offset: float
    vscale: np.ndarray | None
    threshold: float  # lazy rescale, log2 units (0: eager)
    mma: str
    p_dtype: np.dtype
    ops: Ops
    emulated: Callable | None = None  # FA4 SM100: width -> the columns its polynomial computes


def run_kernel(kernel: Preset, m: Model, q, k, v, *, opts: ScoreOptions | None = None,
               tiling: Tiling | None = None, hooks: Hooks | None = None,
               masked_lse: str | None = None, trace_at=(0, 0, 0), progress=None,
               mma: str | None = None, descale: Descale | None = None,
               threshold: float | None = None, ops: Ops | None = None,
               sms: int | None = None, **options) -> Attention:
    """The kernel's forward on q, k, v (which hold m's dtype values already), out in the
    kernel's output dtype (bf16 for FP8 inputs) and LSE in float32.

    masked_lse defaults to the kernel's own; threshold (log2 units) to the preset's for the
    dtype; tiling's block_k, if given, replaces the kernel's (a teaching run); ops replaces
    the float32 exp2, tanh or reciprocal (an ablation: the GPU's, measured). sms sets the GPU's
    multiprocessors for FA2's split-KV heuristic (132, an H100/H200, by default).
    """
    opts, tiling, _ = split_options(options, opts, tiling, hooks)
    refuse_scale(kernel.name, opts.scale)
    mma = mma_for(kernel.name, mma)
    if opts.score_mod is not None and kernel.softcap != "score-mod":
        raise OsmError(f"kernel {kernel.name} models its kernel's fixed score options "
                       "(softcap, ALiBi); a score_mod runs in osm's own loop (kernel tiles) "
                       "or FA4's (kernel fa4)")
    if opts.score_mod is not None and opts.softcap is not None:
        raise OsmError(f"kernel {kernel.name} takes a softcap or a score_mod, not both: its "
                       "softcap is a score_mod (write both as one score_mod)")
    asked = opts
    if opts.score_mod is not None and opts.score_mod.cap is not None:
        # FA4 builds its softcap as this very score_mod: its own arithmetic (the GPU's tanh)
        opts = replace(opts, softcap=opts.score_mod.cap, score_mod=None)
    float_mask = opts.mask is not None and np.asarray(opts.mask).dtype.kind != "b"
    kernel.check(m.name, alibi=opts.alibi_slopes is not None, sinks=opts.sinks is not None,
                 float_mask=float_mask)
    if descale is not None and m.name not in EIGHT:
        raise OsmError("`q_descale`, `k_descale` and `v_descale` scale FP8 inputs; use them "
                       "with `dtype` e4m3 or e5m2")
    masked_lse = masked_lse or kernel.masked_lse
    tau = kernel.threshold(m.name) if threshold is None else float(threshold)
    if tau < 0 or not math.isfinite(tau):
        raise OsmError(f"the rescale threshold must be a finite number ≥ 0, not {tau}")
    arith = dict(kernel=kernel, model=m, mma=mma, descale=descale, tau=tau, ops=ops or Ops())

    def dense(qd, kd, vd, *, opts, masked_lse, trace_at, keys=None, block_k=None):
        return _dense(qd, kd, vd, opts, masked_lse, trace_at, progress, keys=keys,
                      block_k=block_k or tiling.block_k, **arith)

    if opts.packing.active:
        if descale is not None:
            raise OsmError("FP8 descale factors are per (batch, kv head) of a dense batch; "
                           "a varlen or paged batch takes none here")
        res = packed_attention(q, k, v, opts, tiling, Hooks(np.float32), masked_lse, trace_at,
                               dense=dense)
    elif kernel.split_kv and tiling.block_k is None:
        res = split_kv_run(q, k, v, opts, masked_lse, trace_at, dense, sms)
    else:
        res = dense(q, k, v, opts=opts, masked_lse=masked_lse, trace_at=trace_at)
    if asked is not opts:  # what was asked: the score_mod
        res = replace(res, options=replace(res.options, softcap=None, mods=about_mods(asked)))
    return _finish(m, res)


def _finish(m: Model, res: Attention) -> Attention:
    """O rounded to the kernel's output dtype: the input's, bf16 for FP8 (FA4)."""
    out_dt = DTYPES["bfloat16"] if m.name in EIGHT else m.dtype
    if bits(out_dt) >= bits(res.out.dtype):
        return res
    def cast(x):
        return None if x is None else x.astype(out_dt).astype(F32)

    out = res.out
    out[...] = out.astype(out_dt)  # in place: the run's own float32 array (a layer's is 64 MB)
    return replace(res, out=out, trace=replace(res.trace, outs=cast(res.trace.outs)))


def _dense(q, k, v, opts: ScoreOptions, masked_lse: str, trace_at, progress, *, kernel: Preset,
           model: Model, mma: str, descale: Descale | None, tau: float, ops: Ops,
           keys=None, block_k=None) -> Attention:
    """One dense batch (or one key range of it) through the kernel's loop."""
    d = np.shape(q)[-1]
    dv = np.shape(v)[-1]
    bk = block_k or kernel.block_k(d, dv, bool(opts.causal), opts.window is not None)
    tiling = Tiling(block_q=kernel.q_tile(d), block_k=bk, keys=keys, reverse=kernel.reverse)
    plan = make_plan(q, k, v, opts, tiling, Hooks(np.float32), trace_at)
    ar = _arith(kernel, model, plan, opts, descale, tau, mma, ops)
    b, hk, g = plan.groups
    out5 = np.zeros((b, hk, g, plan.t, dv), dtype=F32)
    lse5 = np.zeros((b, hk, g, plan.t), dtype=F32)

    def run(group):
        return _q_tile(plan, ar, kernel, group, out5, lse5)

    trace, counts = run_q_tiles(plan, q_groups(plan, ragged=True), run, progress)
    res = assemble(plan, q, k, v, opts, masked_lse, out5, lse5, trace, counts,
                   len(plan.q_starts) * len(plan.starts))
    return replace(res, options=replace(res.options, kernel=kernel.name))


def _arith(kernel: Preset, m: Model, plan: Plan, opts: ScoreOptions, descale, tau: float,
           mma: str, ops: Ops) -> Arith:
    """c = scale·log2e in float32 (per kv group with FP8 descales), and S's units."""
    b, hk, g = plan.groups
    scale = F32(plan.scale)
    if kernel.softcap == "score-mod" and (opts.softcap is not None
                                          or opts.score_mod is not None):
        c, nat = F32(LOG2E), 1.0  # FA4: the scale is applied before a score_mod, S natural
    elif opts.softcap is not None:
        c, nat = F32(F32(opts.softcap) * F32(LOG2E)), float(opts.softcap)  # FA2: S = tanh(·)
    else:
        c, nat = F32(scale * F32(LOG2E)), float(scale)
    c = np.full((b * hk, 1, 1), c, dtype=F32)
    nat = np.full((b * hk, 1, 1), nat)
    vscale = None
    if descale is not None:
        qd, kd, vd = (_per_kv(x, name, b, hk) for x, name in (
            (descale.q, "q_descale"), (descale.k, "k_descale"), (descale.v, "v_descale")))
        with np.errstate(over="ignore", under="ignore"):
            c = (c * qd * kd).astype(F32)
        check_reach(c, vd, plan.q5.shape[-1], m.dtype)
        nat = nat * qd * kd
        vscale = vd
    p_dtype = m.dtype
    emulated = None
    if kernel.exp == "exp2-emu":
        causal = bool(opts.causal or opts.window is not None)
        emulated = kernel.emulated_columns(plan.q5.shape[-1], causal, m.name in EIGHT)
    return Arith(c, nat, float(kernel.max_offset(m.name)), vscale, tau, mma, p_dtype, ops,
                 emulated)


def _per_kv(x, name: str, b: int, hk: int) -> np.ndarray:
    """A descale factor of shape (B, Hkv) as (B·Hkv, 1, 1) float32; a ShapeError otherwise."""
    x = np.asarray(x, dtype=F32)
    if x.shape != (b, hk):
        raise InputError(f"{name} has shape {tuple(x.shape)}; it must be (B, Hkv) = ({b}, {hk})")
    if not (np.isfinite(x).all() and (x > 0).all()):
        raise InputError(f"{name} must hold finite positive factors")
    return x.reshape(b * hk, 1, 1)


def _scores(plan: Plan, ar: Arith, kernel: Preset, qt: np.ndarray, i0: int, n: int,
            j0: int, j1: int, softcap: float | None) -> np.ndarray:
    """S for one tile in the kernel's units: Q·Kᵀ, softcapped and biased as the kernel does,
    or scaled and through the score_mod (FA4); the masks are applied by the caller."""
    kT = np.swapaxes(plan.k3[:, j0:j1, :], -1, -2).astype(F32, copy=False)
    s = matmul(qt, kT, ar.mma)
    if softcap is not None:
        cap = F32(softcap)
        with np.errstate(over="ignore"):
            if kernel.softcap == "score-mod":  # FA4: C·tanh((S·scale) / C)
                x = ((s * F32(plan.scale)).astype(F32) / cap).astype(F32)
                s = (cap * ar.ops.tanh_(x)).astype(F32)
            else:  # FA2: tanh(S·(scale / C)), in units of C
                x = (s * F32(F32(plan.scale) / cap)).astype(F32)
                s = ar.ops.tanh_(x)
    if plan.slopes is not None:
        s = s + _alibi(plan, ar, i0, n, j0, j1, softcap)
    if plan.score_mod is not None:  # FA4 (apply_score_mod_inner): fn(S·scale) in float32
        with np.errstate(over="ignore"):
            s = (s * F32(plan.scale)).astype(F32)
        s = plan.tile_mod(i0, i0 + n, j0, j1)(s).astype(F32, copy=False)
    return s


def _alibi(plan: Plan, ar: Arith, i0: int, n: int, j0: int, j1: int,
           softcap: float | None) -> np.ndarray:
    """FA2's ALiBi in S's units (slope / scale): −slope·|i + s − t − j|, or under a causal
    mask +slope·j (a per-row constant dropped: O the same, LSE not; docs/numerics.md#alibi)."""
    g = plan.q5.shape[2]
    unit = F32(softcap) if softcap is not None else F32(plan.scale)
    slope = (np.repeat(plan.slopes, n, axis=-1).astype(F32) / unit).astype(F32)[..., None]
    cols = np.arange(j0, j1, dtype=F32)[None, :]
    if plan.band is not None and plan.band.right == 0 and plan.band.left is None:
        return (slope * cols).astype(F32)
    rows = np.tile(np.arange(i0, i0 + n), g)[:, None]
    dist = np.abs(rows + plan.offset - np.arange(j0, j1)[None, :]).astype(F32)
    return (-(slope * dist)).astype(F32)


class _Row:
    """A traced row: its query, its place in a tile stack (plan.rows_in), the Q tile of the
    stack it is in (`mine`), and its steps."""

    def __init__(self, query: int, at: tuple, mine: int):
        self.query, self.at, self.mine = query, at, mine
        self.steps: list[Step] = []


def _q_tile(plan: Plan, ar: Arith, kernel: Preset, group: tuple[int, ...], out5, lse5):
    """The kernel's loop over K/V tiles for the query rows of the Q tiles `group`
    (plan.q_groups, ragged: consecutive, one stack of rows) of every head. Each row is its own
    softmax: a K/V tile that the band hides from one tile of the stack but not from another is
    computed for the whole stack, and the rows that see none of its keys keep their state
    exactly (α = 1, P = 0), as if skipped; the counters and the traced row's steps are the
    kernel's own, tile by tile (plan.walk's kinds). With mma="tensor-core" every element's
    sums are its own, so the bits do not depend on the stack; BLAS's float32 sums may (within
    an ulp)."""
    b, hk, g = plan.groups
    i0 = group[0]
    i1 = plan.q_end(group[-1])
    n = i1 - i0
    d, dv = plan.q5.shape[-1], plan.v3.shape[-1]
    qt = plan.q5[..., i0:i1, :].reshape(b * hk, g * n, d).astype(F32, copy=False)
    rows = qt.shape[:-1]
    m = np.full(rows, -np.inf, dtype=F32)
    lanes = np.zeros((*rows, 4), dtype=F32)  # the row sum of each thread of a quad
    o = np.zeros((*rows, dv), dtype=F32)
    traced = [_Row(qi, at, (qi - i0) // plan.bq) for qi, at in plan.rows_in(i0, i1)]
    counts = Counts()
    off = F32(ar.offset)
    for tile in walk(plan, group):
        bounds, j0, j1, kind = tile.bounds, tile.j0, tile.j1, tile.kind
        seen = [k != "skip" for k in tile.kinds]
        counts.skipped += len(group) - sum(seen)
        for row in traced:
            if not seen[row.mine]:  # the kernel skips this tile for the row's own Q tile
                row.steps.append(_masked_step(bounds, m, lanes, o, ar, row))
        if kind == "skip":
            continue
        s = _scores(plan, ar, kernel, qt, i0, n, j0, j1, plan.softcap)
        vis = plan.visible(i0, i1, j0, j1) if kind == "partial" else None
        s = apply_masks(s, vis, plan.mask_tile(i0, i1, j0, j1, partial=kind == "partial"))
        block_max = max_of(s, nan_free=True)  # S holds no NaN: the max, quicker
        m_new = np.maximum(m, block_max)
        safe = np.where(np.isneginf(m_new), F32(0), m_new)
        with np.errstate(invalid="ignore", over="ignore"):
            arg = ((m - safe).astype(F32) * ar.c[..., 0]).astype(F32)
        if ar.threshold > 0:  # FA4 SM100: keep m while the new max stays within τ (log2)
            keep = np.isfinite(m) & (arg >= F32(-ar.threshold))
            m_new = np.where(keep, m, m_new)
            safe = np.where(keep, m, safe)
            arg = np.where(keep, F32(0), arg)
        alpha = ar.ops.exp2(arg)
        p = _probabilities(kernel, ar, s, safe, off)
        lanes = row_sums(kernel.row_sum, (lanes * alpha[..., None]).astype(F32, copy=False), p)
        tops = [_top(p, ar, row.at) for row in traced]  # before P is rounded (bf16: in place)
        o = matmul(_round_p(p, ar.p_dtype), plan.v3[:, j0:j1, :].astype(F32, copy=False), ar.mma,
                np.multiply(o, alpha[..., None], out=o))
        counts.computed += sum(seen)
        counts.partial += tile.kinds.count("partial")
        counts.row_visits += sum(plan.q_end(a) - a for a, saw in zip(group, seen, strict=True)
                                 if saw)
        counts.rescales += int(np.count_nonzero((m_new != m) & np.isfinite(m)))
        for row, top in zip(traced, tops, strict=True):
            if seen[row.mine]:
                row.steps.append(replace(_step(bounds, block_max, m, m_new, alpha, lanes, o, ar,
                                               row), **top, **marked(plan, tile.kinds[row.mine])))
        m = m_new
    lse, o = _finalize(plan, ar, kernel, m, lanes, o, n, traced)
    out5[..., i0:i1, :] = o.reshape(b, hk, g, n, dv)
    lse5[..., i0:i1] = lse.reshape(b, hk, g, n)
    return [st for row in traced for st in row.steps], counts


def _probabilities(kernel: Preset, ar: Arith, s: np.ndarray, safe: np.ndarray,
                   off) -> np.ndarray:
    """P of one tile: exp2(fma(S, c, offset − m·c)) (FA2, FA4; SM100 computes some columns by
    its polynomial), or "exp": exp(S·scale − m·scale) in two roundings, as osm's own loop."""
    c = ar.c[..., 0]
    with np.errstate(invalid="ignore", over="ignore"):
        if kernel.exp == "exp":
            nat = ar.nat[..., 0].astype(F32)
            return np.exp((s * nat[..., None]).astype(F32) - (safe * nat)[..., None]).astype(F32)
        if kernel.exp == "exp2-unfused":  # UNFUSE_FMA: fl(S·c) − fl(m·c)
            x = (s * ar.c).astype(F32)
            x -= (safe * c).astype(F32)[..., None]  # (FA2 takes no FP8 offset)
        else:
            x = _fma_tile(s, ar.c, (off - (safe * c).astype(F32))[..., None])
        p = ar.ops.exp2(x)
    if ar.emulated is not None:
        cols = np.flatnonzero(ar.emulated(s.shape[-1]))  # indices: quicker than a mask
        if cols.size:
            vals = exp2_emulated(np.take(x, cols, axis=-1))
            view = _runs_view(p, cols)
            if view is None:
                p[..., cols] = vals
            else:  # the same columns as a strided view: a plain copy, not a scatter
                view[...] = vals.reshape(view.shape)
    return p


def _runs_view(p: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
    """p's columns `cols` as a view when they are runs of one length at a fixed stride (SM100's
    pattern for most head dims: 4 columns every 16), else None."""
    starts = cols[np.concatenate([[True], np.diff(cols) != 1])]
    length = cols.size // starts.size
    step = int(starts[1] - starts[0]) if starts.size > 1 else length
    regular = (cols.size == starts.size * length and step >= length
               and np.array_equal(starts, starts[0] + step * np.arange(starts.size))
               and np.array_equal(cols, (starts[:, None] + np.arange(length)).ravel())
               and starts[0] + step * starts.size <= p.shape[-1])
    if not regular:
        return None
    c0 = int(starts[0])
    block = p[..., c0:c0 + step * starts.size]
    return block.reshape(*p.shape[:-1], starts.size, step)[..., :length]


def _fma_tile(s: np.ndarray, c: np.ndarray, add: np.ndarray) -> np.ndarray:
    """gpu_ops.fma(s, c, add) with one float64 array, updated in place (the same bits)."""
    x64 = s.astype(np.float64)
    np.multiply(x64, c, out=x64)
    np.add(x64, add, out=x64)
    return x64.astype(F32)


def _round_p(p: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """P converted to the input dtype for the P·V MMA (FP8: saturating at the largest finite,
    as cvt.rn.satfinite does)."""
    if bits(dtype) == 8:
        p = np.minimum(p, F32(_f8max(dtype)))
    if dtype == BF16:  # round to nearest even on the top 16 bits: ml_dtypes' cast, 3× quicker
        u = p.view(np.uint32)  # p is this tile's own P, free to overwrite (no NaN in P)
        u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
        u &= np.uint32(0xFFFF0000)
        return p
    return p.astype(dtype).astype(F32)


BF16 = DTYPES["bfloat16"]


def _f8max(dtype: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).max)


def _finalize(plan: Plan, ar: Arith, kernel: Preset, m, lanes, o, n: int, traced: list):
    """l from the quad, the sink joined (FA4), O · (1/l) (· v_descale), and the LSE."""
    l = quad_sum(lanes)
    c = ar.c[..., 0]
    off = F32(ar.offset)
    ms = (np.where(np.isneginf(m), F32(0), m) * c).astype(F32)
    if plan.sinks is not None:
        sink = plan.sink_rows(n).astype(F32)
        l_prev = l
        empty = np.isneginf(m)
        ms = np.where(empty, (sink * F32(LOG2E)).astype(F32), ms)
        with np.errstate(over="ignore"):
            l = (l + ar.ops.exp2(fma(sink, F32(LOG2E), off - ms))).astype(F32)
        for row in traced:
            at = row.at
            nat = float(ar.nat[at[0], 0, 0])
            sk = float(sink[at])
            mm = float(m[at]) * nat if np.isfinite(m[at]) else -math.inf
            row.steps.append(row_step((-1, 0, 0), sk, mm, mm if not empty[at] else sk, 1.0,
                                      _show_l(float(l_prev[at]), ar), _show_l(float(l[at]), ar),
                                      o[at] / F32(2.0 ** ar.offset), sink=True,
                                      query=row.query))
    bad = (l == 0) | np.isnan(l)
    safe_l = np.where(bad, F32(1), l)
    if kernel.normalise in ("reciprocal", "reciprocal-rn"):
        scale = ar.ops.recip(safe_l) if kernel.normalise == "reciprocal" else recip_rn(safe_l)
        if ar.vscale is not None:
            scale = (scale * ar.vscale[..., 0]).astype(F32)
        o = (o * scale[..., None]).astype(F32)
    else:
        o = (o / safe_l[..., None]).astype(F32)
        if ar.vscale is not None:
            o = (o * ar.vscale).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kernel.lse == "log2":
            lse = (((ms + (ar.ops.log2(safe_l) - off)).astype(F32)) * F32(LN2))
        else:  # FA2: m·scale + __logf(l), one fma
            unit = ar.nat[..., 0].astype(F32)
            mm = np.where(np.isneginf(m), F32(0), m)
            ln_l = (ar.ops.log2(safe_l) * F32(LN2)).astype(F32)  # __logf: lg2.approx · ln 2
            lse = fma(mm, unit, ln_l)
    lse = np.where(bad, F32(-np.inf), lse).astype(F32)
    return lse, o


def _show_l(l: float, ar: Arith) -> float:
    """l as the trace shows it: the FP8 offset 2^offset divided back out."""
    return l / 2.0 ** ar.offset


def _top(p: np.ndarray, ar: Arith, at) -> dict:
    """FP8: a traced row's largest P of the tile and how many saturate (P above the dtype's
    largest finite: flash-attention #2716), as Step fields; {} for 16-bit P."""
    if bits(ar.p_dtype) != 8:
        return {}
    row = p[at]
    return {"p_max": float(row.max(initial=0.0)),
            "saturated": int(np.count_nonzero(row > F32(_f8max(ar.p_dtype))))}


def _step(bounds, block_max, m, m_new, alpha, lanes, o, ar: Arith, row: _Row) -> Step:
    """A traced row's Step for one tile, in natural-log units (m·scale)."""
    at = row.at
    nat = float(ar.nat[at[0], 0, 0])
    l_now = float(quad_sum(lanes[at][None])[0])
    l_prev = row.steps[-1].l if row.steps else 0.0

    def natural(x) -> float:
        return float(x) * nat if np.isfinite(x) else float(x)

    return row_step(bounds, natural(block_max[at]), natural(m[at]), natural(m_new[at]),
                    float(alpha[at]), l_prev, _show_l(l_now, ar), o[at] / F32(2.0 ** ar.offset),
                    query=row.query)


def _masked_step(bounds, m, lanes, o, ar: Arith, row: _Row) -> Step:
    at = row.at
    nat = float(ar.nat[at[0], 0, 0])
    mm = float(m[at]) * nat if np.isfinite(m[at]) else float(m[at])
    l = _show_l(float(quad_sum(lanes[at][None])[0]), ar)
    return row_step(bounds, -np.inf, mm, mm, 1.0, l, l, o[at] / F32(2.0 ** ar.offset),
                    masked=True, query=row.query)


__all__ = ["Descale", "Ops", "run_kernel"]
