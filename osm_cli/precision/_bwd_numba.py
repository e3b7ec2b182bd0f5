"""kernel_backward.py's elementwise arithmetic of one tile pair, compiled (numba): P, dS and
their 16-bit operands in one pass over the tile, where numpy makes a dozen tile-sized arrays
(S·c, x, x's NaN test, the ex2's splits, dP − D, P·(dP − D), two copies and four casts for
the roundings). Imported only where numba is installed; the bits are the numpy path's
(tests/precision/test_kernel_backward.py compares the two).

- `p_ds(s, ls, d, dp, c, fused, hi, lo, packed, p, ds, pr, dsr, bf16)`: for a tile's rows
  (…, rows, keys) flattened to (R, K): x = fl(fl(S·c) − LSE·log2e) (FA2) or fl(S·c − LSE·
  log2e) in float64 then float32 (FA4's FMA as gpu_ops.fma computes it), NaN (a masked row)
  read as −inf; P = the H200's ex2.approx of x (_approx_numba's lookups, ex2_compact's
  tables); dS = fl(P·fl(dP − D)); with bf16, pr and dsr get P and dS rounded to bfloat16
  (to nearest even, as ml_dtypes casts). Returns whether some P or dS is NaN: its bfloat16
  is then left to numpy (NaN's bits).

Measured (benchmarks/bench_mma.py, H=8, N=2048, d=64, one thread): the tile loop's
elementwise work and the ex2 for P (benchmarks/results/bench_mma_epyc_zen5.txt).

Leaves out: the matmuls (_mma_numba.py), the masks (applied to S before), FA4's softcap and
other rounders than bfloat16's (numpy, kernel_backward.py).

Example: p_ds(s, ls, d, dp, c, False, *ex2_compact(), p, ds, pr, dsr, True) fills p … dsr
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._approx_numba import fixed_point, lookup, result
from ._mma_numba import _bits, _float

SPAN = 2048  # inputs a pass (whole rows)


@njit(boundscheck=False, nogil=True, cache=True, inline="always")
def _bf16(v):
    """float32 v (not NaN) rounded to bfloat16, to nearest even, as float32."""
    u = np.int64(_bits(v)) & 0xFFFFFFFF
    return _float((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000)


@njit(boundscheck=False, nogil=True, cache=True)
def p_ds(s, ls, d, dp, c, fused, hi, lo, packed, p, ds, pr, dsr, bf16) -> bool:
    """The module docstring's P, dS (and their bfloat16) of a tile's (R, K) scores s and dP
    dp, ls and d its rows' LSE·log2e and D; c the exponent's float32 factor. Whole rows at a
    time, about SPAN inputs, in ex2's three passes (many lookups in flight)."""
    rows, keys = s.shape
    step = max(1, SPAN // max(keys, 1))
    span = step * keys
    xs = np.empty(span, np.float32)
    fixed = np.empty(span, np.int64)
    got = np.empty(span, np.int32)
    xb = xs.view(np.int32)
    bad = 0
    cd = np.float64(c)
    warm = np.int64(rows)  # the negative inputs' table (P's) read in order first: the tile
    neg = packed[0]  #        loop's matmuls push it out of the caches, and the lookups'
    for i in range(0, neg.size, 64):  # misses cost more than a sweep that prefetchers stream
        warm += neg[i]
    bad |= warm < 0
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        for r in range(r0, r1):
            at = (r - r0) * keys
            lr = ls[r]
            if fused:
                nl = np.float64(-lr)
                for j in range(keys):
                    x = np.float32(np.float64(s[r, j]) * cd + nl)
                    xs[at + j] = np.float32(-np.inf) if x != x else x
            else:
                for j in range(keys):
                    x = np.float32(np.float32(s[r, j] * c) - lr)
                    xs[at + j] = np.float32(-np.inf) if x != x else x
        n = (r1 - r0) * keys
        for i in range(n):
            fixed[i] = fixed_point(xs[i])
        for i in range(n):
            got[i] = lookup(fixed[i], xb[i], hi, lo, packed)
        for r in range(r0, r1):
            at = (r - r0) * keys
            dr = d[r]
            for j in range(keys):
                i = at + j
                pv = result(xs[i], xb[i], fixed[i], got[i])
                dv = np.float32(pv * np.float32(dp[r, j] - dr))
                p[r, j] = pv
                ds[r, j] = dv
                bad |= dv != dv
            if bf16:
                for j in range(keys):
                    pr[r, j] = _bf16(p[r, j])
                    dsr[r, j] = _bf16(ds[r, j])
    return bad != 0


__all__ = ["p_ds"]
