"""The oracles: one-shot softmax and attention, stabilized and naive.

Everything osm computes blockwise is checked against these. The stabilized forms subtract the
row max once (seed 000 §1.1); the naive form is the formula as written, exp(s) / Σ exp(s), and
overflows where it does in real life. Leaves out: any blocking or tiling.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def stable_softmax(scores: np.ndarray, *, guard: bool = True) -> np.ndarray:
    """exp(s - max s) / Σ exp(s - max s) along the last axis.

    With guard (osm's convention, every kernel's) a row of only -inf gets probabilities 0;
    without it, the textbook formula gives (-inf) - (-inf) = nan there.

    Example: stable_softmax(np.array([100., 102., 99.])) -> [0.1142, 0.8438, 0.0420]
    """
    s = np.asarray(scores)
    m = s.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if guard:
            m = np.where(np.isneginf(m), np.zeros((), s.dtype), m)
        e = np.exp(s - m)
        total = e.sum(axis=-1, keepdims=True)
        if guard:
            return np.where(total == 0, np.zeros((), e.dtype), e / np.where(total == 0, 1, total))
        return e / total


def max_abs_diff(a, b) -> float:
    """max |a − b| in float64, where equal values count as no difference even when they are
    infinite (the LSE of a fully masked row) or both nan; 0 for empty arrays.

    Example: max_abs_diff([-np.inf, 1.0], [-np.inf, 1.5]) -> 0.5
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        return float(np.where(same, 0.0, np.abs(a - b)).max(initial=0.0))


def naive_softmax(scores: np.ndarray) -> np.ndarray:
    """exp(s) / Σ exp(s), as written: inf / inf = nan once exp overflows the dtype."""
    s = np.asarray(scores)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(s)
        return e / e.sum(axis=-1, keepdims=True)


def logsumexp(scores: np.ndarray) -> np.ndarray:
    """ln Σ exp(s) along the last axis, stabilized; -inf for rows of only -inf."""
    s = np.asarray(scores)
    m = s.max(axis=-1)
    ref = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore", over="ignore"):
        return ref + np.log(np.exp(s - ref[..., None]).sum(axis=-1))


def apply_masks(sc: np.ndarray, visible=None, mask=None, to=None) -> np.ndarray:
    """Scores with the causal band / window (visible: True = seen) and the user's mask applied:
    a boolean mask hides where False, a float mask is added (rounded by `to` when given).

    The one place scores get masked: the reference, the tiled forward and the heatmap use it.
    """
    neg = sc.dtype.type(-np.inf)
    if visible is not None:
        sc = np.where(visible, sc, neg)
    if mask is not None:
        if mask.dtype.kind == "b":
            sc = np.where(mask, sc, neg)
        else:
            sc = sc + mask if to is None else to(sc + to(mask))
    return sc


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    visible=None,
    mask: np.ndarray | None = None,
    rows_per_chunk: int | None = None,
    *,
    rnd: Callable[[np.ndarray], np.ndarray] | None = None,
    carry=np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """One-shot attention: softmax(scale·Q·Kᵀ + mask)·V and its LSE, row by row, in float64.

    q (B, H, t, d), k and v (B, H, s, ·) with K/V heads already matched to Q's (a broadcast view
    is fine). visible(i0, i1) gives the boolean (i1 - i0, s) band of the causal mask / window, or
    None; mask is broadcast to (B, H, t, s): bool True = attend, float added. Rows are done in
    chunks so memory stays bounded; the full t × s matrix is never held. Rows with every key
    masked give output 0 and LSE -inf.

    rnd, if given, rounds K, V and each op's result (Q, Q·scale, S, a float mask and S + mask,
    softmax(S), P·V) the way a low-precision framework does (precision.plain); carry is the dtype
    the values are held in (rnd's, float64 without it).
    """
    carry = np.dtype(carry)
    to = rnd or (lambda x: np.asarray(x, dtype=carry))
    b, h, t, _ = q.shape
    s = k.shape[2]
    out = np.zeros((b, h, t, v.shape[-1]), dtype=carry)
    lse = np.full((b, h, t), -np.inf, dtype=carry)
    if s == 0:  # no keys at all: every row is fully masked
        return out, lse
    chunk = rows_per_chunk or max(1, (1 << 22) // max(1, b * h * s))
    kT = to(k).swapaxes(-1, -2)
    vc = to(v)
    for i0 in range(0, t, chunk):
        i1 = min(t, i0 + chunk)
        sc = to(to(to(q[..., i0:i1, :]) * carry.type(scale)) @ kT)
        sc = apply_masks(sc, None if visible is None else visible(i0, i1),
                         None if mask is None else mask[..., i0:i1, :], to)
        out[..., i0:i1, :] = to(to(stable_softmax(sc)) @ vc)
        lse[..., i0:i1] = logsumexp(sc)
    return out, lse
