"""gpu_approx.py's instructions compiled (numba): one pass over the input, element by element,
where the numpy path makes a float64 and an int64 array and five selections per op. Imported
only where numba is installed; the bits are the numpy path's (tests/precision/test_gpu_approx.py
compares them over a sweep of every exponent and sign).

- `ex2(x, hi, lo, packed, out)`: ex2.approx.ftz.f32 of x (float32, C-contiguous, flat) into
  out, from the measured tables in gpu_approx.ex2_compact's form (gpu_approx.py's docstring:
  the fixed-point split). Its three steps (`fixed_point`, `lookup`, `result`) are inlined
  into _bwd_numba.py's pass over a backward tile as well.

Measured (2-core EPYC, AVX-512, 65 536 fresh inputs a call as a backward tile's): the numpy
path over the whole tables (2 × 32 MB, every lookup a cache miss) took ~35 ns an input; this
loop over them ~10, element by element ~20 (fewer misses in flight); over the compact form
(4 MB) ~5. The scaling by 2^±i is integer arithmetic on the exponent bits.

Leaves out: the tables (gpu_approx.table), lg2, rcp and tanh (their numpy paths are cheap
next to ex2 where the kernels call them: once a row, or under a softcap only).

Example: ex2(np.float32([-1.5]), *ex2_compact(), out) fills out with [0.35355335]
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._mma_numba import _bits, _float

FIXED = 2.0**23  # |x|'s fixed point: 23 fraction bits
BLOCK = 512  # inputs a pass
WARM = 1 << 15  # inputs from which ex2 first reads the negative inputs' table in order


@njit(boundscheck=False, nogil=True, cache=True, inline="always")
def fixed_point(v):
    """|v| as fixed point with 23 fraction bits, truncated (0 from 256 on: out of range)."""
    a = abs(np.float64(v))
    return np.int64(a * FIXED) if a < 256.0 else np.int64(0)  # a ≥ 0: trunc is floor


@njit(boundscheck=False, nogil=True, cache=True, inline="always")
def lookup(fx, vbits, hi, lo, packed):
    """The table's value at fx's fraction as float32 bits (the prediction's product plus its
    2-bit difference), for an input whose bits are vbits."""
    f = fx & 0x7FFFFF
    row = np.int64(vbits >= 0)
    pred = np.float32(hi[row, f >> 12] * lo[row, f & 4095])
    diff = (np.int32(packed[row, f >> 2]) >> np.int32((f & 3) * 2)) & np.int32(3)
    return np.int32(_bits(pred) + diff - np.int32(2))


@njit(boundscheck=False, nogil=True, cache=True, inline="always")
def result(v, vbits, fx, vb):
    """ex2(v) from its fixed point fx and the table's value (bits vb): vb·2^±i."""
    minus = vbits < 0
    i = np.int32(fx >> 23)
    i = np.int32(-i) if minus else i
    e = np.int32((vb >> 23) + i)
    r = _float(np.int32(vb + (i << 23)))
    r = np.float32(0.0) if e < 1 else r
    r = np.float32(np.inf) if e >= 255 else r
    r = r if abs(np.float64(v)) < 256.0 else (np.float32(0.0) if minus else np.float32(np.inf))
    return v if v != v else r  # NaN: itself


@njit(boundscheck=False, nogil=True, cache=True, inline="always")
def warm_up(packed, out) -> None:
    """The negative inputs' table (packed's row 0, 2 MB: P's and α's exponents are ≤ 0) read in
    order, one load a cache line: where other arrays have pushed it out of the caches, a sweep
    the prefetchers stream costs less than the lookups' misses. out[0] is written after it
    (the loads kept), and again by the caller."""
    acc = np.int64(0)
    neg = packed[0]
    for i in range(0, neg.size, 64):
        acc += neg[i]
    if out.size:
        out[0] = np.float32(acc)


@njit(boundscheck=False, nogil=True, cache=True)
def ex2(x, hi, lo, packed, out) -> None:
    """out[i] = ex2.approx.ftz.f32(x[i]) (gpu_approx.ex2_numpy's arithmetic, element by
    element); hi, lo and packed are gpu_approx.ex2_compact's (row 0: x < 0, row 1: x ≥ 0).
    The table's value v lies in [1/2, 2), so v·2^±i is v with ±i added to its exponent bits:
    below float32's normal range it flushes to +0, past it it is +inf. Blocks of BLOCK
    inputs in three passes: their fixed-point splits, the lookups (loads and the prediction's
    one product, so that the CPU keeps many cache misses in flight), the results
    (selections, no branches)."""
    bits = x.view(np.int32)
    fixed = np.empty(BLOCK, np.int64)
    got = np.empty(BLOCK, np.int32)
    if x.size >= WARM:
        warm_up(packed, out)
    for s in range(0, x.size, BLOCK):
        m = min(BLOCK, x.size - s)
        for j in range(m):
            fixed[j] = fixed_point(x[s + j])
        for j in range(m):
            got[j] = lookup(fixed[j], bits[s + j], hi, lo, packed)
        for j in range(m):
            out[s + j] = result(x[s + j], bits[s + j], fixed[j], got[j])


__all__ = ["BLOCK", "ex2", "fixed_point", "lookup", "result"]
