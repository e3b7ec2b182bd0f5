"""The H200's approximate float32 instructions, bit for bit, on the CPU (docs/gpu-approx.md).

Measured over every float32 input on an H200 (benchmarks/measure_gpu_approx.py), each
instruction turned out to be a table lookup after a simple split of the input:

- `ex2` (ex2.approx.ftz.f32): |x| to fixed point with 23 fraction bits, truncated: X =
  trunc(|x|·2^23), i = X >> 23, f = X mod 2^23; x ≥ 0 gives P[f]·2^i, x < 0 gives N[f]·2^-i,
  with P[f] = ex2(f·2^-23) and N[f] = ex2(−f·2^-23) two tables of 2^23 values; results below
  2^-126 flush to +0, above the range to +inf.
- `lg2` (lg2.approx.ftz.f32): x = 2^e·m, m in [1, 2): e + G[m] rounded toward zero, G[m] =
  lg2(m) (a value on a 2^-36 grid); exact for x ≥ 1, where the kernels use it (row sums).
  Below 1 the GPU adds finer bits of G than its float32 value keeps (docs say how often).
- `rcp` (rcp.approx.ftz.f32): R[m]·2^-e with R[m] = rcp(m), the sign kept; ftz.
- `tanh` (tanh.approx.f32): odd; x itself for |x| < 2^-8, ±1 for |x| ≥ 8; between, per input
  exponent a table over the input's mantissa truncated to a band's number of bits.

The tables live in data/gpu_approx_h200.npz, each stored as the difference (in units of the
last place) from a float64 approximation computed here with +, ·, / alone,
so the reconstruction is the same on every platform; lzma keeps them small.

Leaves out: other GPUs (no other was measured), the non-ftz forms (they differ only where
results or inputs are subnormal), sin/cos.

Example: ex2(np.float32([-1.5])) -> [0.35355335] (the H200's value; 2^-1.5 = 0.35355339)
"""

from __future__ import annotations

import functools
import lzma
import math
from pathlib import Path

import numpy as np

F32 = np.float32
DATA = Path(__file__).resolve().parent / "data" / "gpu_approx_h200.npz"
TANH_LO, TANH_HI = -8, 2  # the input exponents tanh looks up a table for
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


# ----------------------------------------------------------------------------- predictors
def exp2_f64(t: np.ndarray) -> np.ndarray:
    """2^t in float64 to ~1e-16, by +, · and ldexp only (the same bits on every platform)."""
    t = np.asarray(t, dtype=np.float64)
    k = np.floor(t)
    y = (t - k) * LN2  # in [0, ln 2)
    p = np.ones_like(y)
    for n in range(18, 0, -1):  # e^y, Taylor, Horner from the top
        p = 1.0 + p * y / n
    return np.ldexp(p, k.astype(np.int64))


def log2_f64(m: np.ndarray) -> np.ndarray:
    """log2(m) for m in [1, 2] in float64, 2·atanh(s)/ln 2 with s = (m − 1)/(m + 1) ≤ 1/3."""
    m = np.asarray(m, dtype=np.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = np.full_like(s, 1.0 / 41)
    for n in range(39, 0, -2):
        p = 1.0 / n + p * s2
    return 2.0 * s * p * LOG2E


def tanh_f64(x: np.ndarray) -> np.ndarray:
    """tanh(|x|) in float64 for 2^-9 ≤ |x| ≤ 16: (1 − u)/(1 + u), u = 2^(−2|x|·log2 e)."""
    u = exp2_f64(-2.0 * np.abs(np.asarray(x, dtype=np.float64)) * LOG2E)
    return (1.0 - u) / (1.0 + u)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32).view(np.int32)


def from_bits(b) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.int32).view(F32)


# ----------------------------------------------------------------------------- tables
def tanh_drop() -> dict:
    """Per input exponent E, how many low mantissa bits tanh ignores (measured)."""
    return {-8: 6, -7: 6, -6: 6, -5: 5, -4: 5, -3: 4, -2: 4, -1: 4, 0: 3, 1: 2, 2: 3}


def predicted(name: str) -> np.ndarray:
    """The float64 predictions the stored differences are taken from, per table entry:
    as float32 bits."""
    j = np.arange(2**23, dtype=np.float64)
    if name == "ex2_pos":
        return bits(exp2_f64(j * 2.0**-23).astype(F32)).astype(np.int64)
    if name == "ex2_neg":
        return bits(exp2_f64(-j * 2.0**-23).astype(F32)).astype(np.int64)
    if name == "rcp":
        return bits((1.0 / (1.0 + j * 2.0**-23)).astype(F32)).astype(np.int64)
    if name == "lg2":
        return bits(log2_f64(1.0 + j * 2.0**-23).astype(F32)).astype(np.int64)
    e = int(name.split("_")[1])
    d = tanh_drop()[e]
    x = from_bits(((e + 127) << 23) | (np.arange(2 ** (23 - d), dtype=np.int32) << d))
    return bits(tanh_f64(x).astype(F32)).astype(np.int64)


def table_names() -> list:
    return ["ex2_pos", "ex2_neg", "lg2", "rcp"] + [f"tanh_{e}" for e in
                                                    range(TANH_LO, TANH_HI + 1)]


