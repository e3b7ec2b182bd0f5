"""The fused forward's row operations on a score tile, bit for bit numpy's, compiled where that
pays: each tile's row maxima, S − ref row by row, the rows' sums and O·α + P·V.

numpy runs a reduction along a tile's rows (128 keys) as one call of its inner loop per row, and
a row-broadcast operation the same way, so on a 2048 × 128 tile its max, sum and subtraction
cost ~0.35, 0.23 and 0.16 ns a score where the exp costs 0.33: more than the exp together
(2-core EPYC, numpy 2.4). Compiled by numba (_rows_numba.py) they take 0.13, 0.13 and ~0.06.
The exp stays numpy's, and the matmuls BLAS's, so the bits are the loop's own:

- the max of a row is one value whatever the order it is found in, and a zero maximum of either
  sign becomes +0.0 as core.state.block_max makes it; the compiled max never sees NaN (it runs
  without a score_mod, and scores are otherwise finite or −inf);
- the sum is numpy's own pairwise order (eight accumulators over a row of at most 128,
  numpy's PW_BLOCKSIZE; wider tiles are numpy's), written out in _rows_numba.row_sum;
- S − ref and O·α + P·V are IEEE operations element by element, with no fused multiply-add.

Trusted only once proven here: the first time, `compiled()` runs every compiled operation
against numpy on a battery of rows (float32 and float64, every width up to 130, zeros, −inf,
values spread over the exponent range) and takes numpy's path if any bit differs.
tests/flash/test_rows.py and tests/flash/test_fast.py (the fused loop with the compiled rows
against the textbook loop) ask for identical bits.

numba's import costs ~0.5 s, so a run uses the compiled operations when numba is installed and
its scores (B·H·t·s) number COMPILED_FROM or more, or LOADED_FROM once numba is loaded (by an
earlier run, or the tensor-core matmul); otherwise numpy.
Leaves out: the loop (fast.py), the arithmetic's order (core/state.py says it).

Example: RowOps(False).block_max(np.float32([[1, 3, 2]]), out) -> out = [3.0]
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from osm_cli.core.state import block_max

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
COMPILED_FROM = 1 << 27  # scores in a run from which numba's import pays (H = 8, N = 4096)
LOADED_FROM = 1 << 20  # the same once numba is loaded (its import paid): a call costs ~3 µs
WIDEST = 128  # numpy's pairwise block: the widest row the compiled sum reproduces

_PROVEN: dict[str, bool] = {}


class RowOps:
    """The four row operations of the fused step, by numba (compiled=True) or numpy; every
    array 2-D (rows, width) or (rows,) and C-contiguous for the compiled ones."""

    def __init__(self, compiled: bool):
        self.compiled = compiled
        self._k = None
        if compiled:
            from . import _rows_numba

            self._k = _rows_numba

    def block_max(self, s: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = core.state.block_max(s, out, nan_free=True): S holds no NaN."""
        if self._k is None or not _fits(s, out):
            return block_max(s, out=out, nan_free=True)
        self._k.row_max(s.reshape(-1, s.shape[-1]), out.reshape(-1), s.dtype.type(-np.inf))
        return out

    def subtract(self, s: np.ndarray, ref: np.ndarray) -> None:
        """s −= ref[..., None], in place."""
        if self._k is None or not _fits(s, ref):
            np.subtract(s, ref[..., None], out=s)
            return
        self._k.sub_rows(s.reshape(-1, s.shape[-1]), ref.reshape(-1))

    def row_sums(self, s: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = np.add.reduce(s, axis=-1)."""
        if self._k is None or s.shape[-1] > WIDEST or not _fits(s, out):
            return np.add.reduce(s, axis=-1, out=out)
        self._k.row_sum(s.reshape(-1, s.shape[-1]), out.reshape(-1))
        return out

    def rescale_add(self, o: np.ndarray, alpha: np.ndarray, pv: np.ndarray) -> None:
        """o = o·alpha[..., None] + pv, in place."""
        if self._k is None or not _fits(o, alpha, pv):
            np.add(np.multiply(o, alpha[..., None], out=o), pv, out=o)
            return
        self._k.rescale_add(o.reshape(-1, o.shape[-1]), alpha.reshape(-1),
                            pv.reshape(-1, pv.shape[-1]))


NUMPY = RowOps(False)


def _fits(*arrays: np.ndarray) -> bool:
    """Whether the compiled operations take these: C-contiguous, one float dtype of 32 or 64
    bits, a non-empty row."""
    dt = arrays[0].dtype
    return (dt in (np.float32, np.float64) and arrays[0].shape[-1] > 0
            and all(a.dtype == dt and a.flags.c_contiguous for a in arrays))


def row_ops(scores: int, score_mod: bool = False) -> RowOps:
    """The row operations for a run of `scores` scores: compiled where numba is installed,
    proven on this machine (compiled()) and worth its import (module docstring); numpy for a
    run with a score_mod (whose scores may hold NaN) and otherwise."""
    if score_mod or not HAVE_NUMBA:
        return NUMPY
    if scores < (LOADED_FROM if "numba" in sys.modules else COMPILED_FROM):
        return NUMPY
    return RowOps(True) if compiled() else NUMPY


def compiled() -> bool:
    """Whether numba's row operations give numpy's bits on this machine (checked once, on a
    battery of rows: module docstring)."""
    if "ok" not in _PROVEN:
        _PROVEN["ok"] = HAVE_NUMBA and _prove()
    return _PROVEN["ok"]


def _prove() -> bool:
    ops = RowOps(True)
    rng = np.random.default_rng(2026)
    for dtype in (np.float32, np.float64):
        for width in range(1, 131):
            s = (rng.standard_normal((9, width)) * np.exp2(rng.integers(-30, 30, (9, 1))))
            s = s.astype(dtype)
            s[1] = 0
            s[2, ::3] = -0.0
            s[3] = -np.inf
            s[4, ::2] = -np.inf
            s[5] = np.abs(s[5])
            ref = block_max(s)
            got = np.empty_like(ref)
            if not _identical(ops.block_max(s, got), ref):
                return False
            p = np.exp(s - np.where(np.isneginf(ref), 0, ref)[:, None]).astype(dtype)
            if not _identical(ops.row_sums(p, np.empty_like(ref)), np.add.reduce(p, axis=-1)):
                return False
            x = s.copy()
            shift = ref.copy()
            shift[np.isneginf(shift)] = 0
            ops.subtract(x, shift)
            if not _identical(x, s - shift[:, None]):
                return False
            o, alpha = s.copy(), np.abs(rng.standard_normal(9)).astype(dtype)
            pv = rng.standard_normal((9, width)).astype(dtype)
            want = o * alpha[:, None] + pv
            ops.rescale_add(o, alpha, pv)
            if not _identical(o, want):
                return False
    return True


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    """The same bits (NaN where NaN, the sign of zero included)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


__all__ = ["COMPILED_FROM", "HAVE_NUMBA", "LOADED_FROM", "NUMPY", "RowOps", "compiled", "row_ops"]
