"""The dtypes osm knows, their limits, and rounding to them.

float16 and float64 come from numpy; bfloat16 and the float8 formats from ml_dtypes. Every
threshold is computed from finfo at run time (docs/numerics.md#dtype-limits). Rounding is
round-to-nearest-even by numpy/ml_dtypes `astype`; values are carried in float32 (float64 for
float64) holding exactly the dtype's numbers, because numpy's matmul has no 16- or 8-bit path.
Leaves out: where a kernel rounds (model.py), verdicts (rule.py).

Example: round_to(np.array([1 / 3]), DTYPES["bfloat16"]) -> [0.333984375]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from osm_cli.errors import OsmError
from osm_cli.flash.shapes import check_finite

from .names import canonical

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}


def resolve_dtype(name: str) -> tuple[str, np.dtype]:
    """(canonical name, dtype) for a dtype name or alias. Example: resolve_dtype("bf16")."""
    key = canonical(name)
    return key, DTYPES[key]


def finfo(dtype: np.dtype):
    """finfo for numpy's and ml_dtypes' floating types alike."""
    return ml_dtypes.finfo(dtype)


@dataclass(frozen=True)
class Limits:
    """Where exp leaves a dtype's range: overflow to inf above, underflow to 0 below."""

    max_finite: float
    overflow_at: float
    underflow_at: float


def limits(dtype: np.dtype) -> Limits:
    """exp(x) overflows for x > ln(max finite) and rounds to 0 below ln(smallest subnormal / 2).

    Half the smallest subnormal is the tie that round-to-nearest-even sends to 0.
    Example: limits(np.dtype(np.float16)) -> Limits(65504.0, 11.09, -17.33)
    """
    fi = finfo(dtype)
    tiny = float(fi.smallest_subnormal)
    return Limits(float(fi.max), math.log(float(fi.max)), math.log(tiny) - math.log(2.0))


def bits(dtype) -> int:
    """Storage bits of a dtype. Example: bits(DTYPES["bfloat16"]) -> 16."""
    return int(finfo(dtype).bits)


def carrier(dtype) -> np.dtype:
    """The numpy dtype that carries a dtype's values exactly: float64 for float64, else float32."""
    return np.dtype(np.float64) if bits(dtype) > 32 else np.dtype(np.float32)


