"""The overflow demo: softmax of a few values computed naively, stabilized and online in each
dtype, with the thresholds where exp leaves the dtype's range (docs/numerics.md#dtype-limits),
and a fully masked row (docs/numerics.md#masked-rows).

Leaves out: the dtypes themselves (precision/dtypes.py), printing (present/).

Example: overflow_demo([100., 102., 99.]).rows[0].naive -> [nan, nan, nan] (float16)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.fold import online_softmax
from osm_cli.core.reference import naive_softmax, stable_softmax
from osm_cli.precision.dtypes import DTYPES, has_inf, limits
from osm_cli.precision.lowtrace import trace_in
from osm_cli.precision.model import model

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
    held: np.ndarray | None = None  # the values as the dtype holds them (float64)
    fits: bool = True  # False when a finite value is beyond the dtype's range (held as inf/nan)


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
        fits = bool((np.abs(xs[np.isfinite(xs)]) <= lim.max_finite).all())
        # A value beyond the dtype's range is held as inf (nan in e4m3fn): no method can work
        # with it, and the numbers below show that rather than warn about it.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            x = xs.astype(dt)
            e = np.exp(x)
            block = max(1, (len(xs) + 1) // 2)
            if not fits:
                online = np.full(len(xs), np.nan)
            else:
                # Online softmax held in the dtype itself, except in float8_e4m3fn: it cannot
                # hold m = -inf, so its kernels keep m and l in float32 (precision flash).
                m = model(name, "naive" if has_inf(dt) else "flash")
                online = trace_in(xs, m, block).probabilities
            naive, stable = naive_softmax(x), stable_softmax(x)
        rows.append(
            DemoRow(
                name, lim.max_finite, lim.overflow_at, lim.underflow_at,
                e.astype(np.float64), naive.astype(np.float64), stable.astype(np.float64),
                online.astype(np.float64), x.astype(np.float64), fits,
            )
        )
    return Demo(xs, tuple(rows), _demo_note(xs, rows), *_masked_row())


def _demo_note(xs: np.ndarray, rows: list[DemoRow]) -> str:
    """A few plain sentences on what happened in each dtype."""
    usable = [r for r in rows if r.fits]
    overflow = [r for r in usable if not np.isfinite(r.exp).all()]  # inf, or nan in e4m3fn
    underflow = [r for r in usable if r not in overflow and not np.isfinite(r.naive).all()]
    fine = [r for r in usable if np.isfinite(r.naive).all()]
    top = float(xs.max())
    note = []
    if overflow:
        where = ", ".join(
            f"{r.dtype} above {r.overflow_at:.2f}"
            + ("" if has_inf(DTYPES[r.dtype]) else " (to nan: it has no inf)") for r in overflow)
        note.append(
            f"Naive softmax computes exp(x) first, and exp overflows to inf for x in {where}: "
            f"exp({top:g}) does not fit, so the sum is inf and inf / inf = nan."
        )
    if underflow:
        names = ", ".join(r.dtype for r in underflow)
        note.append(
            f"In {names} every exp(x) is 0 (the values are -inf or below the underflow "
            "threshold), so naive softmax is 0 / 0 = nan."
        )
    if fine:
        where = ", ".join(f"{r.dtype} (fails above {r.overflow_at:.2f})" for r in fine)
        note.append(f"Naive softmax still works in {where}.")
    if all(np.isneginf(xs)):
        note.append(
            "Every value is masked (-inf): stabilized and online softmax give 0 for every "
            "entry, not nan (see the fully masked row below)."
        )
    else:
        note.append(
            "Stabilized and online softmax subtract the max first, so every exponent is ≤ 0 and "
            + ("every dtype gives a finite answer." if len(usable) == len(rows)
               else "every dtype that can hold the values gives a finite answer.")
        )
    for r in rows:
        if not r.fits:
            note.append(
                f"The values do not fit {r.dtype} (largest finite {r.max_finite:.4g}): it holds "
                "them as inf or nan before any softmax starts, so it is left out of the softmax "
                "table."
            )
    return " ".join(note)


# the fully masked row, explained once: overflow-demo's masked table and osm trace of such a row
# both say it in these words, then which of their columns is which form
MASKED_ROW = (
    "A fully masked row (every score -inf): the textbook stabilized form gives NaN, as its max "
    "is -inf and (-inf) - (-inf) = nan; osm's guarded forms take 0 for that max and give 0 for "
    "every entry (LSE -inf by default), as FlashAttention kernels do: such a row is padding or "
    "a causal edge, not an error."
)


def _masked_row():
    neg = np.full(3, -np.inf, dtype=np.float32)
    masked = (
        ("naive", naive_softmax(neg), "exp(-inf) = 0 for all: 0 / 0 = nan"),
        ("stabilized (textbook)", stable_softmax(neg, guard=False),
         "max = -inf, and (-inf) - (-inf) = nan"),
        ("online (osm)", online_softmax(neg, block=2).probabilities,
         "m stays -inf, l = 0: subtract 0 instead of -inf, output 0"),
    )
    masked_note = (MASKED_ROW + " Above, naive and stabilized (textbook) are the unguarded "
                   "forms, online (osm) the guarded one.")
    return masked, masked_note
