"""The tensor cores' float32 accumulation, fast (docs/numerics.md#tensor-cores): a @ b (+ c)
with the k dimension taken 16 at a time, the accumulator and the 16 exact products aligned to
the largest of them and truncated 2 bits below float32's last, summed exactly, the sum put into
float32 toward zero.

- `tensor_core(a, b, c)`: the arithmetic, by numba where it is installed, else by numpy.
- `tensor_core_numpy(a, b, c)`: the same bits in numpy (float64 arrays of every product).

How the compiled path stays exact and fast. Products of two values of 11 or fewer significant
bits (bf16, fp16, FP8, and P rounded to one of them) have 22 or fewer, so they are exact in
float32 as long as they neither overflow nor fall below float32's normal range by more than the
truncation drops anyway. A chunk's quantum q = 2^(E − 25) (E the exponent of its largest term)
is a power of two, so t·(1/q) is exact, its truncation is a conversion to int32 (|t/q| < 2^26),
and the 17 truncated terms add exactly in int32; the sum is rounded to float32 toward zero as
an integer (float32 of it, one step back where that rounded up) and then scaled by q, exact
for results in float32's normal range. That is 8 products a vector instruction where
float64 takes 4, the 16 terms of a chunk held in registers while the loop runs over the output's
columns. The call falls back to the float64 kernel (any float32 inputs, infinities, NaN, the
same bits) when an operand has more than 11 significant bits, a magnitude above 2^60, or the
accumulator is not finite; a chunk whose largest term is below 2^−100 or above 2^120 takes the
float64 arithmetic for that element. numpy's sum of a zero chunk is +0, and so is the kernel's.

Two compiled kernels give these bits: _mma_avx512.py in AVX-512's own instructions where the
CPU has AVX-512F and DQ (fewer vector instructions a term: VRANGEPS for the largest magnitude,
a conversion toward zero), else _mma_numba.py, which LLVM vectorizes for any CPU.

Measured (benchmarks/bench_mma.py): numba's kernel is ~40× faster than the numpy path; numpy
alone cannot reach it, because it makes every product and every truncation as a float64 array
pass (~10 passes of 17 terms per output element per chunk) where the kernel keeps them in
registers.

Leaves out: BLAS's mode and the dispatch on `how` (gpu_ops.matmul).

Example: tensor_core(np.float32([[1, 2**-30]]), np.float32([[1], [1]])) -> [[1.0]]
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np

MMA_K = 16  # the k of one 16-bit MMA instruction (mma.sync m16n8k16, wgmma …k16)
MMA_EXTRA = 2  # bits the tensor cores keep below float32's last when aligning terms

# numba compiles the fast kernel (imported on first use: it takes a while to load); without
# it, the numpy path gives the same bits, slowly
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
# The compiled kernel in AVX-512's own instructions (_mma_avx512.py) where the CPU has them:
# None until the first call asks the CPU; tests set it to run either kernel
AVX512: bool | None = None


def tensor_core(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """a @ b (+ c) in float32 as the tensor cores accumulate (module docstring); a (..., M, K)
    and b (..., K, N) float32 with broadcastable leading axes, c (..., M, N) or None."""
    if not HAVE_NUMBA:
        return tensor_core_numpy(a, b, c)
    kern = _compiled()
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = (*lead, m, n)
    g = math.prod(lead)
    a3 = _stack(a, (*lead, m, k), g)
    b3 = _stack(b, (*lead, k, n), g)
    c3 = np.zeros((g, m, n), dtype=np.float32) if c is None else _stack(
        np.asarray(c, dtype=np.float32), shape, g)
    out = np.empty((g, m, n), dtype=np.float32)
    if g and m and n:
        if k == 0:
            out[...] = c3
        else:
            kern.mma(a3, b3, c3, out)
    return out.reshape(shape)


def _compiled():
    """The compiled kernel's module: AVX-512's (where the CPU has it) or the portable one."""
    global AVX512
    from . import _mma_avx512, _mma_numba  # importing compiles nothing

    if AVX512 is None:
        AVX512 = _mma_avx512.available()
    return _mma_avx512 if AVX512 else _mma_numba


def _stack(x: np.ndarray, shape: tuple, g: int) -> np.ndarray:
    """x broadcast to shape, C-contiguous, its leading axes as one of g (x itself where it is
    already so)."""
    if x.shape != shape:
        x = np.broadcast_to(x, shape)
    return np.ascontiguousarray(x).reshape(g, *shape[-2:])


def tensor_core_numpy(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """tensor_core's bits in numpy: every chunk's 16 products as a float64 array, truncated to
    the chunk's quantum, summed, the sum put into float32 toward zero."""
    lead = np.broadcast_shapes(np.shape(a)[:-2], np.shape(b)[:-2])
    a64 = np.broadcast_to(a, (*lead, *np.shape(a)[-2:])).astype(np.float64)
    b64 = np.broadcast_to(b, (*lead, *np.shape(b)[-2:])).astype(np.float64)
    shape = (*a64.shape[:-1], b64.shape[-1])
    acc = np.zeros(shape) if c is None else np.broadcast_to(c, shape).astype(np.float64)
    for k0 in range(0, a64.shape[-1], MMA_K):
        terms = a64[..., :, None, k0:k0 + MMA_K] * np.swapaxes(b64[..., k0:k0 + MMA_K, :],
                                                               -1, -2)[..., None, :, :]
        terms = np.concatenate([acc[..., None], terms], axis=-1)
        top = np.abs(terms).max(axis=-1, keepdims=True)
        _, e = np.frexp(np.where(top == 0, 1.0, top))
        quantum = np.ldexp(1.0, e - 1 - 23 - MMA_EXTRA)
        acc = toward_zero(np.trunc(terms / quantum).sum(axis=-1) * quantum[..., 0])
    return acc.astype(np.float32)


def toward_zero(x: np.ndarray) -> np.ndarray:
    """float64 to the float32 value next to it toward zero (as float64)."""
    f = x.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(x)
    return np.where(over, np.nextafter(f, np.float32(0)), f).astype(np.float64)


__all__ = ["AVX512", "HAVE_NUMBA", "MMA_EXTRA", "MMA_K", "tensor_core", "tensor_core_numpy",
           "toward_zero"]
