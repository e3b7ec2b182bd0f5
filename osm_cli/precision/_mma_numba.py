"""mma.py's compiled kernels (numba): the tensor cores' accumulation of a (G, M, K) @ b (G, K, N)
+ c (G, M, N) into out, float32, C-contiguous. Imported only where numba is installed.

- `mma(a, b, c, out)`: the 16-bit path when both operands hold 11 or fewer significant bits,
  magnitudes ≤ 2^60 and c is finite (mma.py's docstring says why that is exact), else the
  float64 one, element by element.

The kernel runs on the calling thread and releases the GIL: the kernel presets' loop already
runs its Q tiles a thread per core (attention/forward.py), so a parallel kernel would only
oversubscribe the cores (and numba's default thread pool on macOS is not safe to enter from
several threads at once).

Leaves out: the shapes and broadcasting (mma.tensor_core), the numpy path (mma.py).

Example: mma(a, b, np.zeros((1, 2, 3), np.float32), out) fills out (1, 2, 3)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

K16 = 16  # the k of one MMA instruction
FIN = {"nnan", "ninf"}  # the 16-bit path's values are finite (checked before it runs)
LOW13 = np.int32(0x1FFF)  # float32 mantissa bits below an 11-bit significand
HUGE_EF = 248  # a largest term of 2^(248 − 127) = 2^121 or more: the float64 arithmetic (the
#               sum times q could pass float32's largest, which the float64 path saturates)
TINY_EF = 27  # a largest term below 2^(27 − 127) = 2^−100 takes the float64 arithmetic


@njit(boundscheck=False, nogil=True, cache=True)
def _fits16(x) -> bool:
    """Every value of x has ≤ 11 significant bits and |x| ≤ 2^60 (so finite)."""
    bits = x.reshape(-1).view(np.int32)
    v = x.reshape(-1)
    for i in range(v.size):
        if (bits[i] & LOW13) != 0 or not abs(v[i]) <= 1.152921504606847e18:
            return False
    return True


@njit(boundscheck=False, nogil=True, cache=True)
def _all_finite(x) -> bool:
    v = x.reshape(-1)
    for i in range(v.size):
        if not math.isfinite(v[i]):
            return False
    return True


@njit(boundscheck=False, nogil=True, cache=True)
def _chunk64(ac, bc, acc_k, n, width):
    """One element's chunk in float64, for any float32 operands (the numpy path's arithmetic):
    the sum of the terms truncated to the quantum, or their IEEE sum where one is not finite."""
    top = abs(acc_k)
    raw = acc_k
    for j in range(K16):
        p = np.float64(ac[j]) * np.float64(bc[j * width + n])
        top = max(top, abs(p))
        raw += p
    if not math.isfinite(raw):
        return raw
    if top == 0.0:
        return 0.0
    _, e = math.frexp(top)
    qx = math.ldexp(1.0, e - 26)
    s = np.trunc(acc_k / qx)
    for j in range(K16):
        s += np.trunc(np.float64(ac[j]) * np.float64(bc[j * width + n]) / qx)
    return s * qx


@njit(boundscheck=False, nogil=True, cache=True)
def _down(x):
    """float64 to float32 toward zero (numpy path's toward_zero)."""
    f = np.float32(x)
    if abs(np.float64(f)) > abs(x):
        f = np.nextafter(f, np.float32(0))
    return f


@njit(boundscheck=False, nogil=True, fastmath=FIN, cache=True)
def _tops(ac, bc, acc, top, width):
    """Each column's largest |term|: the accumulator and the chunk's 16 products."""
    for n in range(width):
        m = abs(acc[n])
        for j in range(K16):
            m = max(m, abs(ac[j] * bc[j * width + n]))
        top[n] = m


@njit(boundscheck=False, nogil=True, fastmath=FIN, cache=True)
def _sums(ac, bc, acc, iq, isum, width):
    """Each column's sum of its 17 terms scaled by 1/q and truncated (int32, exact)."""
    for n in range(width):
        w = iq[n]
        s = np.int32(acc[n] * w)
        for j in range(K16):
            s += np.int32(ac[j] * bc[j * width + n] * w)
        isum[n] = s


@njit(boundscheck=False, nogil=True, cache=True)
def _row16(ar, b2, acc, out, width, k, top, iq, q, isum, f):
    """One output row over every chunk: acc (float32, the row's c) becomes the row's result."""
    topb = top.view(np.int32)
    iqb = iq.view(np.int32)
    qb = q.view(np.int32)
    fb = f.view(np.int32)
    for k0 in range(0, k, K16):
        ac = ar[k0:k0 + K16]
        bc = b2[k0 * width:(k0 + K16) * width]
        _tops(ac, bc, acc, top, width)
        for n in range(width):  # q = 2^(E − 25) and 1/q from the largest term's exponent E
            ef = min(max(topb[n] >> 23, TINY_EF), 254)
            iqb[n] = (279 - ef) << 23
            qb[n] = (ef - 25) << 23
        _sums(ac, bc, acc, iq, isum, width)
        for n in range(width):  # the sum to 24 bits (exact when it has no more), then times q
            f[n] = np.float32(isum[n])
        for n in range(width):  # rounded up in magnitude: one step back toward zero
            fb[n] -= np.int32(abs(np.int32(f[n])) > abs(isum[n]))
        for n in range(width):
            f[n] *= q[n]
        rare = 0
        for n in range(width):
            t = topb[n]
            rare += ((t < (TINY_EF << 23)) & (t != 0)) | (t >= (HUGE_EF << 23))
        if rare:
            for n in range(width):
                t = topb[n]
                if (t < (TINY_EF << 23) and t != 0) or t >= (HUGE_EF << 23):
                    f[n] = _down(_chunk64(ac, bc, np.float64(acc[n]), n, width))
        for n in range(width):
            acc[n] = f[n]
    for n in range(width):
        out[n] = acc[n]


@njit(boundscheck=False, nogil=True, cache=True)
def _row64(ar, b2, acc, out, width, k):
    """One output row, element by element in float64 (any float32 operands)."""
    for k0 in range(0, k, K16):
        ac = ar[k0:k0 + K16]
        bc = b2[k0 * width:(k0 + K16) * width]
        for n in range(width):
            out[n] = _down(_chunk64(ac, bc, np.float64(acc[n]), n, width))
        for n in range(width):
            acc[n] = out[n]


@njit(boundscheck=False, nogil=True, cache=True)
def _run(a, b, c, out, fast):
    g_, m_, k = a.shape
    width = b.shape[2]
    a2 = a.reshape(g_ * m_, k)
    b2 = b.reshape(g_, k * width)
    c2 = c.reshape(g_ * m_, width)
    o2 = out.reshape(g_ * m_, width)
    acc = np.empty(width, np.float32)
    top = np.empty(width, np.float32)
    iq = np.empty(width, np.float32)
    q = np.empty(width, np.float32)
    isum = np.empty(width, np.int32)
    f = np.empty(width, np.float32)
    for gm in range(g_ * m_):
        acc[:] = c2[gm]
        if fast:
            _row16(a2[gm], b2[gm // m_], acc, o2[gm], width, k, top, iq, q, isum, f)
        else:
            _row64(a2[gm], b2[gm // m_], acc, o2[gm], width, k)


def mma(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b + c as the tensor cores accumulate (module docstring); K is padded with zero
    products to a multiple of 16 (a zero term changes neither a chunk's largest term nor its
    sum)."""
    k = a.shape[-1]
    pad = -k % K16
    if pad:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], pad), np.float32)], axis=-1)
        b = np.concatenate([b, np.zeros((b.shape[0], pad, b.shape[2]), np.float32)], axis=1)
    fast = _fits16(a) and _fits16(b) and _all_finite(c)
    _run(a, b, c, out, fast)


__all__ = ["mma"]