def has_inf(dtype) -> bool:
    """False for float8_e4m3fn, whose overflow (and -inf) becomes nan."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isinf(np.array(np.inf).astype(dtype).astype(np.float64)))


PIECE = 1 << 20  # elements a piece: what blocks() cuts a tensor into (8 MiB of float64)


def blocks(shape: tuple, limit: int = PIECE):
    """Index tuples that cover an array of `shape` in pieces of at most about `limit` elements,
    cut along its leading axes (a piece is a view of any array of that shape)."""
    k = 0
    while k < len(shape) - 1 and math.prod(shape[k + 1:]) > limit:
        k += 1
    if not shape:
        yield ()
        return
    step = max(1, limit // max(1, math.prod(shape[k + 1:])))
    for lead in np.ndindex(*shape[:k]):
        for i0 in range(0, shape[k], step):
            yield (*lead, slice(i0, i0 + step))


def round_to(x, dtype, like=None) -> np.ndarray:
    """x rounded to `dtype` (round to nearest even, numpy/ml_dtypes astype), carried in `like`.

    `like` defaults to carrier(dtype). Overflow gives ±inf (nan in float8_e4m3fn); magnitudes
    below half the smallest subnormal give 0. A float64 input goes to bfloat16 and float8 through
    float32, as ml_dtypes (and PyTorch) convert.

    Example: round_to(np.array([1 / 3]), DTYPES["bfloat16"]) -> [0.333984375]
    """
    dt = np.dtype(dtype)
    like = carrier(dt) if like is None else np.dtype(like)
    x = np.asarray(x)
    if x.dtype == dt == like:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        if x.size <= PIECE:
            return x.astype(dt).astype(like)
        out = np.empty_like(x, dtype=like)  # a piece at a time: no whole narrow copy beside it
        for ix in blocks(x.shape):
            out[ix] = x[ix].astype(dt)
        return out


def ulp(x, dtype) -> np.ndarray:
    """The spacing of `dtype` at |x|: 2^(e − mantissa bits), subnormal spacing below the normals.

    Example: ulp(1.0, DTYPES["float16"]) -> 2^-10; ulp(300.0, DTYPES["bfloat16"]) -> 2.0
    """
    fi = finfo(dtype)
    a = np.maximum(np.abs(np.asarray(x, dtype=np.float64)), float(fi.smallest_normal))
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.floor(np.log2(np.where(np.isfinite(a), a, float(fi.max))))
    return np.ldexp(1.0, (e - int(fi.nmant)).astype(int))


@dataclass(frozen=True)
class Rounding:
    """What rounding one array to a dtype did: how many values moved, overflowed, underflowed."""

    name: str
    size: int
    changed: int
    overflowed: int  # finite values that became ±inf (nan in a dtype without inf)
    underflowed: int  # non-zero values that became 0
    max_abs_change: float  # over the values that stayed finite


def rounding(name: str, x: np.ndarray, r: np.ndarray) -> Rounding:
    """Compare x with its rounded copy r. -inf in x (a mask) counts as unchanged."""
    # In float32 unless x needs float64: the comparisons are exact either way, and cheaper.
    wide = np.float64 if np.float64 in (np.asarray(x).dtype, np.asarray(r).dtype) else np.float32
    x64, r64 = np.asarray(x, dtype=wide), np.asarray(r, dtype=wide)
    finite = np.isfinite(x64)
    over = finite & ~np.isfinite(r64)
    under = finite & (x64 != 0) & (r64 == 0)
    moved = finite & np.isfinite(r64) & (x64 != r64)
    with np.errstate(invalid="ignore"):
        change = np.abs(np.where(moved, r64 - x64, 0.0))
    return Rounding(name, int(x64.size), int(np.count_nonzero(moved | over)),
                    int(np.count_nonzero(over)), int(np.count_nonzero(under)),
                    float(change.max(initial=0.0)))


def round_inputs(arrays: dict, dtype) -> tuple[tuple, tuple[Rounding, ...]]:
    """Attention inputs rounded to dtype, carried in float32 (float64 for float64); an input
    that rounding leaves unchanged comes back as a read-only view of itself.

    Raises OsmError for non-finite inputs and for values the dtype cannot hold (overflow).
    Example: (q, k, v), notes = round_inputs({"Q": q, "K": k, "V": v}, DTYPES["bfloat16"])
    """
    name_of = dtype_name(dtype)
    lim = float(finfo(dtype).max)
    rounded, notes = [], []
    for name, x in arrays.items():
        x = np.asarray(x)
        check_finite(x if x.dtype.kind == "f" else x.astype(np.float32), name, bhnd=False)
        r = round_to(x, dtype)
        note = rounding(name, x, r)
        if note.overflowed:
            over = np.abs(np.asarray(x, dtype=np.float64)) > lim
            at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(over)[0]), x.shape))
            raise OsmError(
                f"{name}: {note.overflowed} value(s) overflow {name_of} (largest finite "
                f"{lim:g}), the first {float(np.asarray(x)[at]):g} at index {at}; scale the "
                "inputs or pick a wider `dtype`"
            )
        if not note.changed and x.dtype == r.dtype:
            # nothing moved: the input itself, read-only (a check of a realistic layer holds
            # Q, K, V once, not twice: benchmarks/bench_check.py)
            r = x.view()
            r.flags.writeable = False
        rounded.append(r)
        notes.append(note)
    return tuple(rounded), tuple(notes)


def shared_narrow(*arrays) -> str | None:
    """The name of the dtype the arrays share when numpy has no arithmetic of its own for it
    (bfloat16, float8), else None: what attention's --dtype defaults to, since such inputs can
    only have come from a kernel in that dtype. float16 inputs keep the plain float32 run.
    Example: shared_narrow(q.astype(DTYPES["bfloat16"]), ...) -> "bfloat16"
    """
    kinds = {np.asarray(a).dtype for a in arrays}
    if len(kinds) != 1:
        return None
    (dt,) = kinds
    name = dtype_name(dt)
    return name if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else None


def dtype_name(dtype) -> str:
    """The canonical name of a dtype osm knows (else numpy's name)."""
    dt = np.dtype(dtype)
    return next((n for n, d in DTYPES.items() if d == dt), dt.name)


def fitting_16bit(*arrays) -> str | None:
    """The 16-bit dtype (bfloat16, then float16) every value of every array fits (a kernel
    preset takes 16-bit inputs; float32 arrays may hold them); None if neither.

    Example: fitting_16bit(np.float32([1.5, 2.0])) -> "bfloat16"
    """
    def fits(x, narrow):
        x = np.asarray(x, dtype=np.float64)
        return np.array_equal(round_to(x, DTYPES[narrow], np.float64), x, equal_nan=True)

    for narrow in ("bfloat16", "float16"):
        if all(fits(x, narrow) for x in arrays):
            return narrow
    return None
