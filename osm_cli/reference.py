"""The oracles: one-shot softmax and attention, stabilized and naive.

Everything osm computes blockwise is checked against these. The stabilized forms subtract the
row max once (seed 000 §1.1); the naive form is the formula as written, exp(s) / Σ exp(s), and
overflows where it does in real life. Leaves out: any blocking or tiling.
"""

from __future__ import annotations

import numpy as np


def stable_softmax(scores: np.ndarray, *, guard: bool = True) -> np.ndarray:
    """exp(s - max s) / Σ exp(s - max s) along the last axis.

    With guard (osm's convention, every kernel's) a row of only -inf gets probabilities 0;
    without it, the textbook formula gives (-inf) - (-inf) = nan there.

    Example: stable_softmax(np.array([100., 102., 99.])) -> [0.1142, 0.8438, 0.0420]
    """
    s = np.asarray(scores)
    m = s.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        if guard:
            m = np.where(np.isneginf(m), np.zeros((), s.dtype), m)
        e = np.exp(s - m)
        total = e.sum(axis=-1, keepdims=True)
        if guard:
            return np.where(total == 0, np.zeros((), e.dtype), e / np.where(total == 0, 1, total))
        return e / total


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
    with np.errstate(divide="ignore"):
        return ref + np.log(np.exp(s - ref[..., None]).sum(axis=-1))
