"""gpu_approx.py's instructions compiled (numba): one pass over the input, element by element,
where the numpy path makes a float64 and an int64 array and five selections per op. Imported
only where numba is installed; the bits are the numpy path's (tests/precision/test_gpu_approx.py
compares them over a sweep of every exponent and sign).

- `ex2(x, hi, lo, packed, out)`: ex2.approx.ftz.f32 of x (float32, C-contiguous, flat) into
  out, from the measured tables in gpu_approx.ex2_compact's form (gpu_approx.py's docstring:
  the fixed-point split).

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
    for s in range(0, x.size, BLOCK):
        m = min(BLOCK, x.size - s)
        for j in range(m):
            a = abs(np.float64(x[s + j]))
            fx = np.int64(a * FIXED) if a < 256.0 else np.int64(0)  # a ≥ 0: trunc is floor
            fixed[j] = fx
        for j in range(m):
            f = fixed[j] & 0x7FFFFF
            row = np.int64(bits[s + j] >= 0)
            pred = np.float32(hi[row, f >> 12] * lo[row, f & 4095])
            diff = (np.int32(packed[row, f >> 2]) >> np.int32((f & 3) * 2)) & np.int32(3)
            got[j] = np.int32(_bits(pred) + diff - np.int32(2))
        for j in range(m):
            v = x[s + j]
            minus = bits[s + j] < 0
            i = np.int32(fixed[j] >> 23)
            i = np.int32(-i) if minus else i
            vb = got[j]
            e = np.int32((vb >> 23) + i)
            r = _float(np.int32(vb + (i << 23)))
            r = np.float32(0.0) if e < 1 else r
            r = np.float32(np.inf) if e >= 255 else r
            r = r if abs(np.float64(v)) < 256.0 else (
                np.float32(0.0) if minus else np.float32(np.inf))
            out[s + j] = v if v != v else r  # NaN: itself


__all__ = ["ex2"]
