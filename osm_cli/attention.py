"""Tiled attention forward in FlashAttention-2's loop order, with a trace of one query row.

Outer loop over Q tiles of block_q rows, inner loop over K/V tiles of block_k keys; each tile's
scores S = scale·Q·Kᵀ are folded into (m, l, O) by online.py's own update step, vectorized over
batch, heads and the rows of the tile, with one division by l at the end. Tiles that the causal
mask, the window or the user's mask hide entirely are skipped and counted. The N×N score matrix
is never formed: memory is O(N·d) plus one tile.

Conventions (NUMERICS §2-§3): scale 1/sqrt(d); causal bottom-right (FlashAttention ≥ 2.1) or
top-left (PyTorch is_causal); boolean masks True = attend, float masks added to the scores;
GQA query head h reads kv head h // (Hq / Hkv); fully masked rows give output 0 and an LSE of
-inf, +inf or 0 by name. Leaves out: files (io.py), the reference (reference.py), printing
(render.py), JSON (documents.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from .errors import InputError, ShapeError
from .online import FORMS, finalize, initial_state, kept, merge_step, moved, rescale_step
from .reference import apply_masks, max_abs_diff

MASKED_LSE = {"neg-inf": -np.inf, "pos-inf": np.inf, "zero": 0.0}
ALIGNS = ("bottom-right", "top-left")
LAYOUTS = ("bhnd", "bnhd")
O_SHOWN = 3  # components of O a trace step keeps


def default_scale(d: int) -> float:
    """The score scale when none is given: 1/sqrt(d), d the head dim (≥ 1, check_inputs)."""
    return 1.0 / math.sqrt(d)


def default_blocks(d: int) -> tuple[int, int]:
    """FA2's forward tiles on sm80: block_q 128; block_k 128 for d ≤ 64, else 64 (NUMERICS §5)."""
    return 128, 128 if d <= 64 else 64


# ---------------------------------------------------------------------------------------------
# Masks


