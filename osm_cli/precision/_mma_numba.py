"""mma.py's compiled kernels (numba): the tensor cores' accumulation of a (G, M, K) @ b (G, K, N)
+ c (G, M, N) into out, float32, C-contiguous. Imported only where numba is installed.

- `mma(a, b, c, out)`: the 16-bit path when both operands hold 11 or fewer significant bits,
  magnitudes ≤ 2^60 and c is finite (mma.py's docstring says why that is exact), else the
  float64 one, element by element; a row with some element out of the 16-bit path's range
  (a largest term below 2^−100 or from 2^121) is redone in float64.

How it is fast (benchmarks/bench_mma.py measures it). One pass over each element's chunk: its
16 products made once and kept in registers, their largest magnitude (a tree of maxima), the
quantum from its exponent bits, the 17 terms scaled, truncated to int32 and added (a tree),
the sum put into float32 toward zero. Every integer is an explicit int32 (numba would widen
int32 arithmetic to int64, halving the lanes of a vector), so LLVM vectorizes the loop over
an output row's columns 8 (AVX2) or 16 lanes wide. b is first copied into panels of 64
columns (16 at the end of a row whose width is no multiple of 64), each chunk's 16 rows of a
panel contiguous: the 16 loads of an element then sit at constant offsets from one pointer.
On AVX-512 the loop is asked for 16 lanes (`_wide_vectors`). Measured on captured forward
calls (2-core Xeon, AVX-512, numba 0.68) against the kernel before it (two passes over arrays,
products made twice): 0.12 against 0.23 ns a term (0.15 with 8 lanes); BLAS's float32 FMA
takes 0.02.

The kernel runs on the calling thread and releases the GIL: the kernel presets' loop already
runs its Q tiles a thread per core (attention/forward.py), so a parallel kernel would only
oversubscribe the cores (and numba's default thread pool on macOS is not safe to enter from
several threads at once).

Leaves out: the shapes and broadcasting (mma.tensor_core), the numpy path (mma.py), the same
16-bit path in AVX-512's instructions (_mma_avx512.py, which shares setup and row64).

Example: mma(a, b, np.zeros((1, 2, 3), np.float32), out) fills out (1, 2, 3)
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

K16 = 16  # the k of one MMA instruction
I32 = np.int32
LOW13 = I32(0x1FFF)  # float32 mantissa bits below an 11-bit significand
LIMIT = 1.152921504606847e18  # 2^60: larger operands take the float64 arithmetic
MAG = I32(0x7FFFFFFF)  # a float32's bits without its sign
EXP = I32(0x7F800000)  # its exponent bits
HUGE = I32(248 << 23)  # a largest term of 2^(248 − 127) = 2^121 or more: the float64
#                        arithmetic (the sum times q could pass float32's largest, which the
#                        float64 path saturates)
TINY = I32(27 << 23)  # a largest term below 2^(27 − 127) = 2^−100 takes the float64 arithmetic
PANEL = 64  # b's columns a panel (the loop over them is the vectorized one)
TAIL = 16  # the panels of a row's last width % 64 columns


@intrinsic
def _bits(typingctx, x):
    """A float32's bits as an int32 (a bit cast, in registers)."""
    if x != types.float32:
        return None
    return types.int32(x), lambda context, builder, sig, args: builder.bitcast(
        args[0], ir.IntType(32))


@intrinsic
def _float(typingctx, x):
    """The float32 of an integer's low 32 bits (a bit cast)."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if x.bitwidth != 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def _wide_vectors(typingctx):
    """Asks LLVM for 512-bit vectors in the calling function where the CPU has them. On
    AVX-512 CPUs LLVM's vectorizer keeps to 256 bits unless told (its "prefer-256-bit"
    tuning); the kernel, bound by vector instructions, takes 25 % less time with 16 lanes
    (Xeon, Sapphire Rapids class). Elsewhere the attributes change nothing, and the bits
    never depend on the width. llvmlite's own list of function attributes lacks these
    string attributes, so they are added to its set directly; where that fails, the
    kernel keeps 256 bits."""

    def codegen(context, builder, sig, args):
        attrs = builder.function.attributes
        try:
            set.add(attrs, '"prefer-vector-width"="512"')
            set.add(attrs, '"min-legal-vector-width"="512"')
        except TypeError:  # a later llvmlite whose attributes are no set
            pass
        return context.get_dummy_value()

    return types.none(), codegen


@njit(boundscheck=False, nogil=True, cache=True)
def _fits16(x) -> bool:
    """Every value of x has ≤ 11 significant bits and |x| ≤ 2^60 (so finite)."""
    v = x.reshape(-1)
    bits = v.view(np.int32)
    bad = I32(0)
    for i in range(v.size):  # no early exit: a reduction LLVM vectorizes
        bad = I32(bad | (bits[i] & LOW13) | I32(not abs(v[i]) <= LIMIT))
    return bad == 0


@njit(boundscheck=False, nogil=True, cache=True)
def _all_finite(x) -> bool:
    bits = x.reshape(-1).view(np.int32)
    top = I32(0)
    for i in range(bits.size):
        top = max(top, I32(bits[i] & MAG))
    return top < EXP


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


@njit(boundscheck=False, nogil=True, cache=True, inline="always")
def _column(pan, i, w):
    """A panel's column i: its 16 values, w apart."""
    return (pan[i], pan[i + w], pan[i + 2 * w], pan[i + 3 * w], pan[i + 4 * w], pan[i + 5 * w],
            pan[i + 6 * w], pan[i + 7 * w], pan[i + 8 * w], pan[i + 9 * w], pan[i + 10 * w],
            pan[i + 11 * w], pan[i + 12 * w], pan[i + 13 * w], pan[i + 14 * w],
            pan[i + 15 * w])


