"""Masks and scores: which keys each query sees, and S = scale·Q·Kᵀ with the masks applied.

`score_tile` is the one place scores are made: the tiled forward, the one-shot reference,
plain attention and the tile maps all call it. The order is the kernels': Q·scale, then
S = (Q·scale)·Kᵀ, then the causal band / window and the user's mask
(docs/numerics.md#causal-alignment, #masks). A `Band` decides per tile whether the forward
computes it fully, partly or skips it (docs/numerics.md#tile-skipping).
Leaves out: the loop over tiles (forward.py), shapes (shapes.py).

Example: make_band(2, 5, True, "bottom-right", None).visible(0, 2, 0, 5) -> 11110 / 11111
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from osm_cli.errors import InputError

from .options import ALIGNS


def scale_q(q: np.ndarray, scale: float, dtype, to: Callable | None = None) -> np.ndarray:
    """Q·scale in `dtype`; `to`, if given, rounds Q and the product (precision/model.py plain).

    Example: scale_q(np.ones((1, 4)), 0.5, np.float32) -> [[0.5, 0.5, 0.5, 0.5]] (float32)
    """
    dtype = np.dtype(dtype)
    if to is None:
        return np.asarray(q, dtype=dtype) * dtype.type(scale)
    return to(to(q) * dtype.type(scale))


def check_score_range(q4: np.ndarray, k4: np.ndarray, scale: float, dtype, q_max: float,
                      k_max: float) -> None:
    """InputError when a score scale·q·k, or a partial sum of it, can overflow `dtype`, the
    dtype the scores are computed in (so no run writes NaN from finite inputs).

    q4 (B, H, t, d) and k4 (B, Hkv, s, d); q_max, k_max their largest magnitudes. Every partial
    sum of q·k, in any order, is at most Σ_i |q_i·k_i| ≤ d·max|q|·max|k|: below the dtype's
    largest finite value (the usual case) nothing more is done. Above it, the largest
    |scale|·Σ_i |q_i·k_i| is computed in float64 from |Q| and |K| divided by their largest
    magnitudes (terms that cancel in q·k still overflow on the way).
    Example: Q = K = 1e20 in float32 (d = 4, scale 0.5) -> "scores overflow float32: …2e+40"
    """
    big = math.log(float(np.finfo(dtype).max))
    with np.errstate(over="ignore"):  # Q·scale is formed in `dtype`, with keys or without
        fits = bool(np.isfinite(np.dtype(dtype).type(scale)))
    if not fits:
        raise InputError(
            f"the scale {scale:.8g} does not fit in {np.dtype(dtype).name} (largest finite "
            f"{math.exp(big):.3g}), the dtype the scores are computed in"
        )
    if not (q_max and k_max and scale and q4.size and k4.size):
        return
    logs = math.log(abs(scale)) + math.log(q_max) + math.log(k_max)
    if logs + math.log(q4.shape[-1]) < big:
        return
    b, hq, t, d = q4.shape
    hk = k4.shape[1]
    unit_k = np.abs(np.asarray(k4, dtype=np.float64)) / k_max
    top = 0.0
    for h in range(hq):
        kT = unit_k[:, h // (hq // hk)].swapaxes(-1, -2)
        for i0 in range(0, t, 1024):
            part = np.abs(np.asarray(q4[:, h, i0:i0 + 1024], dtype=np.float64)) / q_max
            top = max(top, float((part @ kT).max(initial=0.0)))
    if top and logs + math.log(top) >= big:
        raise InputError(
            f"scores overflow {np.dtype(dtype).name}: |scale|·Σ|q_i·k_i| reaches "
            f"≈ {_sci(logs + math.log(top))} (largest finite {math.exp(big):.3g}); scale Q or K "
            "down" + ("" if np.dtype(dtype) == np.float64 else ", or compute in float64")
        )


def _sci(ln_x: float) -> str:
    """e^ln_x in scientific notation, even beyond float64's range. Example: _sci(92.1) -> 1e+40"""
    exp10 = ln_x / math.log(10)
    whole = math.floor(exp10)
    return f"{10 ** (exp10 - whole):.2g}e+{whole:02d}"


