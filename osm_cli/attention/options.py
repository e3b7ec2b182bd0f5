"""The options of an attention run, as three small frozen records built once by the caller.

- `ScoreOptions`: how scores are made from Q and K and which the mask hides: layout, scale,
  causal (and its alignment), window, a user mask. Everything that computes scores (the tiled
  forward, the one-shot reference, plain attention, the tile maps) takes this one record.
- `Tiling`: how the forward walks the tiles: block_q, block_k, the update form, the order of
  the K/V tiles, a lazy-rescale threshold, a key range (one split of a split-KV run).
- `Hooks`: what a precision model changes: the dtype the state is held in, P's rounding.

`attention(q, k, v, causal=True, block_k=64)` still takes the fields as keywords;
`split_options` sorts such keywords into the three records. Leaves out: running anything.

Example: split_options({"causal": True, "block_k": 64}) -> (ScoreOptions(causal=True, …),
         Tiling(block_k=64, …), Hooks())
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from osm_cli.core.state import FORMS
from osm_cli.errors import InputError

MASKED_LSE = {"neg-inf": -np.inf, "pos-inf": np.inf, "zero": 0.0}  # docs/numerics.md#masked-rows
ALIGNS = ("bottom-right", "top-left")  # docs/numerics.md#causal-alignment
LAYOUTS = ("bhnd", "bnhd")  # docs/numerics.md#layouts


def default_scale(d: int) -> float:
    """The score scale when none is given: 1/sqrt(d), d the head dim (docs/numerics.md#scale)."""
    return 1.0 / math.sqrt(d)


def default_blocks(d: int) -> tuple[int, int]:
    """FA2's forward tiles on sm80: block_q 128; block_k 128 for d ≤ 64, else 64
    (docs/numerics.md#fa2-schedule)."""
    return 128, 128 if d <= 64 else 64


@dataclass(frozen=True)
class ScoreOptions:
    """How scores are made and masked (docs/numerics.md#scale, #causal-alignment, #masks)."""

    causal: bool = False
    scale: float | None = None  # None: 1/sqrt(d)
    layout: str = "bhnd"  # bhnd (PyTorch) or bnhd (FlashAttention)
    causal_align: str = "bottom-right"
    window: tuple | None = None  # (left, right); a negative side is unbounded
    mask: np.ndarray | None = None  # bool True = attend, or float added to the scores

    def __post_init__(self):
        if self.scale is not None and not math.isfinite(self.scale):
            raise InputError(f"the scale must be a finite number, not {self.scale}")

    def scale_for(self, d: int) -> float:
        return default_scale(d) if self.scale is None else self.scale


@dataclass(frozen=True)
class Tiling:
    """How the tiled forward walks Q and K/V (None: FA2's default tiles for the head dim)."""

    block_q: int | None = None
    block_k: int | None = None
    form: str = "rescale"  # rescale or merge (docs/numerics.md#update-forms)
    order: np.ndarray | None = None  # a permutation of the K/V tiles; None: forward
    threshold: float = 0.0  # lazy-rescale τ, natural log (docs/numerics.md#lazy-rescale)
    keys: tuple[int, int] | None = None  # run over these keys only (one split of split-KV)

    def blocks(self, d: int) -> tuple[int, int]:
        """(block_q, block_k), the defaults filled in, checked positive."""
        bq0, bk0 = default_blocks(d)
        bq = bq0 if self.block_q is None else self.block_q
        bk = bk0 if self.block_k is None else self.block_k
        if bq < 1 or bk < 1:
            raise InputError(f"block sizes must be positive (block_q {bq}, block_k {bk})")
        return bq, bk


@dataclass(frozen=True)
class Hooks:
    """What a precision model changes in the forward and backward (precision/model.py)."""

    accum: object = None  # the state's dtype; None: float64 for float64 inputs, else float32
    p_round: Callable | None = None  # rounds P before P·V (backward: before Pᵀ·dO)
    ds_round: Callable | None = None  # backward: rounds dS before dS·K and dSᵀ·Q
    head_round: Callable | None = None  # backward, GQA: rounds each query head's dK and dV
    # before the group's sum (FA2 writes them per head, then sums)


_RECORDS = (ScoreOptions, Tiling, Hooks)
_FIELDS = {f.name: cls for cls in _RECORDS for f in fields(cls)}


def split_options(kwargs: dict, opts: ScoreOptions | None = None, tiling: Tiling | None = None,
                  hooks: Hooks | None = None) -> tuple[ScoreOptions, Tiling, Hooks]:
    """The three records from flat keywords (attention's), on top of records already given."""
    given = {ScoreOptions: opts or ScoreOptions(), Tiling: tiling or Tiling(),
             Hooks: hooks or Hooks()}
    per: dict = {cls: {} for cls in _RECORDS}
    for name, value in kwargs.items():
        if name not in _FIELDS:
            raise TypeError(f"unexpected keyword argument {name!r}")
        per[_FIELDS[name]][name] = value
    out = tuple(replace(given[cls], **per[cls]) if per[cls] else given[cls] for cls in _RECORDS)
    check_form(out[1])
    return out  # type: ignore[return-value]


def layout_of(kwargs: dict) -> str:
    """The layout that attention's keywords ask for (layout=, or opts=ScoreOptions(layout=…))."""
    return kwargs.get("layout") or (kwargs.get("opts") or ScoreOptions()).layout


def check_form(tiling: Tiling) -> None:
    if tiling.form not in FORMS:
        raise InputError(f"form must be one of {FORMS}, not {tiling.form!r}")
    if tiling.threshold and tiling.form != "rescale":
        raise InputError("a rescale threshold applies to the rescale form only")


def check_masked_lse(masked_lse: str) -> None:
    if masked_lse not in MASKED_LSE:
        raise InputError(f"masked LSE must be one of {', '.join(MASKED_LSE)}, not {masked_lse!r}")


__all__ = [
    "ALIGNS", "LAYOUTS", "MASKED_LSE", "Hooks", "ScoreOptions", "Tiling", "default_blocks",
    "default_scale", "layout_of", "split_options",
]