@njit(boundscheck=False, nogil=True, fastmath={"nnan", "ninf"}, cache=True, inline="always")
def _element(a, b, x):
    """One element's chunk on the 16-bit path: a the row's 16 values and b the column's (two
    tuples), x the accumulator; the new accumulator and the largest term's bits. Products of
    ≤ 11-bit values are exact in float32; the quantum q = 2^(E − 25) is a power of two, so
    each term times 1/q is exact and its truncation is a conversion to int32 (|t/q| < 2^26;
    17 of them add exactly)."""
    p0 = a[0] * b[0]
    p1 = a[1] * b[1]
    p2 = a[2] * b[2]
    p3 = a[3] * b[3]
    p4 = a[4] * b[4]
    p5 = a[5] * b[5]
    p6 = a[6] * b[6]
    p7 = a[7] * b[7]
    p8 = a[8] * b[8]
    p9 = a[9] * b[9]
    p10 = a[10] * b[10]
    p11 = a[11] * b[11]
    p12 = a[12] * b[12]
    p13 = a[13] * b[13]
    p14 = a[14] * b[14]
    p15 = a[15] * b[15]
    top = max(max(max(max(abs(p0), abs(p1)), max(abs(p2), abs(p3))),
                  max(max(abs(p4), abs(p5)), max(abs(p6), abs(p7)))),
              max(max(max(abs(p8), abs(p9)), max(abs(p10), abs(p11))),
                  max(max(abs(p12), abs(p13)), max(abs(p14), abs(p15)))))
    tb = _bits(max(top, abs(x)))
    # 2^E from the exponent bits, at least the fast path's lowest (zeros; a row below it is
    # redone)
    eb = I32(max(I32(tb & EXP), TINY))  # (a term from 2^121 on: its row is redone)
    iq = _float(I32(I32(279 << 23) - eb))  # 1/q = 2^(25 − E)
    s = I32(I32(I32(I32(I32(p0 * iq) + I32(p1 * iq)) + I32(I32(p2 * iq) + I32(p3 * iq)))
                + I32(I32(I32(p4 * iq) + I32(p5 * iq)) + I32(I32(p6 * iq) + I32(p7 * iq))))
            + I32(I32(I32(I32(p8 * iq) + I32(p9 * iq)) + I32(I32(p10 * iq) + I32(p11 * iq)))
                  + I32(I32(I32(p12 * iq) + I32(p13 * iq))
                        + I32(I32(p14 * iq) + I32(p15 * iq)))))
    s = I32(s + I32(x * iq))
    f = np.float32(s)  # the sum to 24 bits (exact when it has no more), then times q
    fb = I32(_bits(f) - I32(abs(I32(f)) > abs(s)))  # rounded up in magnitude: one step back
    return _float(fb) * _float(I32(eb - I32(25 << 23))), tb


