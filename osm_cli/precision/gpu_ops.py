"""The GPU's float32 arithmetic as the kernels use it, on the CPU
(docs/numerics.md#kernel-presets, #tensor-cores).

- `fma(a, b, c)`: a·b + c rounded once (the float64 product of two float32 is exact; the sum is
  rounded to float64 first, which differs from one rounding about once in 2^29).
- `matmul(a, b, how, c)`: a @ b (+ c) in float32, by BLAS or as the tensor cores accumulate:
  products summed 16 at a time (the k of one MMA instruction), each term aligned to the
  largest and truncated 2 bits below float32's last, the accumulator truncated toward zero.
- `exp2_emulated`: FA4 SM100's software exp2.
- `Ops`: the approximate instructions (ex2, tanh, rcp, lg2): the H200's own by default
  (gpu_approx.py), correctly rounded (Ops.rounded()), or other callables.
- `row_sums`, `quad_sum`: the order in which a kernel's threads add a row's P into l.

Leaves out: the loop that uses them (emulate.py).

Example: fma(np.float32([3]), np.float32(1 / 3), np.float32([-1])) -> [~2.98e-08]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import gpu_approx
from .mma import tensor_core, toward_zero
from .names import MMAS

LOG2E = math.log2(math.e)  # the kernels' LOG2_E / M_LOG2E, a float32 constant on the GPU
LN2 = math.log(2.0)
F32 = np.float32
EXP2_EMU = (1.0, 0.695146143436431884765625, 0.227564394474029541015625,
            0.077119089663028717041015625)  # FA4 SM100's 2^f on [0, 1), Horner from the top


@dataclass(frozen=True)
class Ops:
    """The GPU's approximate instructions: exp2 (ex2.approx.ftz), tanh (tanh.approx), 1/x
    (rcp.approx.ftz) and log2 (lg2.approx.ftz, behind __logf) in float32. By default the
    H200's own, bit for bit (gpu_approx.py: measured over every float32 input,
    docs/gpu-approx.md); a field set to None is computed correctly rounded on the CPU
    (Ops.rounded(): all four, osm's arithmetic before the measurements); an ablation passes
    other callables (benchmarks/kernel_ablation.py)."""

    ex2: Callable | None = gpu_approx.ex2
    tanh: Callable | None = gpu_approx.tanh
    rcp: Callable | None = gpu_approx.rcp
    lg2: Callable | None = gpu_approx.lg2

    @classmethod
    def rounded(cls) -> Ops:
        """Every op correctly rounded on the CPU (no GPU's approximations)."""
        return cls(ex2=None, tanh=None, rcp=None, lg2=None)

    def _measured(self, op: Callable | None, x):
        """op's values for x as a fresh float32 array (the loop rounds P in place), or None
        where osm computes the op itself."""
        return None if op is None else np.array(op(np.asarray(x, dtype=F32)), dtype=F32)

    def exp2(self, x: np.ndarray) -> np.ndarray:
        y = self._measured(self.ex2, x)
        with np.errstate(over="ignore"):
            return np.exp2(x, dtype=F32) if y is None else y

    def tanh_(self, x: np.ndarray) -> np.ndarray:
        y = self._measured(self.tanh, x)
        return np.tanh(x.astype(np.float64)).astype(F32) if y is None else y

    def log2(self, x: np.ndarray) -> np.ndarray:
        y = self._measured(self.lg2, x)
        with np.errstate(divide="ignore"):
            return np.log2(x, dtype=F32) if y is None else y

    def recip(self, x: np.ndarray) -> np.ndarray:
        y = self._measured(self.rcp, x)
        return (F32(1) / x).astype(F32) if y is None else y


def exp2_emulated(x: np.ndarray) -> np.ndarray:
    """FA4 SM100's software exp2 (docs/numerics.md#kernel-presets): x clamped at −127, its
    integer part split off by floor, 2^f on [0, 1) by a degree-3 polynomial (Horner, fused
    multiply-adds in float32), the integer part added to the exponent bits.

    Example: exp2_emulated(np.float32([0.5])) -> [1.414104] (7.7e-5 below √2: its error)
    """
    x = np.asarray(x, dtype=F32)
    zero = ~(x > F32(-127.0))  # -127 and below, -inf and NaN give +0 (fmax, then the bits)
    with np.errstate(invalid="ignore", over="ignore"):
        xc = np.maximum(x, F32(-127.0))
        j = np.floor(xc)
        f = np.subtract(xc, j).astype(np.float64)  # exact: x − floor(x) fits float32
        p = (f * EXP2_EMU[3] + EXP2_EMU[2]).astype(F32)  # Horner: each step one fma
        for coef in EXP2_EMU[1::-1]:
            p64 = p.astype(np.float64)
            p64 *= f
            p64 += coef
            p = p64.astype(F32)
        bits_ = p.view(np.int32)
        bits_ += j.astype(np.int32) << 23  # the integer part into the exponent bits
    if zero.any():
        bits_[zero] = 0
    top = np.isposinf(x)
    if top.any():
        p[top] = np.inf
    return p


def matmul(a: np.ndarray, b: np.ndarray, how: str, c: np.ndarray | None = None) -> np.ndarray:
    """a @ b (+ c) in float32: BLAS, or the tensor cores' accumulation (module docstring;
    mma.tensor_core, compiled where numba is installed)."""
    if how == "blas":
        prod = np.matmul(a, b)
        return prod if c is None else np.add(c, prod, out=prod)
    return tensor_core(a, b, c)


def fma(a: np.ndarray, b, c) -> np.ndarray:
    """a·b + c rounded once to float32 (the float64 product of two float32 is exact)."""
    return (a.astype(np.float64) * b + c).astype(F32)


def row_sums(how: str, lanes: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The running row sums after one tile, as the kernel's threads add them: "quad" (FA2,
    FA4 SM90) four threads' sums kept apart (lane_sums); "eight" (FA4 SM100) one thread's row
    summed in eight running sums by column mod 8, the old sum folded into the first, then
    ((L0 + L2) + (L4 + L6)) + ((L1 + L3) + (L5 + L7)), kept in lane 0; "plain" numpy's sum."""
    if how == "quad":
        return lane_sums(lanes, p)
    if how == "plain":
        lanes[..., 0] += p.sum(axis=-1, dtype=F32)
        return lanes
    w = p.shape[-1]
    pad = -w % 8
    if pad:
        p = np.concatenate([p, np.zeros((*p.shape[:-1], pad), dtype=F32)], axis=-1)
    cols = p.reshape(-1, p.shape[-1] // 8, 8)  # (rows, j, column mod 8)
    seq = np.zeros((1 + cols.shape[1], cols.shape[0], 8), dtype=F32)
    seq[0, :, 0] = (lanes[..., 0] + lanes[..., 1] + lanes[..., 2] + lanes[..., 3]).reshape(-1)
    seq[1:] = cols.transpose(1, 0, 2)
    a = np.add.reduce(seq, axis=0).reshape(*p.shape[:-1], 8)  # row by row: j in order
    total = (((a[..., 0] + a[..., 2]) + (a[..., 4] + a[..., 6]))
             + ((a[..., 1] + a[..., 3]) + (a[..., 5] + a[..., 7]))).astype(F32)
    lanes[...] = 0
    lanes[..., 0] = total
    return lanes


def lane_sums(lanes: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Each quad thread's running sum: its old sum, then its columns 8j + 2·lane + {0, 1}
    added one at a time in that order. The columns are laid out in that order along the first
    axis (one copy), below the old sums, and np.add.reduce adds along a first axis one row at a
    time, vectorized over the rest."""
    w = p.shape[-1]
    pad = -w % 8
    if pad:
        p = np.concatenate([p, np.zeros((*p.shape[:-1], pad), dtype=F32)], axis=-1)
    lead = p.shape[:-1]
    cols = p.reshape(-1, p.shape[-1] // 8, 4, 2)  # (rows, j, lane, e)
    seq = np.empty((1 + cols.shape[1] * 2, cols.shape[0], 4), dtype=F32)
    seq[0] = lanes.reshape(-1, 4)
    seq[1:].reshape(cols.shape[1], 2, cols.shape[0], 4)[...] = cols.transpose(1, 3, 0, 2)
    return np.add.reduce(seq, axis=0).reshape(*lead, 4)


def quad_sum(lanes: np.ndarray) -> np.ndarray:
    """The quad's butterfly sum (shfl_xor 2 then 1): (l0 + l2) + (l1 + l3)."""
    return ((lanes[..., 0] + lanes[..., 2]).astype(F32)
            + (lanes[..., 1] + lanes[..., 3]).astype(F32)).astype(F32)


__all__ = ["EXP2_EMU", "F32", "LN2", "LOG2E", "MMAS", "Ops", "exp2_emulated", "fma", "lane_sums",
           "matmul", "quad_sum", "row_sums", "toward_zero"]
