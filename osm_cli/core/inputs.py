"""What the Python API takes as numbers: arrays, and anything numpy reads as one.

`as_numbers` is the one door: a plain sequence ([1, 2, 5, 3]) or an integer array comes in as
float64, as numpy's own functions take them; a float array (float16, bfloat16, float8 …)
keeps its dtype; a string, bytes, booleans, complex numbers or Python objects are an
InputError naming the argument (docs/inputs.md#python-inputs). Leaves out: shapes and values
(each function checks its own).

Example: as_numbers([1, 2, 5, 3], "scores").dtype -> float64
"""

from __future__ import annotations

import numpy as np

from osm_cli.errors import InputError


def as_numbers(x, name: str) -> np.ndarray:
    """x as an array of real numbers: ints and sequences as float64, floats as they are."""
    if isinstance(x, (str, bytes, bytearray)):
        shown = x if len(x) <= 20 else x[:19] + ("…" if isinstance(x, str) else b"...")
        raise InputError(f"{name} must be numbers, not a string ({shown!r}); parse it first, "
                         "e.g. np.array(text.split(','), dtype=float)")
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as exc:  # ragged nested sequences
        raise InputError(f"{name} cannot be read as an array of numbers ({exc})") from None
    kind = arr.dtype.kind
    if kind in "iu":
        return arr.astype(np.float64)
    if kind == "f" or arr.dtype.name.startswith(("bfloat16", "float8")):
        return arr
    what = {"b": "booleans", "c": "complex numbers", "U": "strings", "S": "strings",
            "O": "Python objects", "M": "dates", "m": "time spans"}.get(kind, f"{arr.dtype}")
    raise InputError(f"{name} has dtype {arr.dtype} ({what}); osm needs real numbers")


__all__ = ["as_numbers"]