@dataclass(frozen=True)
class Band:
    """Which keys each query sees: lo(i) ≤ j ≤ hi(i), with i + offset on the key axis.

    offset is s - t for bottom-right alignment, 0 for top-left. left/right None = unbounded.
    Causal is right = 0. Example: t=2, s=5, causal bottom-right keeps 11110 / 11111.
    """

    offset: int
    left: int | None = None
    right: int | None = None

    def bounds(self, i: np.ndarray | int) -> tuple:
        lo = -math.inf if self.left is None else i + self.offset - self.left
        hi = math.inf if self.right is None else i + self.offset + self.right
        return lo, hi

    def tile(self, i0: int, i1: int, j0: int, j1: int) -> str:
        """'skip', 'full' or 'partial' for the rows i0:i1 and keys j0:j1."""
        lo_first, hi_first = self.bounds(i0)
        lo_last, hi_last = self.bounds(i1 - 1)
        if hi_last < j0 or lo_first > j1 - 1:
            return "skip"
        if lo_last <= j0 and hi_first >= j1 - 1:
            return "full"
        return "partial"

    def visible(self, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        """Boolean (i1 - i0, j1 - j0) matrix: True where query i may attend key j."""
        i = np.arange(i0, i1)[:, None]
        j = np.arange(j0, j1)[None, :]
        lo, hi = self.bounds(i)
        return (j >= lo) & (j <= hi)


def make_band(t: int, s: int, causal: bool, align: str, window) -> Band | None:
    """The band of a causal mask and/or a (left, right) window, or None when all keys are seen."""
    if align not in ALIGNS:
        raise InputError(f"causal alignment must be one of {', '.join(ALIGNS)}, not {align!r}")
    if not causal and window is None:
        return None
    left, right = (None, None) if window is None else window
    left = None if left is not None and left < 0 else left
    right = None if right is not None and right < 0 else right
    if causal:
        right = 0 if right is None else min(right, 0)
    return Band(s - t if align == "bottom-right" else 0, left, right)


# ---------------------------------------------------------------------------------------------
# Shapes


def as_bhnd(x: np.ndarray, layout: str, name: str) -> np.ndarray:
    """View an (N, d), (H, N, d) or (B, H, N, d) array (or B, N, H, d) as (B, H, N, d)."""
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if x.ndim == 2:
        return x[None, None]
    if x.ndim == 3:
        return x[None] if layout == "bhnd" else x.transpose(1, 0, 2)[None]
    if x.ndim == 4:
        return x if layout == "bhnd" else x.transpose(0, 2, 1, 3)
    raise ShapeError(
        f"{name} has shape {tuple(x.shape)}; expected (N, d), (H, N, d) or (B, H, N, d)"
    )


def from_bhnd(x: np.ndarray, like_ndim: int, layout: str) -> np.ndarray:
    """The inverse of as_bhnd for an output whose input had like_ndim axes."""
    if layout == "bnhd" and like_ndim >= 3:
        x = x.transpose(0, 2, 1, *range(3, x.ndim))
    return x.reshape(x.shape[4 - like_ndim:]) if like_ndim < 4 else x


def check_inputs(q, k, v) -> None:
    """Shape and dtype rules of attention, as one clear error each."""
    for name, x in (("Q", q), ("K", k), ("V", v)):
        kind = x.dtype.kind
        if kind in "biuc" or kind == "O" or (kind not in "fV" and "float" not in x.dtype.name):
            raise InputError(
                f"{name} has dtype {x.dtype}; attention needs floating-point arrays"
            )
    b, hq, _, d = q.shape
    bk, hk, s, dk = k.shape
    bv, hv, sv, _ = v.shape
    if dk != d:
        raise ShapeError(f"Q and K head dims differ: Q has d = {d}, K has d = {dk}")
    if d == 0:
        raise ShapeError("Q and K have head dim d = 0; attention needs d ≥ 1")
    if sv != s:
        raise ShapeError(f"K and V sequence lengths differ: K has {s} keys, V has {sv}")
    if hk != hv:
        raise ShapeError(f"K and V head counts differ: K has {hk}, V has {hv}")
    if not (bk == bv == b):
        raise ShapeError(f"batch sizes differ: Q {b}, K {bk}, V {bv}")
    if hq % hk:
        raise ShapeError(
            f"Q has {hq} heads and K/V {hk}: for GQA/MQA the query heads must be a multiple "
            "of the kv heads"
        )


def bhnd_inputs(q, k, v, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K and V viewed as (B, H, N, d) (as_bhnd) and checked against each other."""
    q4, k4, v4 = (as_bhnd(np.asarray(x), layout, n) for x, n in ((q, "Q"), (k, "K"), (v, "V")))
    check_inputs(q4, k4, v4)
    return q4, k4, v4


def _broadcast_mask(mask: np.ndarray, shape: tuple) -> np.ndarray:
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ShapeError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, t, s) = {shape}"
        ) from None


# ---------------------------------------------------------------------------------------------
# The forward


@dataclass(frozen=True)
class TileStep:
    """One K/V tile as the traced query row saw it."""

    tile: int
    start: int
    stop: int
    skipped: bool
    tile_max: float
    m_prev: float
    m: float
    alpha: float
    l_prev: float
    l: float
    o: np.ndarray  # first O_SHOWN components of the unnormalised O after this tile
    o_norm: float

    @property
    def rescaled(self) -> bool:
        """The row's finite running max moved at this tile: its state was scaled by α."""
        return bool(moved(self.m_prev, self.m))

    @property
    def rescale_skipped(self) -> bool:
        """The tile max passed m but a lazy threshold kept m (online.kept)."""
        return bool(kept(self.tile_max, self.m_prev, self.m))


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
    trace: tuple[TileStep, ...] = ()
    traced: tuple = (0, 0, 0)
    trace_out: np.ndarray | None = None
    extra: dict = field(default_factory=dict)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
    layout: str = "bhnd",
    causal_align: str = "bottom-right",
    window: tuple | None = None,
    mask: np.ndarray | None = None,
    masked_lse: str = "neg-inf",
    form: str = "rescale",
    trace_at: tuple[int, int, int] | None = (0, 0, 0),
    accum=None,
    p_round: Callable | None = None,
    progress: Callable[[int, int], None] | None = None,
    keys: tuple[int, int] | None = None,
    order: np.ndarray | None = None,
    threshold: float = 0.0,
) -> Attention:
    """softmax(scale·Q·Kᵀ + mask)·V, tile by tile, with the online update of online.py.

    q (…, t, d), k (…, s, d), v (…, s, dv) in `layout` ("bhnd" PyTorch, "bnhd" FlashAttention).
    trace_at = (batch, head, query) picks the row whose tiles are recorded. accum is the dtype
    the state is held in (default float64 for float64 inputs, else float32); p_round, if given,
    rounds P before P·V (precision.py's kernel model). keys = (start, stop) limits the run to
    those keys (one split of a split-KV run; masks keep their global key indices); order is a
    permutation of the K/V tiles to visit; threshold is the lazy-rescale τ (online.rescale_step).

    Example: attention(q, k, v, causal=True).out
    """
    if form not in FORMS:
        raise InputError(f"form must be one of {FORMS}, not {form!r}")
    if masked_lse not in MASKED_LSE:
        raise InputError(f"masked LSE must be one of {', '.join(MASKED_LSE)}, not {masked_lse!r}")
    q4, k4, v4 = bhnd_inputs(q, k, v, layout)
    b, hq, t, d = q4.shape
    hk, s, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    g = hq // hk
    bq0, bk0 = default_blocks(d)
    bq = bq0 if block_q is None else block_q
    bk = bk0 if block_k is None else block_k
    if bq < 1 or bk < 1:
        raise InputError(f"block sizes must be positive (block_q {bq}, block_k {bk})")
    if scale is None:
        scale = default_scale(d)
    if accum is None:
        accum = np.float64 if np.float64 in (q4.dtype, k4.dtype, v4.dtype) else np.float32
    accum = np.dtype(accum)
    for name, x in (("Q", q4), ("K", k4), ("V", v4)):
        check_finite(x, name)
    band = make_band(t, s, causal, causal_align, window)
    user_mask = None
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype.kind not in "bf":
            raise InputError(f"mask has dtype {mask.dtype}; use booleans (True = attend) or floats")
        if mask.dtype.kind == "f" and (np.isnan(mask) | np.isposinf(mask)).any():
            raise InputError("mask contains NaN or +inf; a float mask is added to the scores "
                             "(use -inf to hide a key)")
        user_mask = _broadcast_mask(mask, (b, hq, t, s)).reshape(b, hk, g, t, s)

    # Query heads grouped under their kv head: q5 (B, Hkv, g, t, d).
    q5 = q4.reshape(b, hk, g, t, d)
    out5 = np.zeros((b, hk, g, t, dv), dtype=accum)
    lse5 = np.zeros((b, hk, g, t), dtype=accum)
    step = rescale_step if form == "rescale" else merge_step
    step_kw = {"p_round": p_round}
    if threshold:
        if form != "rescale":
            raise InputError("a rescale threshold applies to the rescale form only")
        step_kw["threshold"] = threshold
    k0, k1 = (0, s) if keys is None else keys
    if not 0 <= k0 <= k1 <= s:
        raise InputError(f"key range {k0}:{k1} is outside 0:{s}")
    starts = list(range(k0, k1, bk))
    if order is not None:
        if sorted(int(i) for i in order) != list(range(len(starts))):
            raise InputError(f"order must be a permutation of the {len(starts)} K/V tiles")
        starts = [starts[int(i)] for i in order]
    check_traced(trace_at, (b, hq, t))
    tb, th, ti = trace_at if trace_at is not None else (-1, -1, -1)
    n_q, n_k = -(-t // bq), len(starts)
    at_row = (tb, th // g, th % g)

    # One matmul per kv head: the g query heads that share it are stacked as rows of one tile
    # (G = B·Hkv batches of g·n rows), so BLAS sees a few large 3-D products, not many small ones.
    k3 = k4.reshape(b * hk, s, d)
    v3 = v4.reshape(b * hk, s, dv)

    def q_tile(i0: int):
        """The inner loop over K/V tiles for the query rows i0:i0+bq (independent of the others)."""
        i1 = min(t, i0 + bq)
        n = i1 - i0
        qt = (q5[..., i0:i1, :].astype(accum) * accum.type(scale)).reshape(b * hk, g * n, d)
        state = initial_state(qt.shape[:-1], dv, accum)
        traced_here = i0 <= ti < i1
        at = (at_row[0] * hk + at_row[1], at_row[2] * n + ti - i0)
        steps, counts = [], [0, 0, 0, 0]  # computed, skipped, rescales, row visits
        for j0 in starts:
            kj, j1 = (j0 - k0) // bk, min(k1, j0 + bk)
            um = None
            if user_mask is not None:
                um = user_mask[..., i0:i1, j0:j1].reshape(b * hk, g * n, j1 - j0)
            kind = tile_kind(band, um, i0, i1, j0, j1)
            if kind == "skip":
                counts[1] += 1
                if traced_here:
                    steps.append(_trace_step(kj, j0, j1, True, -np.inf, state, state, None, at))
                continue
            counts[0] += 1
            counts[3] += n
            st = qt @ k3[:, j0:j1, :].astype(accum, copy=False).swapaxes(-1, -2)
            vis = np.tile(band.visible(i0, i1, j0, j1), (g, 1)) if kind == "partial" else None
            st = apply_masks(st, vis, um)
            up = step(state, st, v3[:, j0:j1, :].astype(accum, copy=False), **step_kw)
            counts[2] += int(np.count_nonzero(moved(state.m, up.state.m)))
            if traced_here:
                steps.append(_trace_step(kj, j0, j1, False, float(st[at].max()), state,
                                         up.state, float(up.alpha[at]), at))
            state = up.state
        lse, o = finalize(state)
        out5[..., i0:i1, :] = o.reshape(b, hk, g, n, dv)
        lse5[..., i0:i1] = lse.reshape(b, hk, g, n)
        return steps, counts

    # Q tiles are independent (FA2 gives each its own thread block); numpy and BLAS release the
    # GIL, so a thread per core runs them side by side.
    trace: list[TileStep] = []
    computed = skipped = rescales = visits = 0
    workers = max(1, min(n_q, os.cpu_count() or 1))
    # One BLAS thread per worker: OpenBLAS's own threads would fight ours for the same cores.
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        for done, (steps, counts) in enumerate(pool.map(q_tile, range(0, t, bq)), 1):
            trace += steps
            computed, skipped, rescales, visits = (
                a + c for a, c in zip((computed, skipped, rescales, visits), counts, strict=True))
            if progress is not None:
                progress(done, n_q)
    empty = np.isneginf(lse5)
    if masked_lse != "neg-inf":
        lse5[empty] = MASKED_LSE[masked_lse]
    nd = np.asarray(q).ndim
    out = from_bhnd(out5.reshape(b, hq, t, dv), nd, layout)
    lse = from_bhnd(lse5.reshape(b, hq, t)[..., None], nd, layout)[..., 0]
    trace_out = None if trace_at is None else out5[tb, th // g, th % g, ti].copy()
    return Attention(
        out, lse, float(scale), tuple(np.shape(q)), tuple(np.shape(k)), tuple(np.shape(v)),
        bq, bk, causal, causal_align, window, masked_lse, computed, skipped, rescales,
        int(np.count_nonzero(empty)), tuple(trace), (tb, th, ti), trace_out,
        # row_visits: (query row, K/V tile) pairs computed, per head (FA1 Prop. 4's count)
        {"tiles_total": n_q * n_k, "mask": mask_about(mask), "row_visits": visits},
    )


def check_traced(trace_at: tuple | None, bht: tuple) -> None:
    """The traced (batch, head, query) must lie inside Q's (B, H, t); None traces nothing."""
    if trace_at is None:
        return
    (tb, th, ti), (b, hq, t) = trace_at, bht
    if not (0 <= tb < b and 0 <= th < hq and 0 <= ti < t):
        raise InputError(
            f"traced row (batch {tb}, head {th}, query {ti}) is outside Q's "
            f"(B, H, t) = ({b}, {hq}, {t})"
        )


def mask_about(mask: np.ndarray | None) -> str:
    """The user's mask in a few words: its kind and shape, or "none"."""
    if mask is None:
        return "none"
    kind = "bool, True = attend" if mask.dtype.kind == "b" else "float, added to the scores"
    return f"{kind}, shape {tuple(mask.shape)}"


def tile_kind(band: Band | None, um: np.ndarray | None, i0: int, i1: int, j0: int, j1: int) -> str:
    """'skip', 'full' or 'partial' for the tile of rows i0:i1 and keys j0:j1.

    Skipped when the causal band or window hides it, or the user's mask (um, that tile of it)
    hides it for every batch and head.
    """
    kind = "full" if band is None else band.tile(i0, i1, j0, j1)
    if kind != "skip" and um is not None and _all_masked(um):
        kind = "skip"
    return kind


def _all_masked(um: np.ndarray) -> bool:
    return not um.any() if um.dtype.kind == "b" else bool(np.isneginf(um).all())


def check_finite(x: np.ndarray, name: str, *, bhnd: bool = True) -> None:
    """InputError at x's first NaN or ±inf, by its index in x.

    bhnd (attention's inputs, viewed as (B, H, N, d)) calls it NaN or inf and says so; without
    it (precision.round_inputs, arrays as given) the message shows the value: nan, inf or -inf.
    """
    # Chunked so a memory-mapped input is scanned without being read into memory whole.
    flat = x.reshape(-1) if x.flags.c_contiguous else np.ravel(x)
    step = 1 << 22
    for start in range(0, flat.size, step):
        part = np.asarray(flat[start:start + step])
        if not np.isfinite(part).all():
            bad = start + int(np.flatnonzero(~np.isfinite(part))[0])
            idx = tuple(int(i) for i in np.unravel_index(bad, x.shape))
            value = float(part[bad - start])
            if not bhnd:
                raise InputError(f"{name} holds {value} at index {idx}; attention inputs must "
                                 "be finite")
            what = "NaN" if math.isnan(value) else "inf"
            raise InputError(f"{name} holds {what} at index {idx} (as (B, H, N, d)); "
                             "attention inputs must be finite")


def _trace_step(kj, j0, j1, skipped, tile_max, before, after, alpha, at) -> TileStep:
    o = after.o[at]
    return TileStep(
        kj, j0, j1, skipped, tile_max, float(before.m[at]), float(after.m[at]),
        1.0 if alpha is None else alpha, float(before.l[at]), float(after.l[at]),
        o[:O_SHOWN].astype(np.float64), float(np.linalg.norm(o.astype(np.float64))),
    )


def reference(q, k, v, *, causal=False, scale=None, layout="bhnd", causal_align="bottom-right",
              window=None, mask=None, rnd=None, carry=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """The float64 one-shot (out, lse) for the same conventions as `attention`, shaped alike.

    With rnd and carry (reference.attention's) each op is rounded instead: precision.plain.
    """
    from . import reference as ref

    q4, k4, v4 = bhnd_inputs(q, k, v, layout)
    b, hq, t, d = q4.shape
    hk, s = k4.shape[1], k4.shape[2]
    heads = np.arange(hq) // (hq // hk)  # GQA: query head h reads kv head h // (Hq / Hkv)
    k4, v4 = k4[:, heads], v4[:, heads]
    band = make_band(t, s, causal, causal_align, window)
    full_mask = None if mask is None else _broadcast_mask(np.asarray(mask), (b, hq, t, s))
    out, lse = ref.attention(
        q4, k4, v4, default_scale(d) if scale is None else scale,
        None if band is None else (lambda i0, i1: band.visible(i0, i1, 0, s)), full_mask,
        rnd=rnd, carry=carry,
    )
    nd = np.asarray(q).ndim
    return from_bhnd(out, nd, layout), from_bhnd(lse[..., None], nd, layout)[..., 0]


def errors(res: Attention, ref_out: np.ndarray, ref_lse: np.ndarray) -> dict:
    """Max abs and max relative (to max |ref|) error of O, max abs error of LSE.

    The reference's fully masked rows take the same LSE convention as the run.
    """
    diff = np.abs(res.out.astype(np.float64) - ref_out)
    scale = float(np.abs(ref_out).max()) if ref_out.size else 0.0
    ref_lse = np.where(np.isneginf(ref_lse), MASKED_LSE[res.masked_lse], ref_lse)
    return {
        "max_abs_err": float(diff.max()) if diff.size else 0.0,
        "max_rel_err": float(diff.max()) / scale if scale else 0.0,
        "max_lse_err": max_abs_diff(res.lse, ref_lse),
    }


def row_of(x: np.ndarray, traced: tuple, layout: str) -> np.ndarray:
    """The traced (batch, head, query) row of an output shaped like `attention`'s."""
    x4 = as_bhnd(x, layout, "output")
    b, h, i = traced
    return x4[b, h, i]


@dataclass(frozen=True)
class Split:
    """One split of a split-KV run, as the traced row saw it."""

    split: int
    start: int
    stop: int
    lse: float
    weight: float
    o: np.ndarray  # first O_SHOWN components of the normalised O_s


@dataclass(frozen=True)
class SplitRun:
    """Flash-Decoding: K/V cut into chunks, each run to (O_s, LSE_s), then merged."""

    out: np.ndarray
    lse: np.ndarray
    splits: tuple[Split, ...]
    max_abs_diff: float  # merged vs the unsplit run, over all of O
    max_lse_diff: float


def split_runs(q, k, v, ranges, *, reverse: bool = False, **kwargs) -> list[Attention]:
    """attention over each key range (start, stop) of `ranges`: the parts of a split-KV run.

    kwargs are attention's; each part's fully masked rows get LSE -inf whatever masked_lse says,
    as a merge needs them. reverse visits each part's K/V tiles last to first (FA2's kernel).
    """
    kwargs = {**kwargs, "masked_lse": "neg-inf"}
    bk = kwargs.get("block_k") or default_blocks(np.shape(q)[-1])[1]
    parts = []
    for a, b in ranges:
        extra = {"order": np.arange(-(-(b - a) // bk))[::-1]} if reverse else {}
        parts.append(attention(q, k, v, keys=(int(a), int(b)), **extra, **kwargs))
    return parts


def masked_as(lse: np.ndarray, masked_lse: str) -> np.ndarray:
    """lse with its fully masked rows (-inf) set by the masked_lse convention, in lse's dtype."""
    return np.where(np.isneginf(lse), MASKED_LSE[masked_lse], lse).astype(lse.dtype)


def split_kv(q, k, v, splits: int, unsplit: Attention, **kwargs) -> SplitRun:
    """Run attention on `splits` near-equal chunks of the keys and merge them (NUMERICS §4).

    kwargs are attention's (layout, masks, tiles, traced row); empty chunks get LSE -inf and
    weight 0. The result is compared with `unsplit`, the same run without splitting.
    """
    from .merge import merge_detail, split_edges

    if splits < 1:
        raise InputError(f"--splits must be at least 1, not {splits}")
    layout = kwargs.get("layout", "bhnd")
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    edges = split_edges(s, splits)
    parts = split_runs(q, k, v, zip(edges[:-1], edges[1:], strict=True), **kwargs)
    merged = merge_detail([p.out for p in parts], [p.lse for p in parts])
    lse = masked_as(merged.lse, unsplit.masked_lse)
    out = merged.out.astype(unsplit.out.dtype)
    traced = unsplit.traced
    rows = []
    for n, (p, a, b) in enumerate(zip(parts, edges[:-1], edges[1:], strict=True)):
        w = as_bhnd(merged.weights[n][..., None], layout, "weights")[..., 0]
        rows.append(Split(n, int(a), int(b), float(row_of(p.lse[..., None], traced, layout)[0]),
                          float(w[traced]), row_of(p.out, traced, layout)[:O_SHOWN].astype(float)))
    return SplitRun(out, lse, tuple(rows), max_abs_diff(out, unsplit.out),
                    max_abs_diff(lse, unsplit.lse))
