"""Number formats: the dtypes osm knows, their limits, and where exp breaks in each.

float16 and float64 come from numpy; bfloat16 and the float8 formats from ml_dtypes. Every
threshold is computed from finfo at run time (NUMERICS §6 is the check, not the source).
Leaves out: the algorithm itself (online.py) and printing (render.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import OsmError
from .online import online_softmax
from .reference import naive_softmax, stable_softmax

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
ALIASES = {
    "fp64": "float64", "double": "float64", "f64": "float64",
    "fp32": "float32", "single": "float32", "f32": "float32",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
}


def resolve_dtype(name: str) -> tuple[str, np.dtype]:
    """(canonical name, dtype) for a dtype name or alias. Example: resolve_dtype("bf16")."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        known = ", ".join([*DTYPES, *ALIASES])
        raise OsmError(f"unknown dtype {name!r}; known: {known}")
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


# ---------------------------------------------------------------------------------------------
# overflow-demo

DEMO_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class DemoRow:
    dtype: str
    max_finite: float
    overflow_at: float
    underflow_at: float
    exp: np.ndarray
    naive: np.ndarray
    stable: np.ndarray
    online: np.ndarray


@dataclass(frozen=True)
class Demo:
    values: np.ndarray
    rows: tuple[DemoRow, ...]
    overflow_note: str
    masked: tuple[tuple[str, np.ndarray, str], ...]
    masked_note: str


def overflow_demo(values=(100.0, 102.0, 99.0), dtypes=DEMO_DTYPES) -> Demo:
    """Each method of softmax computed in each dtype, and the fully masked row."""
    xs = np.asarray(values, dtype=np.float64)
    rows = []
    for name in dtypes:
        dt = DTYPES[name]
        lim = limits(dt)
        x = xs.astype(dt)
        with np.errstate(over="ignore"):
            e = np.exp(x)
        rows.append(
            DemoRow(
                name, lim.max_finite, lim.overflow_at, lim.underflow_at,
                e.astype(np.float64), naive_softmax(x).astype(np.float64),
                stable_softmax(x).astype(np.float64),
                online_softmax(x, block=max(1, (len(xs) + 1) // 2)).probabilities.astype(
                    np.float64
                ),
            )
        )
    broken = [r for r in rows if not np.isfinite(r.naive).all()]
    fine = [r for r in rows if np.isfinite(r.naive).all()]
    top = float(xs.max())
    note = []
    if broken:
        where = ", ".join(f"{r.dtype} above {r.overflow_at:.2f}" for r in broken)
        note.append(
            f"Naive softmax computes exp(x) first, and exp overflows to inf for x in {where}: "
            f"exp({top:g}) does not fit, so the sum is inf and inf / inf = nan."
        )
    if fine:
        where = ", ".join(f"{r.dtype} (fails above {r.overflow_at:.2f})" for r in fine)
        note.append(f"Naive softmax still works in {where}.")
    note.append(
        "Stabilized and online softmax subtract the max first, so every exponent is ≤ 0 and "
        "every dtype gives a finite answer."
    )
    neg = np.full(3, -np.inf, dtype=np.float32)
    masked = (
        ("naive", naive_softmax(neg), "exp(-inf) = 0 for all: 0 / 0 = nan"),
        ("stabilized (textbook)", stable_softmax(neg, guard=False),
         "max = -inf, and (-inf) - (-inf) = nan"),
        ("online (osm)", online_softmax(neg, block=2).probabilities,
         "m stays -inf, l = 0: subtract 0 instead of -inf, output 0"),
    )
    masked_note = (
        "osm gives 0, not NaN, for a row with every score masked, as FlashAttention kernels do "
        "(seed 000 §1.1 warns of this case). Its LSE is -inf by default."
    )
    return Demo(xs, tuple(rows), " ".join(note), masked, masked_note)
