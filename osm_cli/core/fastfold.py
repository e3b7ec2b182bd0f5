"""fold.py's loop over blocks without a Python step per block: the eager rescale form in forward
order, many blocks at a time, for long traces (what a plain `osm trace` runs).

It computes what `Folding` computes with state.rescale_step, bit for bit: every m, α and l of
every step, the final state and the rescale count (tests/core/test_fastfold.py compares them with
exact equality). Only the loop differs; the update a reader learns from stays rescale_step.

- Block maxima by one reshape (rows, c, block) and a max over its last axis, a zero max made
  +0.0 as state.block_max does; m by np.maximum.accumulate along the blocks: max is exact, and
  accumulate calls maximum(m_prev, block max) in the step's order.
- α = exp(m_prev − ref) and p = exp(s − ref) elementwise, ref = m with −inf replaced by 0, as
  rescale_step computes them; each block's Σp is p.sum(-1) over the same contiguous axis of
  `block` values (numpy reduces each block alike in a (rows, block) and a (rows, c, block)
  array: the test checks blocks 1..300), or for blocks under 8 values the same in-order sum
  column by column (_reduce).
- l_k = l_{k−1}·α_k + Σp_k is sequential. Where no row's m moved, α = 1 (or m is still −inf
  and l = Σp = 0), so l_k = l_{k−1} + Σp_k exactly: np.add.accumulate, which adds in order.
  The blocks where some row's m moved (few, for real data) are computed one at a time.
- The last, partial block goes through rescale_step itself: padding it would change its sum.

Leaves out: the merge form, block orders, the lazy threshold and dtypes other than float32 and
float64 (fold.py's textbook loop runs those).

Example: list(EagerFold(np.array([[2., 4., 1., 3.]]), 2))[0].l -> [1.1353353, 1.5530018]
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .record import StepColumns
from .state import State, initial_state, moved, rescale_step

CHUNK = 1 << 20  # scores folded at once: the arrays of one chunk are a few of its size


def eligible(s2: np.ndarray, form: str, order, threshold: float) -> bool:
    """Whether EagerFold computes this fold: rescale form, forward order, no threshold, and a
    dtype numpy computes natively (the ml_dtypes formats go the textbook way)."""
    return (form == "rescale" and order is None and not threshold
            and s2.dtype in (np.float32, np.float64))


class EagerFold:
    """The eager rescale fold of the rows of s2 (2-D), a chunk of blocks at a time: iterating
    yields the traced row's StepColumns per chunk; once done, `state` is the final state of
    every row and `rescales` counts the (row, block) steps that moved a finite running max."""

    def __init__(self, s2: np.ndarray, block: int, row: int = 0, chunk: int = CHUNK):
        self.s2, self.block, self.row, self.chunk = s2, block, row, chunk
        self.state = initial_state(s2.shape[0], dtype=s2.dtype)
        self.rescales = 0

    def __iter__(self) -> Iterator[StepColumns]:
        rows, n = self.s2.shape
        full = n // self.block
        per = max(1, self.chunk // max(1, rows * self.block))
        for k0 in range(0, full, per):
            yield self._blocks(k0, min(full, k0 + per))
        if n % self.block:
            yield self._last(full)

    def _blocks(self, k0: int, k1: int) -> StepColumns:
        """Fold the whole blocks k0..k1-1 of every row."""
        b, st, r = self.block, self.state, self.row
        rows, c = self.s2.shape[0], k1 - k0
        s3 = self.s2[:, k0 * b:k1 * b].reshape(rows, c, b)
        mm = np.empty((rows, c + 1), dtype=self.s2.dtype)
        mm[:, 0] = st.m
        mm[:, 1:] = _reduce(np.maximum, s3)
        top = mm[:, 1:]
        np.add(top, np.zeros((), top.dtype), out=top)  # state.block_max's +0.0 for a zero max
        block_max = mm[:, 1:]  # accumulate below makes a new array: this one stays as it is
        mm = np.maximum.accumulate(mm, axis=1)
        m_prev, m = mm[:, :-1], mm[:, 1:]
        finite = bool(np.isfinite(m[:, 0]).all())  # m only grows: then all of it is finite
        ref = m if finite else np.where(np.isneginf(m), np.zeros((), m.dtype), m)
        with np.errstate(over="ignore"):  # as rescale_step: exp of −inf is rightly 0
            alpha = np.exp(m_prev - ref)
            p = np.subtract(s3, ref[..., None])
        np.exp(p, out=p)
        sums = _reduce(np.add, p)
        del p
        grew = m > m_prev  # m ≥ m_prev, so where m moved (state.moved without its finite test)
        ls = _running_sums(st.l, alpha, sums, grew.any(axis=0))
        if finite:  # m_prev is finite past the first block: only that one can move from -inf
            self.rescales += int(np.count_nonzero(grew)) - int(np.count_nonzero(
                grew[:, 0] & np.isneginf(m_prev[:, 0])))
        else:
            self.rescales += int(np.count_nonzero(moved(m_prev, m)))
        self.state = State(m[:, -1].copy(), ls[:, -1].copy())
        ks = np.arange(k0, k1, dtype=np.int64)
        return StepColumns(ks, ks * b, ks * b + b, block_max[r], m_prev[r], m[r], alpha[r],
                           np.concatenate([st.l[r:r + 1], ls[r, :-1]]), ls[r])

    def _last(self, k: int) -> StepColumns:
        """Fold the last, partial block (k) with rescale_step itself."""
        prev = self.state
        up = rescale_step(prev, self.s2[:, k * self.block:])
        self.rescales += int(np.count_nonzero(moved(prev.m, up.state.m)))
        self.state = up.state
        r = slice(self.row, self.row + 1)
        ks = np.array([k], dtype=np.int64)
        return StepColumns(ks, ks * self.block, np.array([self.s2.shape[1]], dtype=np.int64),
                           up.block_max[r], prev.m[r], up.state.m[r], up.alpha[r], prev.l[r],
                           up.state.l[r])


SHORT = 8  # numpy reduces fewer values than this one after the other, from the first


def _reduce(op, x: np.ndarray) -> np.ndarray:
    """op.reduce(x, axis=-1) as numpy computes it, the result in a new array: below SHORT
    values a block, one op over the columns at a time, which is the same (numpy's add adds in
    order there and keeps its pairwise sum for longer blocks; max is exact) and is several times
    faster than a reduction over so short an axis."""
    b = x.shape[-1]
    if b >= SHORT:
        return op.reduce(x, axis=-1)
    out = x[..., 0].copy()
    for j in range(1, b):
        op(out, x[..., j], out=out)
    return out


def _running_sums(l0: np.ndarray, alpha: np.ndarray, sums: np.ndarray,
                  moves: np.ndarray) -> np.ndarray:
    """l after each block, (rows, c): l_k = l_{k−1}·α_k + sums_k from l0, computed one block at a
    time where `moves` (some row's m moved there) and by an in-order running sum between."""
    rows, c = sums.shape
    out = np.empty_like(sums)
    prev, at = l0, 0
    for k in [*np.flatnonzero(moves).tolist(), c]:
        if k > at:  # blocks at..k-1: α = 1 for every row (or l and Σp are both 0)
            run = np.empty((rows, k - at + 1), dtype=sums.dtype)
            run[:, 0] = prev
            run[:, 1:] = sums[:, at:k]
            run = np.add.accumulate(run, axis=1)
            out[:, at:k] = run[:, 1:]
            prev = run[:, -1]
        if k < c:
            prev = prev * alpha[:, k] + sums[:, k]  # rescale_step's l·α + Σp, as it rounds
            out[:, k] = prev
            at = k + 1
    return out


__all__ = ["CHUNK", "EagerFold", "eligible"]
