"""The options of an attention run, as three small frozen records built once by the caller.

- `ScoreOptions`: how scores are made from Q and K and which the mask hides: layout, scale,
  causal (and its alignment), window, a user mask. Everything that computes scores (the tiled
  forward, the one-shot reference, plain attention, the tile maps) takes this one record.
- `Tiling`: how the forward walks the tiles: block_q, block_k, the update form, the order of
  the K/V tiles, a lazy-rescale threshold, a key range (one split of a split-KV run), and
  whether the rescale step runs fused in place (fast.py) or as core.state writes it.
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

from osm_cli.core.names import FORMS
from osm_cli.errors import InputError

from .mods import MaskMod, ScoreMod
from .names import ALIGNS, LAYOUTS, MASKED_LSE
from .packed import Packing

FLOAT32_MAX = float(np.finfo(np.float32).max)  # kernels hold scale, softcap, slopes, sinks so
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32


def _held(name: str, x: float, what: str, tiny: bool = False) -> None:
    """InputError unless x is finite and survives float32, the dtype a kernel holds it in
    (softcap also its reciprocal: s / C must not overflow)."""
    if not math.isfinite(x):
        raise InputError(f"{what} must be a finite number, not {x}")
    if abs(x) > FLOAT32_MAX:
        raise InputError(f"{name} {x:g} is past float32's largest {FLOAT32_MAX:.8g}, the dtype "
                         "kernels hold it in (docs/inputs.md#kernel-inputs)")
    if tiny and 0 < abs(x) < FLOAT32_TINY:
        raise InputError(f"{name} {x:g} is below float32's smallest normal {FLOAT32_TINY:.8g}; "
                         "a kernel dividing by it overflows (docs/inputs.md#kernel-inputs)")


def check_alibi_reach(slopes, t: int, s: int) -> None:
    """InputError when an ALiBi bias −slope·|i + s − t − j| (distances up to max(t, s)) would
    leave float32 (the kernels add it to float32 scores): |slope|·max(t, s) ≤ FLOAT32_MAX / 2,
    half left for the score it is added to."""
    if slopes is None:
        return
    top = float(np.abs(np.asarray(slopes, dtype=np.float64)).max(initial=0.0))
    reach = max(t, s, 1)
    if top * reach > FLOAT32_MAX / 2:
        raise InputError(f"alibi_slopes holds {top:g}: times a distance of up to {reach} keys "
                         f"the bias reaches {top * reach:.3g}, past float32's range "
                         f"(|slope|·max(t, s) ≤ {FLOAT32_MAX / 2:.3g}; "
                         "docs/inputs.md#kernel-inputs)")


def check_scale(scale: float | None) -> None:
    """softmax_scale is a finite number (or None); a finite one is judged with the scores it
    makes (masks.check_score_range)."""
    if scale is not None and not math.isfinite(scale):
        raise InputError(f"the scale must be a finite number, not {scale}")


def check_softcap(softcap: float | None) -> None:
    """softcap is a positive finite number (or None: FlashAttention's 0.0)."""
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        raise InputError(f"softcap must be a positive finite number, not {softcap}")


def default_scale(d: int) -> float:
    """The score scale when none is given: 1/sqrt(d), d the head dim (docs/numerics.md#scale)."""
    return 1.0 / math.sqrt(d)


def scale_note(scale: float | None) -> str | None:
    """What a legal but unusual softmax_scale does (0 or negative), in parameter words; None
    for a positive one."""
    if scale is None or scale > 0:
        return None
    what = ("makes every score 0: each row averages V over the keys it sees" if scale == 0
            else "is negative: each row favours the keys least like its query")
    return f"`softmax_scale` {scale:g} {what}"


def default_blocks(d: int) -> tuple[int, int]:
    """FA2's forward tiles on sm80: block_q 128; block_k 128 for d ≤ 64, else 64
    (docs/numerics.md#fa2-schedule)."""
    return 128, 128 if d <= 64 else 64


@dataclass(frozen=True)
class ScoreOptions:
    """How scores are made and masked (docs/numerics.md#scale, #causal-alignment, #masks), with
    the kernels' score modifiers (#softcap, #alibi, #sinks) and batch layouts (#varlen,
    #paged-kv), under the kernels' own argument names."""

    causal: bool = False
    scale: float | None = None  # None: 1/sqrt(d)
    layout: str = "bhnd"  # bhnd (PyTorch) or bnhd (FlashAttention)
    causal_align: str = "bottom-right"
    window: tuple | None = None  # (left, right); a negative side is unbounded
    mask: np.ndarray | None = None  # bool True = attend, or float added to the scores
    softcap: float | None = None  # C: a scaled score s becomes C·tanh(s / C), before the masks
    alibi_slopes: np.ndarray | None = None  # (H,) or (B, H): −slope·|i + s − t − j| is added
    sinks: np.ndarray | None = None  # (H,): one logit per query head, in the denominator only
    cu_seqlens_q: np.ndarray | None = None  # varlen: packed Q, sequence b at cu[b]:cu[b + 1]
    cu_seqlens_k: np.ndarray | None = None  # varlen: packed K/V
    seqused_k: np.ndarray | None = None  # the keys each sequence uses (a paged cache's length)
    page_table: np.ndarray | None = None  # paged K/V: (B, max_pages) page indices
    kv_layout: str = "nhd"  # a paged cache: nhd (num_pages, page_size, Hkv, d) or hnd
    score_mod: object = None  # score_mod(score, b, h, q_idx, kv_idx), vectorised (mods.py)
    mask_mod: object = None  # mask_mod(b, h, q_idx, kv_idx) -> bool, or a list of them (and)

    def __post_init__(self):
        # FlexAttention's functions, tried once here (mods.py): every entry point builds this
        if self.score_mod is not None:
            object.__setattr__(self, "score_mod", ScoreMod.of(self.score_mod))
        if self.mask_mod is not None:
            object.__setattr__(self, "mask_mod", MaskMod.of(self.mask_mod))
        check_scale(self.scale)
        if self.softcap is not None:
            check_softcap(self.softcap)
            _held("softcap", self.softcap, "softcap", tiny=True)
        for name, ndims in (("alibi_slopes", (1, 2)), ("sinks", (1,))):
            x = getattr(self, name)
            if x is None:
                continue
            x = np.asarray(x)
            if x.dtype.kind not in "fiu" or x.ndim not in ndims:
                shapes = "(H,) or (B, H)" if name == "alibi_slopes" else "(H,), one per head"
                raise InputError(f"{name} must be real numbers of shape {shapes}; got dtype "
                                 f"{x.dtype}, shape {tuple(x.shape)}")
            if not np.isfinite(x).all():
                raise InputError(f"{name} must be finite; it holds "
                                 f"{x[~np.isfinite(x)].flat[0]}")
            big = np.abs(x.astype(np.float64)) > FLOAT32_MAX
            if big.any():
                raise InputError(f"{name} holds {x[big].flat[0]:g}, past float32's largest "
                                 f"{FLOAT32_MAX:.8g}, the dtype kernels hold it in "
                                 "(docs/inputs.md#kernel-inputs)")

    def scale_for(self, d: int) -> float:
        return default_scale(d) if self.scale is None else self.scale

    def for_sequence(self, b: int) -> ScoreOptions:
        """The options of sequence b of a packed or paged batch, run as a dense (1, H, n, d)
        problem: no packing, layout bhnd, its row of (B, H) ALiBi slopes."""
        slopes = self.alibi_slopes
        if slopes is not None and np.ndim(slopes) == 2:
            slopes = np.asarray(slopes)[b]
        return replace(self, layout="bhnd", alibi_slopes=slopes, cu_seqlens_q=None,
                       cu_seqlens_k=None, seqused_k=None, page_table=None)

    @property
    def packing(self):
        """The batch layout as packed.Packing (its `active` is False for a dense batch)."""
        return Packing(self.cu_seqlens_q, self.cu_seqlens_k, self.seqused_k, self.page_table,
                       self.kv_layout)


def alibi_auto(heads: int) -> np.ndarray:
    """ALiBi's standard slopes for `heads` heads, float32 (Press et al., "Train Short, Test
    Long"): 2^(−8i/n) for i = 1..n with n = heads a power of 2; otherwise those of the largest
    power of 2 below, then every other slope of twice that. Example: alibi_auto(4) -> [0.25,
    0.0625, 0.015625, 0.00390625]"""
    def power_of_2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    if heads < 1:
        raise InputError(f"ALiBi needs at least one head, not {heads}")
    n = 1 << (heads.bit_length() - 1)
    slopes = power_of_2(n)
    if n < heads:
        slopes += power_of_2(2 * n)[0::2][: heads - n]
    return np.asarray(slopes, dtype=np.float32)


@dataclass(frozen=True)
class Tiling:
    """How the tiled forward walks Q and K/V (None: FA2's default tiles for the head dim)."""

    block_q: int | None = None
    block_k: int | None = None
    form: str = "rescale"  # rescale or merge (docs/numerics.md#update-forms)
    order: np.ndarray | None = None  # a permutation of the K/V tiles; None: forward
    threshold: float = 0.0  # lazy-rescale τ, natural log (docs/numerics.md#lazy-rescale)
    keys: tuple[int, int] | None = None  # run over these keys only (one split of split-KV)
    fused: bool = True  # fast.py's in-place loop (same bits); False: core.state's step as written
    reverse: bool = False  # visit the K/V tiles last to first (FA2's and FA4's kernels), after
    # any order; per sequence of a packed batch

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
    kernel: object | None = None  # backward: a kernel's own tile arithmetic (precision/
    # kernel_backward.py: delta_of, step, reverse_q, group_fp32, group_sum); None: osm's


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
    "ALIGNS", "FLOAT32_MAX", "FLOAT32_TINY", "LAYOUTS", "MASKED_LSE", "Hooks", "ScoreOptions",
    "Tiling", "alibi_auto", "check_alibi_reach", "check_scale", "check_softcap",
    "default_blocks", "default_scale", "layout_of", "scale_note", "split_options",
]
