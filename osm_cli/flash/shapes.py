"""Shapes: Q, K, V viewed as (B, H, N, d), checked against each other, and the GQA head map.

Inputs may be (N, d), (H, N, d) or (B, H, N, d), or FlashAttention's (B, N, H, d) as layout
"bnhd" (docs/numerics.md#layouts); everything inside osm works on the (B, H, N, d) view.
Leaves out: masks and scores (masks.py, scores.py), the run itself (forward.py).

Example: as_bhnd(np.zeros((8, 64)), "bhnd", "Q").shape -> (1, 1, 8, 64)
"""

from __future__ import annotations

import math

import numpy as np

from osm_cli.core.inputs import as_numbers
from osm_cli.errors import InputError, ShapeError

from .options import LAYOUTS


def as_bhnd(x: np.ndarray, layout: str, name: str) -> np.ndarray:
    """View an (N, d), (H, N, d) or (B, H, N, d) array (or B, N, H, d) as (B, H, N, d)."""
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if x.ndim == 2:
        return x[None, None]
    if x.ndim == 3:
        return x[None] if layout == "bhnd" else x.transpose(1, 0, 2)[None]
    if x.ndim == 4:
        return x if layout == "bhnd" else x.transpose(0, 2, 1, 3)
    raise ShapeError(
        f"{name} has shape {tuple(x.shape)}; expected (N, d), (H, N, d) or (B, H, N, d)"
    )


def from_bhnd(x: np.ndarray, like_ndim: int, layout: str) -> np.ndarray:
    """The inverse of as_bhnd for an output whose input had like_ndim axes."""
    if layout == "bnhd" and like_ndim >= 3:
        x = x.transpose(0, 2, 1, *range(3, x.ndim))
    return x.reshape(x.shape[4 - like_ndim:]) if like_ndim < 4 else x


def lse_from_bhnd(lse: np.ndarray, like_ndim: int) -> np.ndarray:
    """A (B, H, t) LSE (or D) as FlashAttention returns it for inputs of like_ndim axes, whatever
    their layout: (B, H, t), (H, t) or (t,) (docs/numerics.md#layouts)."""
    return lse.reshape(lse.shape[4 - like_ndim:]) if like_ndim < 4 else lse


def check_inputs(q, k, v) -> None:
    """Shape and dtype rules of attention, as one clear error each."""
    for name, x in (("Q", q), ("K", k), ("V", v)):
        if x.dtype.kind != "f" and not x.dtype.name.startswith(("bfloat16", "float8")):
            raise InputError(
                f"{name} has dtype {x.dtype}; attention needs floating-point arrays"
            )
    b, hq, _, d = q.shape
    bk, hk, s, dk = k.shape
    bv, hv, sv, _ = v.shape
    if dk != d:
        raise ShapeError(f"Q and K head dims differ: Q has d = {d}, K has d = {dk}")
    if d == 0:
        raise ShapeError("Q and K have head dim d = 0; attention needs d ≥ 1")
    if sv != s:
        raise ShapeError(f"K and V sequence lengths differ: K has {s} keys, V has {sv}")
    if hk != hv:
        raise ShapeError(f"K and V head counts differ: K has {hk}, V has {hv}")
    if hq == 0 or hk == 0:  # no GQA group to speak of (docs/inputs.md#zero-size-inputs)
        raise ShapeError(f"Q has {hq} heads and K/V {hk}; attention needs at least one head")
    if not (bk == bv == b):
        raise ShapeError(f"batch sizes differ: Q {b}, K {bk}, V {bv}")
    if hq % hk:
        raise ShapeError(
            f"Q has {hq} heads and K/V {hk}: for GQA/MQA the query heads must be a multiple "
            "of the kv heads"
        )


def bhnd_inputs(q, k, v, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K and V viewed as (B, H, N, d) (as_bhnd) and checked against each other."""
    q4, k4, v4 = (as_bhnd(as_numbers(x, n), layout, n) for x, n in ((q, "Q"), (k, "K"), (v, "V")))
    check_inputs(q4, k4, v4)
    return q4, k4, v4


def kv_head(h, hq: int, hk: int):
    """The kv head that query head h reads under GQA/MQA: h // (Hq / Hkv) (docs/numerics.md#gqa).

    Works on an int or an array of heads. Example: kv_head(np.arange(6), 6, 2) -> [0 0 0 1 1 1]
    """
    return h // (hq // hk)


def broadcast_mask(mask: np.ndarray, shape: tuple) -> np.ndarray:
    """A user's mask broadcast to (B, H, t, s), or a ShapeError saying why it does not fit."""
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ShapeError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, t, s) = {shape}"
        ) from None


def traced_rows(trace_at: tuple | None) -> tuple | None:
    """trace_at as (batch, head, queries), queries a tuple of ints: its third entry is one query
    or a sequence of them (several rows of one head, traced side by side: the m and l vectors
    of a Q tile). None stays None. Example: traced_rows((0, 1, range(2))) -> (0, 1, (0, 1))"""
    if trace_at is None:
        return None
    try:
        tb, th, ti = trace_at
        many = not isinstance(ti, (int, np.integer))
        qs = tuple(ti) if many else (ti,)
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                   for x in (tb, th, *qs)):
            raise TypeError
    except (TypeError, ValueError):
        raise InputError("trace_at must be (batch, head, query), the query an int or a "
                         f"sequence of ints; not {trace_at!r}") from None
    if not qs:
        raise InputError("trace_at names no query row: give at least one")
    twice = sorted({int(x) for x in qs if qs.count(x) > 1})
    if twice:
        raise InputError(f"trace_at names query {twice[0]} twice: give each row once")
    return int(tb), int(th), tuple(int(x) for x in qs)