def pack(name: str, measured: np.ndarray) -> np.ndarray:
    """A measured table (float32 values) as the stored bytes: lzma of the differences."""
    m = np.asarray(measured)
    diff = bits(m).astype(np.int64) - predicted(name)
    a = int(np.abs(diff).max()) if diff.size else 0
    dt = np.int8 if a < 2**7 else np.int16 if a < 2**15 else np.int32
    raw = np.dtype(dt).char.encode() + diff.astype(dt).tobytes()
    return np.frombuffer(lzma.compress(raw, preset=6), dtype=np.uint8)


def unpack(name: str, stored: np.ndarray) -> np.ndarray:
    raw = lzma.decompress(np.asarray(stored, dtype=np.uint8).tobytes())
    val = predicted(name) + np.frombuffer(raw[1:], dtype=np.dtype(raw[:1].decode()))
    return from_bits(val.astype(np.int32))


@functools.lru_cache(maxsize=64)
def table(name: str, path: str | None = None) -> np.ndarray:
    """One measured table as float32 values (read and rebuilt once, on first use)."""
    with np.load(path or DATA) as z:
        return unpack(name, z[name])


class _Tables:
    """t[name] -> table(name, path): each table read only when an op first needs it."""

    def __init__(self, path):
        self.path = path

    def __getitem__(self, name):
        return table(name, self.path)


def tables(path: str | None = None) -> _Tables:
    return _Tables(path)


# ----------------------------------------------------------------------------- the ops
def ex2(x, path: str | None = None) -> np.ndarray:
    """ex2.approx.ftz.f32 of float32 x (any shape), as the H200 computes it."""
    t = tables(path)
    x = np.asarray(x, dtype=F32)
    a = np.abs(x).astype(np.float64)
    fin = a < 256.0
    X = np.floor(np.where(fin, a, 0.0) * 2.0**23).astype(np.int64)
    i, f = X >> 23, X & (2**23 - 1)
    neg = np.signbit(x)
    v = np.where(neg, t["ex2_neg"][f], t["ex2_pos"][f]).astype(np.float64)
    with np.errstate(over="ignore"):
        y = np.ldexp(v, np.where(neg, -i, i))
        y = np.where(y < 2.0**-126, 0.0, y)
        y = np.where(fin, y, np.where(neg, 0.0, np.inf)).astype(F32)
    return np.where(np.isnan(x), x, y)


def lg2(x, path: str | None = None) -> np.ndarray:
    """lg2.approx.ftz.f32 of float32 x: bit-exact for x ≥ 1 (docs/gpu-approx.md)."""
    t = tables(path)
    x = np.asarray(x, dtype=F32)
    b = bits(x).astype(np.int64)
    e = ((b >> 23) & 255) - 127
    g = t["lg2"][b & 0x7FFFFF].astype(np.float64)
    v = e + g
    y = v.astype(F32)
    over = np.abs(y.astype(np.float64)) > np.abs(v)  # toward zero
    y = np.where(over, np.nextafter(y, F32(0)), y)
    y = np.where(e == -127, F32(-np.inf), y)  # zero and (flushed) subnormals
    y = np.where(np.signbit(x) & (e > -127), F32(np.nan), y)
    y = np.where(e == 128, np.where(b & 0x7FFFFF, F32(np.nan), F32(np.inf)), y)
    return np.where(np.signbit(x) & (e == 128), F32(np.nan), y).astype(F32)


def rcp(x, path: str | None = None) -> np.ndarray:
    """rcp.approx.ftz.f32 of float32 x."""
    t = tables(path)
    x = np.asarray(x, dtype=F32)
    b = bits(x).astype(np.int64)
    e = ((b >> 23) & 255) - 127
    v = t["rcp"][b & 0x7FFFFF].astype(np.float64)
    with np.errstate(over="ignore"):
        y = np.ldexp(v, np.clip(-e, -200, 200))
    y = np.where(y < 2.0**-126, 0.0, y)
    y = np.where(e == -127, np.inf, y)
    y = np.where(e == 128, np.where(b & 0x7FFFFF, np.nan, 0.0), y).astype(F32)
    return np.where(np.signbit(x), -y, y)


def tanh(x, path: str | None = None) -> np.ndarray:
    """tanh.approx.f32 of float32 x."""
    t = tables(path)
    x = np.asarray(x, dtype=F32)
    b = bits(x).astype(np.int64) & 0x7FFFFFFF
    e = (b >> 23) - 127
    y = np.where(e >= 3, F32(1), np.abs(x))
    for E in range(TANH_LO, TANH_HI + 1):
        sel = e == E
        if sel.any():
            d = tanh_drop()[E]
            y[sel] = t[f"tanh_{E}"][(b[sel] & 0x7FFFFF) >> d]
    y = np.where(np.isnan(x), x, y)
    return np.where(np.signbit(x), -y, y).astype(F32)


__all__ = ["DATA", "ex2", "exp2_f64", "lg2", "log2_f64", "pack", "predicted", "rcp", "tables",
           "tanh", "tanh_drop", "tanh_f64", "unpack"]
