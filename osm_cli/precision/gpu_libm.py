"""CUDA's float32 expf, logf and 1/x as compiled without --use_fast_math (PyTorch's build of
FlashAttention-2), instruction by instruction from their sm_90 machine code
(benchmarks/kernel_sass.py; docs/gpu-approx.md#cudas-expf-and-logf).

- `expf(x)`: n = ⌊x·log2e⌋ by a saturated FMA and one rounded toward −∞ against 2^23 + 1,
  r = fma(x, 1.4426950216, −n) then fma(x, 1.925963e-8, r) (log2e in two parts), the
  hardware's ex2 of r (gpu_approx.ex2) times 2^n.
- `logf(x)`: x = 2^e·m with m in [2/3, 4/3) (an integer subtraction of 0x3f2aaaab), f = m − 1,
  a degree-10 polynomial by FMAs, e·ln2 added by a last FMA; 0 → −inf, inf and NaN kept.
- `recip(x)`: 1/x, rcp.approx refined by one Newton step (fma(r, −fma(x, r, −1), r)): the
  correctly rounded reciprocal, which numpy's division gives.
- `fma32(a, b, c)`: a·b + c rounded once to float32, exactly (the float64 sum corrected where
  its own rounding would tip a float32 tie).

Leaves out: the fast-math forms (__expf, __logf: gpu_ops.Ops), denormal results of expf
(below 2^-126 the kernels' inputs never go), double precision.

Example: expf(np.float32([-1.0])) -> [0.36787945]
"""

from __future__ import annotations

import numpy as np

from . import gpu_approx

F32 = np.float32
LOG2E_HI = F32(1.4426950216293334961)
LOG2E_LO = F32(1.925963033500011079e-08)
EXP_STEP = F32(np.uint32(0x3BBB989D).view(F32))  # log2(e) / 252: the saturated FMA's factor
LN2 = F32(0.69314718246459960938)
LOG_POLY = (np.uint32(0x3E055027).view(F32) * F32(-1), F32(0.14084610342979431152),
            F32(-0.12148627638816833496), F32(0.13980610668659210205),
            F32(-0.16684235632419586182), F32(0.20012299716472625732),
            F32(-0.24999669194221496582), F32(0.33333182334899902344), F32(-0.5))


def fma32(a, b, c) -> np.ndarray:
    """a·b + c with one rounding to float32. The product of two float32 is exact in float64;
    the float64 sum s = p + c may itself be rounded, and where s lands exactly halfway
    between two float32 that rounding decides the tie: the error term (two-sum) says which
    way the exact sum lies, and the result steps one float32 that way."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c64 = np.asarray(c, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        r = s.astype(F32)
        lo = np.minimum(r, np.nextafter(r, F32(-np.inf)))
        hi = np.maximum(r, np.nextafter(r, F32(np.inf)))
        other = np.where(s > r.astype(np.float64), hi, lo)  # the float32 on s's other side
        tie = (np.abs(s - r.astype(np.float64)) == np.abs(s - other.astype(np.float64))) \
            & (err != 0) & np.isfinite(s)
    if not np.any(tie):
        return r
    toward = np.where(err > 0, np.nextafter(s, np.inf), np.nextafter(s, -np.inf))
    return np.where(tie, toward.astype(F32), r)


def expf(x) -> np.ndarray:
    """CUDA's expf (module docstring), float32 in, float32 out."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", invalid="ignore"):
        j = np.clip(fma32(x, EXP_STEP, F32(0.5)), F32(0), F32(1))  # FFMA.SAT
        k = np.floor(j.astype(np.float64) * 252.0)  # FFMA.RM(j, 252, 2^23 + 1) − (2^23 + 1)
        n = (k - 126.0).astype(F32)  # FADD(j', −12583039): exact
        r = fma32(x, LOG2E_HI, -n)
        r = fma32(x, LOG2E_LO, r)
        e = gpu_approx.ex2(r)
        scale = ((np.uint32(0x4B400001) + k.astype(np.uint32)) << np.uint32(23)).view(F32)
        y = (scale * e).astype(F32)
    y = np.where(np.isnan(x), x, y)
    return y


def logf(x) -> np.ndarray:
    """CUDA's logf (module docstring), float32 in, float32 out."""
    x = np.asarray(x, dtype=F32)
    small = x < F32(1.175494350822287508e-38)
    xs = np.where(small, (x * F32(8388608)).astype(F32), x)
    adj = np.where(small, F32(-23), F32(0))
    u = xs.view(np.uint32)
    ebits = (u + np.uint32(0xC0D55555)) & np.uint32(0xFF800000)
    m = (u - ebits).view(F32)
    f = (m - F32(1)).astype(F32)
    p = fma32(f, LOG_POLY[0], LOG_POLY[1])
    for coef in LOG_POLY[2:]:
        p = fma32(f, p, coef)
    q = (f * p).astype(F32)
    q = fma32(f, q, f)
    e = fma32(ebits.view(np.int32).astype(F32), F32(1.1920928955078125e-07), adj)
    y = fma32(e, LN2, q)
    with np.errstate(invalid="ignore"):
        special = (xs.astype(np.float64) * np.inf + np.inf).astype(F32)  # NaN below 0
        y = np.where(u >= np.uint32(0x7F800000), special, y)
        y = np.where(xs == 0, F32(-np.inf), y)
    return y.astype(F32)


def recip(x) -> np.ndarray:
    """1/x correctly rounded in float32 (CUDA's 1.f / x without fast math)."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(divide="ignore"):
        return (F32(1) / x).astype(F32)


__all__ = ["expf", "fma32", "logf", "recip"]