def score_tile(qs: np.ndarray, kT: np.ndarray, visible: np.ndarray | None = None,
               mask: np.ndarray | None = None, to: Callable | None = None, *,
               out: np.ndarray | None = None, softcap: float | None = None,
               bias: np.ndarray | None = None, dtanh: bool = False, mod=None):
    """S = (Q·scale)·Kᵀ for one tile of rows (qs from scale_q, kT = Kᵀ), then the kernels'
    order (FA2's): softcap·tanh(S / softcap), the ALiBi bias added, the masks: visible (True =
    seen) from the band, mask the user's (docs/numerics.md#softcap, #alibi, #masks). `to`
    rounds each op's result (plain same-dtype attention).

    out, if given, is where S is written and masked in place (the fused forward reuses one
    buffer); the same numbers as without it, so a float mask must not widen S's dtype there.
    dtanh=True returns (S, 1 − tanh²) for the backward's chain rule through the softcap
    (None without one). mod, a mods.TileMod, is the user's score_mod on this tile, applied
    after the bias and before the masks (where FlexAttention applies it: to the scaled
    score); with dtanh=True its derivative joins the factor.
    """
    if out is not None and to is None:
        s = np.matmul(qs, kT, out=out)
    else:
        s = qs @ kT if to is None else to(qs @ kT)
    grad = None
    if softcap is not None:
        s, grad = _softcap(s, softcap, to, inplace=out is not None and to is None)
    if bias is not None:
        if out is not None and to is None and np.result_type(s, bias) == s.dtype:
            np.add(s, bias, out=s)
        else:
            s = s + bias if to is None else to(s + to(bias))
    if mod is not None:
        if dtanh:
            slope = mod.slope(s)
            grad = slope if grad is None else grad * slope
        s = mod(s) if to is None else to(mod(s))
    s = apply_masks(s, visible, mask, to, inplace=out is not None and to is None)
    return (s, grad) if dtanh else s


def _softcap(s: np.ndarray, cap: float, to, inplace: bool):
    """cap·tanh(s / cap) and its derivative's factor 1 − tanh², in s's dtype."""
    c = s.dtype.type(cap)
    if to is not None:
        t = to(np.tanh(to(s / c)))
        return to(t * c), 1 - t * t
    if inplace:
        np.tanh(np.divide(s, c, out=s), out=s)
        grad = 1 - s * s
        return np.multiply(s, c, out=s), grad
    t = np.tanh(s / c)
    return t * c, 1 - t * t


def alibi_bias(slopes: np.ndarray, rows: np.ndarray, j0: int, j1: int, offset: int,
               dtype) -> np.ndarray:
    """ALiBi's bias −slope·|i + offset − j| (FA2's definition; offset = s − t, bottom-right)
    for the query positions `rows` (R,) and keys j0:j1; slopes (…, R), one per row of the
    stack; (…, R, j1 − j0) in `dtype`.
    Example: alibi_bias(np.array([0.5]), np.array([0]), 0, 3, 2, np.float64) -> [[-1, -0.5, -0]]
    """
    dist = np.abs(np.asarray(rows)[:, None] + offset - np.arange(j0, j1)[None, :]).astype(dtype)
    return -(np.asarray(slopes, dtype=dtype)[..., None] * dist)