def check_traced(trace_at: tuple | None, bht: tuple) -> tuple | None:
    """The traced (batch, head, query or queries) must lie inside Q's (B, H, t); None traces
    nothing. Returns trace_at as traced_rows gives it."""
    trace_at = traced_rows(trace_at)
    if trace_at is None:
        return None
    (tb, th, qs), (b, hq, t) = trace_at, bht
    if 0 in (b, hq, t):  # docs/inputs.md#zero-size-inputs
        raise InputError(f"Q has no query rows to trace: (B, H, t) = ({b}, {hq}, {t}); give at "
                         "least one (or trace_at=None for an empty result)")
    for ti in qs:
        if not (0 <= tb < b and 0 <= th < hq and 0 <= ti < t):
            raise InputError(
                f"traced row (batch {tb}, head {th}, query {ti}) is outside Q's "
                f"(B, H, t) = ({b}, {hq}, {t})"
            )
    return trace_at


def check_finite(x: np.ndarray, name: str, *, bhnd: bool = True) -> float:
    """InputError at x's first NaN or ±inf, by its index in x; else the largest |x| (0 if empty).

    bhnd (attention's inputs, viewed as (B, H, N, d)) calls it NaN or inf and says so; without
    it (precision.round_inputs, arrays as given) the message shows the value: nan, inf or -inf.
    """
    # Chunked so a memory-mapped input is scanned without being read into memory whole.
    flat = x.reshape(-1) if x.flags.c_contiguous else np.ravel(x)
    step = 1 << 22
    top = 0.0
    for start in range(0, flat.size, step):
        part = np.asarray(flat[start:start + step])
        if np.isfinite(part).all():
            top = max(top, float(np.abs(part).max(initial=0)))
        else:
            bad = start + int(np.flatnonzero(~np.isfinite(part))[0])
            idx = tuple(int(i) for i in np.unravel_index(bad, x.shape))
            value = float(part[bad - start])
            if not bhnd:
                raise InputError(f"{name} holds {value} at index {idx}; attention inputs must "
                                 "be finite")
            what = "NaN" if math.isnan(value) else "inf"
            raise InputError(f"{name} holds {what} at index {idx} (as (B, H, N, d)); "
                             "attention inputs must be finite")
    return top


def like_bhnd(x, name: str, shape: tuple, layout: str) -> np.ndarray:
    """x (an output such as O or dO, or a gradient) viewed as (B, H, N, d), which must be
    `shape`; a ShapeError naming x otherwise. Example: like_bhnd(do, "dO", (1, 2, 8, 4), "bhnd")
    """
    x = np.asarray(x)
    try:
        x4 = as_bhnd(x, layout, name)
    except ShapeError:
        x4 = None
    if x4 is None or x4.shape != tuple(shape):
        raise ShapeError(f"{name} has shape {tuple(x.shape)}; these Q, K, V need "
                         f"{_shaped(shape, x.ndim if x4 is not None else 4, layout)}")
    return x4


def lse_bht(lse, name: str, bht: tuple, like_ndim: int, layout: str) -> np.ndarray:
    """An LSE as (B, H, t): shaped as attention returns it (FlashAttention's (B, H, t) with
    Q's missing leading axes dropped), or for bnhd inputs also as Q's shape without d (osm
    0.2's); a ShapeError naming it otherwise."""
    lse = np.asarray(lse)
    own = _shaped((*bht, 1), like_ndim, "bhnd")[:-1]
    if lse.shape == own:
        return as_bhnd(lse[..., None], "bhnd", name)[..., 0]
    old = _shaped((*bht, 1), like_ndim, layout)[:-1]
    if lse.shape == old:
        return as_bhnd(lse[..., None], layout, name)[..., 0]
    raise ShapeError(f"{name} has shape {tuple(lse.shape)}; these Q, K, V give an LSE of "
                     f"shape {own}")


def _shaped(bhnd: tuple, ndim: int, layout: str) -> tuple:
    """A (B, H, N, d) shape as an array of ndim axes in `layout` shows it (from_bhnd's)."""
    b, h, n, d = bhnd
    full = (b, n, h, d) if layout == "bnhd" and ndim >= 3 else (b, h, n, d)
    return full[4 - ndim:] if ndim < 4 else full


def row_of(x: np.ndarray, traced: tuple, layout: str) -> np.ndarray:
    """The traced (batch, head, query) row of an output shaped like `attention`'s; for several
    queries (a sequence) their rows, (queries, d)."""
    x4 = as_bhnd(x, layout, "output")
    b, h, i = traced
    return x4[b, h, list(i) if not isinstance(i, (int, np.integer)) else i]


__all__ = [
    "as_bhnd", "bhnd_inputs", "broadcast_mask", "check_finite", "check_inputs", "check_traced",
    "from_bhnd", "kv_head", "like_bhnd", "lse_bht", "lse_from_bhnd", "row_of", "traced_rows",
]
