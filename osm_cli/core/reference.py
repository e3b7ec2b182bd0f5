"""The oracles for a score vector: one-shot softmax and log-sum-exp, stabilized and naive.

Everything osm computes blockwise is checked against these. The stabilized forms subtract the
row max once (docs/numerics.md#neg-inf-guard); the naive form is the formula as written,
exp(s) / Σ exp(s), and overflows where it does in real life (docs/numerics.md#dtype-limits).
Leaves out: any blocking or tiling, and attention's one-shot reference (flash/reference.py).
"""

from __future__ import annotations

import numpy as np

from .inputs import as_numbers


def stable_softmax(scores: np.ndarray, *, guard: bool = True) -> np.ndarray:
    """exp(s - max s) / Σ exp(s - max s) along the last axis.

    With guard (osm's convention, every kernel's) a row of only -inf gets probabilities 0;
    without it, the textbook formula gives (-inf) - (-inf) = nan there.

    Example: stable_softmax(np.array([100., 102., 99.])) -> [0.1142, 0.8438, 0.0420]
    """
    s = as_numbers(scores, "scores")
    return stable_from(s, *softmax_stats(s, guard=guard), guard=guard)


def softmax_stats(scores: np.ndarray, *, guard: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(m, Σ exp(s − m)) along the last axis (kept as an axis of length 1): what stable_softmax
    subtracts and divides by. With guard, m is 0 on a row of only -inf. A long row can be
    summarised a piece at a time: the max of the pieces' m, then the sum of the pieces' sums
    against it (equal up to the order of the additions)."""
    s = np.asarray(scores)
    m = s.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if guard:
            m = np.where(np.isneginf(m), np.zeros((), s.dtype), m)
        return m, np.exp(s - m).sum(axis=-1, keepdims=True)


def stable_from(scores: np.ndarray, m: np.ndarray, total: np.ndarray, *,
                guard: bool = True) -> np.ndarray:
    """exp(s − m) / total for scores (or a piece of their rows) and their softmax_stats."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        e = np.exp(np.asarray(scores) - m)
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
    scores = as_numbers(scores, "scores")
    return naive_from(scores, naive_total(scores))


def naive_total(scores: np.ndarray) -> np.ndarray:
    """Σ exp(s) along the last axis (kept), what naive_softmax divides by; inf once it overflows."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return np.exp(np.asarray(scores)).sum(axis=-1, keepdims=True)


def naive_from(scores: np.ndarray, total: np.ndarray) -> np.ndarray:
    """exp(s) / total for scores (or a piece of their rows) and their naive_total."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return np.exp(np.asarray(scores)) / total


def logsumexp(scores: np.ndarray) -> np.ndarray:
    """ln Σ exp(s) along the last axis, stabilized; -inf for rows of only -inf."""
    s = as_numbers(scores, "scores")
    m = s.max(axis=-1)
    ref = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore", over="ignore"):
        return ref + np.log(np.exp(s - ref[..., None]).sum(axis=-1))