def apply_masks(sc: np.ndarray, visible=None, mask=None, to=None, *,
                inplace: bool = False) -> np.ndarray:
    """Scores with the causal band / window (visible: True = seen) and the user's mask applied:
    a boolean mask hides where False, a float mask is added (rounded by `to` when given).
    inplace: write into sc itself (no `to`; a float mask of sc's dtype or narrower).

    The one place scores get masked: the reference, the tiled forward and the heatmap use it.
    """
    neg = sc.dtype.type(-np.inf)
    if inplace:
        if visible is not None:
            np.copyto(sc, neg, where=~visible)
        if mask is not None and mask.dtype.kind == "b":
            np.copyto(sc, neg, where=~mask)
        elif mask is not None:
            if np.result_type(sc, mask) != sc.dtype:
                raise TypeError(f"a {mask.dtype} mask widens {sc.dtype} scores; not in place")
            np.add(sc, mask, out=sc)
        return sc
    if visible is not None:
        sc = np.where(visible, sc, neg)
    if mask is not None:
        if mask.dtype.kind == "b":
            sc = np.where(mask, sc, neg)
        else:
            sc = sc + mask if to is None else to(sc + to(mask))
    return sc


def with_mask_mod(mask: np.ndarray | None, seen: np.ndarray | None) -> np.ndarray | None:
    """A user's mask (attn_mask: booleans, True = attend, or floats added to the scores)
    joined with a mask_mod's `seen` (booleans broadcastable to it): a key is seen when both let
    it through, so a boolean mask is and-ed and a float mask becomes −inf where seen is False.
    The one place the two meet: every loop (the tile walk's partial tiles, the one-shot
    reference, the kernel presets, the backward, the tile map's probabilities) asks here, and
    applies the result with the causal band and window in apply_masks.

    Example: with_mask_mod(np.array([0.0, 1.0]), np.array([True, False])) -> [0., -inf]
    """
    if seen is None:
        return mask
    if mask is None:
        return seen
    if mask.dtype.kind == "b":
        return mask & seen
    return np.where(seen, mask, mask.dtype.type(-np.inf))


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


def check_window(sides) -> None:
    """Each window side is a number of keys ≥ 0, -1 for unbounded, or None (unbounded)."""
    if any(x is not None and x < -1 for x in sides):
        raise InputError(f"window sides are a number of keys (≥ 0), or -1 for unbounded; got "
                         f"{sides[0]},{sides[1]}")


def make_band(t: int, s: int, causal: bool, align: str, window) -> Band | None:
    """The band of a causal mask and/or a (left, right) window, or None when all keys are seen.

    Each window side is a number of keys ≥ 0, or -1 for unbounded (FlashAttention's window_size
    reads any negative as unbounded; osm refuses the others as likely typos). A side of t + s or
    more reaches past every key, the same as unbounded, and is kept as such.
    """
    if align not in ALIGNS:
        raise InputError(f"causal alignment must be one of {', '.join(ALIGNS)}, not {align!r}")
    if not causal and window is None:
        return None
    sides = (None, None) if window is None else tuple(window)
    check_window(sides)
    left, right = (None if x is None or x < 0 or x >= t + s else int(x) for x in sides)
    if causal:
        right = 0 if right is None else min(right, 0)
    return Band(s - t if align == "bottom-right" else 0, left, right)


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


def mask_about(mask: np.ndarray | None) -> str:
    """The user's mask in a few words: its kind and shape, or "none"."""
    if mask is None:
        return "none"
    kind = "bool, True = attend" if mask.dtype.kind == "b" else "float, added to the scores"
    return f"{kind}, shape {tuple(mask.shape)}"


def check_mask(mask) -> np.ndarray | None:
    """A user's mask as an array: booleans or floats without NaN or +inf (None stays None)."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype.kind not in "bf":
        raise InputError(f"mask has dtype {mask.dtype}; use booleans (True = attend) or floats")
    if mask.dtype.kind == "f" and (np.isnan(mask) | np.isposinf(mask)).any():
        raise InputError("mask contains NaN or +inf; a float mask is added to the scores "
                         "(use -inf to hide a key)")
    return mask


__all__ = [
    "Band", "alibi_bias", "apply_masks", "check_mask", "make_band", "mask_about", "scale_q",
    "score_tile",
    "tile_kind", "with_mask_mod",
]