@njit(boundscheck=False, nogil=True, fastmath={"nnan", "ninf"}, cache=True)
def _row16(ar, bp, acc, k, wide, wpad):
    """One output row over every chunk on the 16-bit path: acc (float32, the row's c, wpad
    long) becomes the row's result. Returns whether some element left the path's range."""
    _wide_vectors()
    hi = I32(0)
    lo = MAG
    for kc in range(k // K16):  # plain ranges: LLVM then knows the indices are ≥ 0 and
        k0 = kc * K16  #          contiguous (with a step it gathered, or kept to scalars)
        a = (ar[k0], ar[k0 + 1], ar[k0 + 2], ar[k0 + 3], ar[k0 + 4], ar[k0 + 5], ar[k0 + 6],
             ar[k0 + 7], ar[k0 + 8], ar[k0 + 9], ar[k0 + 10], ar[k0 + 11], ar[k0 + 12],
             ar[k0 + 13], ar[k0 + 14], ar[k0 + 15])
        chunk = bp[k0 * wpad:(k0 + K16) * wpad]
        for p in range(wide // PANEL):
            n0 = p * PANEL
            pan = chunk[n0 * K16:(n0 + PANEL) * K16]
            for i in range(PANEL):
                acc[n0 + i], tb = _element(a, _column(pan, i, PANEL), acc[n0 + i])
                hi = max(hi, tb)
                lo = min(lo, tb if tb != I32(0) else MAG)
        for p in range((wpad - wide) // TAIL):
            n0 = wide + p * TAIL
            pan = chunk[n0 * K16:(n0 + TAIL) * K16]
            for i in range(TAIL):
                acc[n0 + i], tb = _element(a, _column(pan, i, TAIL), acc[n0 + i])
                hi = max(hi, tb)
                lo = min(lo, tb if tb != I32(0) else MAG)
    return hi >= HUGE or lo < TINY


@njit(boundscheck=False, nogil=True, cache=True)
def _panels(b, wide, wpad):
    """b (G, K, N) as panels: for each chunk of 16 rows, its columns PANEL at a time up to
    `wide`, then TAIL at a time (zeros past N), each panel's 16 rows contiguous."""
    g_, k, width = b.shape
    bp = np.zeros((g_, k * wpad), np.float32)
    for g in range(g_):
        for kc in range(k // K16):
            for j in range(K16):
                src = b[g, kc * K16 + j]
                for p in range(wide // PANEL):
                    at = kc * K16 * wpad + p * PANEL * K16 + j * PANEL
                    dst = bp[g, at:at + PANEL]
                    for i in range(PANEL):
                        dst[i] = src[p * PANEL + i]
                for p in range((wpad - wide) // TAIL):
                    n0 = wide + p * TAIL
                    at = kc * K16 * wpad + n0 * K16 + j * TAIL
                    for i in range(min(TAIL, width - n0)):
                        bp[g, at + i] = src[n0 + i]
    return bp


@njit(boundscheck=False, nogil=True, cache=True)
def setup(a, b, c):
    """What a run needs beside its rows (this kernel's and _mma_avx512's): whether every row may
    take the 16-bit path, b's panels, the panels' widths (`wide` in panels of 64, `wpad` with
    the last ones of 16)."""
    width = b.shape[2]
    wide = width // PANEL * PANEL
    wpad = wide + -(-(width - wide) // TAIL) * TAIL
    fast = _fits16(a) and _fits16(b) and _all_finite(c)
    return fast, _panels(b, wide, wpad), wide, wpad


@njit(boundscheck=False, nogil=True, cache=True)
def row64(a, b, c, out, gm):
    """Output row gm of (G·M, N) out in float64 (a row the 16-bit path leaves)."""
    m_, width, k = a.shape[1], b.shape[2], a.shape[2]
    acc = c.reshape(-1, width)[gm].copy()
    _row64(a.reshape(-1, k)[gm], b[gm // m_].reshape(-1), acc, out.reshape(-1, width)[gm],
           width, k)


@njit(boundscheck=False, nogil=True, cache=True)
def _run(a, b, c, out):
    g_, m_, k = a.shape
    width = b.shape[2]
    a2, c2, o2 = a.reshape(g_ * m_, k), c.reshape(g_ * m_, width), out.reshape(g_ * m_, width)
    fast, bp, wide, wpad = setup(a, b, c)
    row = np.zeros(wpad, np.float32)
    for gm in range(g_ * m_):
        row[:width] = c2[gm]
        if not fast or _row16(a2[gm], bp[gm // m_], row, k, wide, wpad):
            row64(a, b, c, out, gm)
        else:
            o2[gm] = row[:width]


def padded(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a and b with K padded by zero products to a multiple of 16 (a zero term changes neither
    a chunk's largest term nor its sum)."""
    pad = -a.shape[-1] % K16
    if pad:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], pad), np.float32)], axis=-1)
        b = np.concatenate([b, np.zeros((b.shape[0], pad, b.shape[2]), np.float32)], axis=1)
    return a, b


def mma(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b + c as the tensor cores accumulate (module docstring)."""
    _run(*padded(a, b), c, out)


__all__ = ["mma", "padded", "row64", "setup"]
