"""The H200's approximate float32 instructions, bit for bit, on the CPU (docs/gpu-approx.md).

Measured over every float32 input on an H200 (benchmarks/measure_gpu_approx.py), each
instruction turned out to be a table lookup after a simple split of the input:

- `ex2` (ex2.approx.ftz.f32): |x| to fixed point with 23 fraction bits, truncated: X =
  trunc(|x|·2^23), i = X >> 23, f = X mod 2^23; x ≥ 0 gives P[f]·2^i, x < 0 gives N[f]·2^-i,
  with P[f] = ex2(f·2^-23) and N[f] = ex2(−f·2^-23) two tables of 2^23 values; results below
  2^-126 flush to +0, above the range to +inf.
- `lg2` (lg2.approx.ftz.f32): x = 2^e·m, m in [1, 2): e + G[m] rounded toward zero, G[m] =
  lg2(m) (a value on a 2^-36 grid); exact for x ≥ 1, where the kernels use it (row sums).
  Below 1 the GPU takes (e + 1) + lg2(m/2), a second table not shipped: there 2.6 % of the
  inputs come out one ulp off (docs/gpu-approx.md).
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
import sys
from pathlib import Path

import numpy as np

from .mma import HAVE_NUMBA

F32 = np.float32
DATA = Path(__file__).resolve().parent / "data" / "gpu_approx_h200.npz"
FEW = 4096  # inputs below which ex2 stays in numpy while numba is not loaded
TANH_LO, TANH_HI = -8, 2  # the input exponents tanh looks up a table for
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


# ----------------------------------------------------------------------------- predictors
# Float64 approximations, by +, ·, / and ldexp alone (the same bits on every platform), that
# the stored tables are differences from: their accuracy (~1e-15) only decides how well the
# differences compress, never a result. Split in two levels so that rebuilding a table of
# 2^23 entries costs a few passes.
def _exp2_taylor(t: np.ndarray) -> np.ndarray:
    """2^t for t in [0, 1), Taylor of e^(t ln 2) from the top (for the small tables)."""
    y = np.asarray(t, dtype=np.float64) * LN2
    p = np.ones_like(y)
    for n in range(18, 0, -1):
        p = 1.0 + p * y / n
    return p


@functools.lru_cache(maxsize=1)
def _exp2_coarse() -> np.ndarray:
    return _exp2_taylor(np.arange(2**11) * 2.0**-11)


def exp2_f64(t: np.ndarray) -> np.ndarray:
    """2^t in float64: 2^k · 2^(a/2^11) (a table) · 2^r, r < 2^-11 by five Taylor terms."""
    t = np.asarray(t, dtype=np.float64)
    k = np.floor(t)
    r = (t - k) * 2.0**11
    a = np.floor(r)
    y = (r - a) * (LN2 * 2.0**-11)
    p = 1.0 + y * (1.0 + y * (0.5 + y * (1.0 / 6 + y * (1.0 / 24 + y / 120))))
    return np.ldexp(_exp2_coarse()[a.astype(np.int64)] * p, k.astype(np.int64))


def _exp2_factors(sign: float) -> tuple[np.ndarray, np.ndarray]:
    """The two small tables whose products are _exp2_grid: 2^(sign·a·2^-11), a < 2^11, and
    2^(sign·b·2^-23), b < 2^12."""
    hi = _exp2_taylor(np.arange(2**11) * 2.0**-11) if sign > 0 else exp2_f64(
        -np.arange(2**11) * 2.0**-11)
    return hi, exp2_f64(sign * np.arange(2**12) * 2.0**-23)


def _exp2_grid(sign: float, a0: int = 0, a1: int = 2**11) -> np.ndarray:
    """2^(sign · j·2^-23) for j < 2^23 as one outer product of two small tables (entry j =
    a·2^12 + b is hi[a]·lo[b]); rows a0:a1 of it (entries a0·2^12 to a1·2^12)."""
    hi, lo = _exp2_factors(sign)
    return np.multiply.outer(hi[a0:a1], lo).reshape(-1)


def _log2_at(j) -> np.ndarray:
    """log2(1 + j·2^-23) for integers 0 ≤ j < 2^23 (any shape): log2(c) for c = 1 + a·2^-11,
    a = j >> 12 (2·atanh series), plus log2(1 + u), u = b·2^-23 / c < 2^-11, b = j mod 2^12,
    by five terms. Entry by entry, so a few entries cost a few (entries() looks up these)."""
    j = np.asarray(j, dtype=np.int64)
    c = 1.0 + (j >> 12) * 2.0**-11
    s = (c - 1.0) / (c + 1.0)
    s2 = s * s
    q = np.full_like(s, 1.0 / 41)
    for n in range(39, 0, -2):
        q = 1.0 / n + q * s2
    u = (1.0 / c) * ((j & 4095) * 2.0**-23)
    p = u * 0.2
    for coef in (-0.25, 1.0 / 3, -0.5, 1.0):
        p += coef
        p *= u
    p *= LOG2E
    p += 2.0 * s * q * LOG2E
    return p


def _rcp_at(j) -> np.ndarray:
    """1 / (1 + j·2^-23) for integers 0 ≤ j < 2^23."""
    return 1.0 / (1.0 + np.asarray(j, dtype=np.int64) * 2.0**-23)


AT = {"lg2": _log2_at, "rcp": _rcp_at}  # the predictions computed entry by entry


def _tanh_rows(e: int, d: int) -> int:
    """How many rows (values of a) _tanh_grid(e, d) has."""
    n = 23 - d
    return 2 ** (n - n // 2)


def _tanh_grid(e: int, d: int, a0: int = 0, a1: int | None = None) -> np.ndarray:
    """tanh(x) at x = 2^e·(1 + j·2^(d−23)), j < 2^(23−d): (1 − u)/(1 + u) with u =
    2^(t0 + j·δ) = 2^(t0 + a·2^h·δ) · 2^(b·δ), one outer product (j = a·2^h + b); rows a0:a1."""
    n = 23 - d
    h = n // 2
    delta = -2.0 * LOG2E * 2.0 ** (e + d - 23)
    t0 = -2.0 * LOG2E * 2.0**e
    a = np.arange(2 ** (n - h))[a0:a1]
    hi = exp2_f64(t0 + a * (2.0**h * delta))
    lo = exp2_f64(np.arange(2**h) * delta)
    u = np.multiply.outer(hi, lo).reshape(-1)
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
    as float32 bits. Made 2^7 rows (2^19 entries) at a time: the same elementwise arithmetic
    as one pass over the whole grid, without its float64 temporaries (a few hundred MB)."""
    if name in ("ex2_pos", "ex2_neg"):
        sign = 1.0 if name == "ex2_pos" else -1.0
        rows, grid = 2**11, functools.partial(_exp2_grid, sign)
    elif name in AT:
        rows = 2**11
        def grid(a0, a1):
            return AT[name](np.arange(a0 * 2**12, a1 * 2**12))
    else:
        e = int(name.split("_")[1])
        rows, grid = _tanh_rows(e, tanh_drop()[e]), functools.partial(_tanh_grid, e,
                                                                     tanh_drop()[e])
    out, at = None, 0
    for a0 in range(0, rows, 2**7):
        part = bits(grid(a0, min(rows, a0 + 2**7)).astype(F32))
        if out is None:
            out = np.empty(part.size * -(-rows // 2**7), np.int32)
        out[at:at + part.size] = part
        at += part.size
    return out[:at]


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


def differences(stored: np.ndarray) -> np.ndarray:
    """A stored table's differences from its prediction, in units of the last place."""
    raw = lzma.decompress(np.asarray(stored, dtype=np.uint8).tobytes())
    return np.frombuffer(raw[1:], dtype=np.dtype(raw[:1].decode()))


def unpack(name: str, stored: np.ndarray) -> np.ndarray:
    val = predicted(name)  # int32 bits, fresh: the differences are added in place
    val += differences(stored)
    return from_bits(val)


@functools.lru_cache(maxsize=8)
def _differences(name: str, path: str | None = None) -> np.ndarray:
    with np.load(path or DATA) as z:
        return differences(z[name])


def entries(name: str, j, path: str | None = None) -> np.ndarray:
    """table(name)[j] for lg2 and rcp without the table: the prediction at j plus the stored
    difference, the same bits (the kernels look up one entry a row: a 32 MB table for a few
    thousand entries is what made a layer's check cost 1 GB)."""
    val = bits(AT[name](j).astype(F32)) + _differences(name, path)[j]
    return from_bits(val.astype(np.int32, copy=False))


@functools.lru_cache(maxsize=64)
def table(name: str, path: str | None = None) -> np.ndarray:
    """One measured table as float32 values (read and rebuilt once, on first use)."""
    with np.load(path or DATA) as z:
        return unpack(name, z[name])


@functools.lru_cache(maxsize=4)
def ex2_compact(path: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """ex2's tables N and P (rows 0 and 1) as ex2 reads them, 4 MB where the tables take 64:
    the prediction's two factors (_exp2_factors, float64, 2^11 and 2^12 a row) and each
    entry's difference from the prediction's float32 plus 2, in 2 bits, 4 to a byte (entry j
    in bits 2·(j mod 4) of byte j // 4); None where a difference is outside −2…1 (the H200's
    are inside): ex2 then looks up the whole tables."""
    his, los, packs = [], [], []
    with np.load(path or DATA) as z:
        for name, sign in (("ex2_neg", -1.0), ("ex2_pos", 1.0)):
            d = differences(z[name]).astype(np.int16) + 2
            if d.size != 2**23 or d.min() < 0 or d.max() > 3:
                return None
            four = d.astype(np.uint8).reshape(-1, 4)
            packs.append(four[:, 0] | four[:, 1] << 2 | four[:, 2] << 4 | four[:, 3] << 6)
            hi, lo = _exp2_factors(sign)
            his.append(hi)
            los.append(lo)
    return np.stack(his), np.stack(los), np.stack(packs)


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
    """ex2.approx.ftz.f32 of float32 x (any shape), as the H200 computes it: compiled where
    numba is installed (_approx_numba.py), else in numpy (ex2_numpy), the same bits; a few
    inputs stay in numpy until numba is loaded anyway (its import costs more than they do)."""
    x = np.asarray(x, dtype=F32)
    compact = ex2_compact(path)
    if compact is None or not HAVE_NUMBA or (x.size < FEW and "numba" not in sys.modules):
        return ex2_numpy(x, path)
    from ._approx_numba import ex2 as compiled

    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, F32)
    compiled(flat, *compact, out)
    return out.reshape(x.shape)


def ex2_numpy(x, path: str | None = None) -> np.ndarray:
    """ex2 in numpy: the fixed-point split and the lookups (ex2_compact's, or the whole
    tables') as whole-array passes."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x).astype(np.float64)
    fin = a < 256.0
    X = np.floor(np.where(fin, a, 0.0) * 2.0**23).astype(np.int64)
    i, f = X >> 23, X & (2**23 - 1)
    neg = np.signbit(x)
    compact = ex2_compact(path)
    if compact is None:
        t = tables(path)
        v = np.where(neg, t["ex2_neg"][f], t["ex2_pos"][f]).astype(np.float64)
    else:
        hi, lo, packed = compact
        row = (~neg).astype(np.intp)
        pred = bits((hi[row, f >> 12] * lo[row, f & 4095]).astype(F32))
        diff = (packed[row, f >> 2] >> ((f & 3) * 2).astype(np.uint8)) & 3
        v = from_bits(pred + diff.astype(np.int32) - 2).astype(np.float64)
    with np.errstate(over="ignore"):
        y = np.ldexp(v, np.where(neg, -i, i))
        y = np.where(y < 2.0**-126, 0.0, y)
        y = np.where(fin, y, np.where(neg, 0.0, np.inf)).astype(F32)
    return np.where(np.isnan(x), x, y)


def _mantissa_split(x, name: str, path: str | None):
    """x as float32, its bits, its unbiased exponent e, and table name at its mantissa."""
    x = np.asarray(x, dtype=F32)
    b = bits(x).astype(np.int64)
    e = ((b >> 23) & 255) - 127
    return x, b, e, entries(name, b & 0x7FFFFF, path).astype(np.float64)


def lg2(x, path: str | None = None) -> np.ndarray:
    """lg2.approx.ftz.f32 of float32 x: bit-exact for x ≥ 1 (docs/gpu-approx.md)."""
    x, b, e, g = _mantissa_split(x, "lg2", path)
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
    x, b, e, v = _mantissa_split(x, "rcp", path)
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


__all__ = ["DATA", "differences", "entries", "ex2", "ex2_compact", "ex2_numpy", "exp2_f64", "lg2",
           "pack", "predicted", "rcp", "table", "tables", "tanh", "tanh_drop", "unpack"]
