"""Kernel presets: what a real FlashAttention kernel does to the numbers, one small frozen record
each (docs/numerics.md#kernel-presets).

A preset names the kernel's schedule (its K/V tile width per head dim, the order it visits the
K/V tiles, its split-KV heuristic) and its arithmetic: how exp is computed (exp2 of
S·scale·log2e − m·scale·log2e: FA4 folds the subtraction into one fused multiply-add, PyTorch's
FA2 rounds the product first), how O is normalised (a reciprocal then a multiply: FA4's
rcp.approx, FA2's correctly rounded 1/l), where P is rounded, the LSE of a fully masked row,
the lazy-rescale threshold and the FP8 offset. emulate.py runs any preset; "tiles" is osm's own
readable loop (flash/), for fp32 and fp64 teaching runs.

Leaves out: running (emulate.py), the dtypes (dtypes.py), the verdict (rule.py).

Example: preset("fa2").block_k(64) -> 128
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from osm_cli.errors import OsmError

from .names import KERNELS, MMAS, PRESET_MMA, TILES_MMA

SIXTEEN = ("float16", "bfloat16")
EIGHT = ("float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class Preset:
    """One kernel's schedule and arithmetic, as emulate.py runs it."""

    name: str
    title: str  # the kernel in a few words
    widths: tuple[tuple[int, int], ...]  # (largest head dim, block_k) by head dim; block_q last
    block_q: int
    reverse: bool  # K/V tiles visited last to first
    split_kv: bool  # FA2's split-KV heuristic (few Q tiles for the GPU: key ranges merged)
    exp: str  # "exp2-fma" (ex2 of one FMA), "exp2-unfused" (ex2(S·c − m·c), two roundings:
    # PyTorch builds FA2 with UNFUSE_FMA), "exp2-emu" (FA4 SM100's polynomial), "exp"
    normalise: str  # "reciprocal": O · rcp.approx(l); "reciprocal-rn": O · (1/l) correctly
    # rounded (no --use_fast_math); "divide": O / l
    masked_lse: str  # LSE of a fully masked row: "pos-inf" (FA2) or "neg-inf" (FA3/FA4)
    lse: str  # "ln": m·scale + ln l (FA2); "log2": (m·scale·log2e + log2 l)·ln 2 (FA4)
    softcap: str  # "tanh-scaled" (FA2: tanh(S·scale/C), scale C) or "score-mod" (FA4)
    dtypes: tuple[str, ...]  # input dtypes it takes
    threshold16: float = 0.0  # lazy-rescale threshold, log2 units, for 16-bit inputs
    threshold8: float = 0.0  # … and for FP8 inputs
    max_offset8: int = 0  # FP8: P = exp2(x + offset), the row sum divided back
    row_sum: str = "quad"  # how threads add l: "quad" (4 lanes), "eight" (SM100), "plain"
    alibi: bool = False  # takes alibi_slopes (FA2); the causal shortcut of docs/#alibi
    sinks: bool = True  # takes learnable sinks
    verified: str = ""  # how osm checked it against the kernel

    def q_tile(self, d: int) -> int:
        """block_q for head dim d: FA4's SM90 forward takes 192 rows up to d = 96, else 128.
        (Rows are independent: block_q changes which tiles are skipped, never a row's bits.)"""
        return 192 if self.name == "fa4" and d <= 96 else (128 if self.name == "fa4"
                                                             else self.block_q)

    def block_k(self, d: int, dv: int | None = None, causal: bool = False,
                local: bool = False) -> int:
        """The K/V tile width for head dim d (FA4 SM90 narrows it for d > 96 by dv and causal)."""
        for top, width in self.widths:
            if d <= top:
                if self.name == "fa4":
                    return _fa4_width(d, d if dv is None else dv, causal, local, width)
                return width
        return self.widths[-1][1]

    def emulated_columns(self, d: int, causal: bool, fp8: bool):
        """FA4 SM100's columns of a K/V tile that its software exp2 computes (the rest use the
        hardware's ex2): in each 32-column fragment j ≥ start but the last, the columns c with
        c mod freq ≥ freq − 4. freq and start from the kernel's tuning table by head dim,
        causal and FP8 (non-causal d = 128 runs 2-CTA: 10, 1; causal d ≤ 128: 16, or 8 for
        FP8; d = 192: 16, 0 or causal 32, 1). Returns width -> boolean columns."""
        import numpy as np

        if d <= 128:
            freq, start = (16, 1) if (causal or d <= 64) else (10, 1)
            if causal and fp8:
                freq = 8
        elif d <= 192:
            freq, start = (32, 1) if causal else (16, 0)
        else:
            freq, start = 14, 0

        def columns(width: int):
            c = np.arange(width)
            frag = c // 32
            last = (width - 1) // 32
            return (frag >= start) & (frag != last) & ((c % 32) % freq >= freq - 4)

        return columns

    def threshold(self, dtype: str) -> float:
        return self.threshold8 if dtype in EIGHT else self.threshold16

    def max_offset(self, dtype: str) -> int:
        return self.max_offset8 if dtype in EIGHT else 0

    def check(self, dtype: str, *, alibi: bool = False, sinks: bool = False,
              float_mask: bool = False) -> None:
        """One Error: line naming the preset and the option it does not take."""
        if dtype not in self.dtypes:
            takes = ", ".join(self.dtypes)
            hint = " (FP8: `kernel` fa4-sm100)" if dtype in EIGHT else ""
            raise OsmError(f"kernel {self.name} takes {takes} inputs, not {dtype}{hint}; "
                           "`kernel` tiles runs any dtype in osm's own loop")
        for given, supported, what in ((alibi, self.alibi, "`alibi_slopes` (ALiBi slopes)"),
                                       (sinks, self.sinks, "`learnable_sink`"),
                                       (float_mask, False, "float mask (an added bias)")):
            if given and not supported:
                raise OsmError(f"kernel {self.name} ({self.title}) takes no {what}; "
                               "`kernel` tiles runs it in osm's own loop")


def _fa4_width(d: int, dv: int, causal: bool, local: bool, width: int) -> int:
    """FA4's SM90 tile_n (flash_attn/cute interface, _tile_size_fwd_sm90): 144 for d ≤ 96
    unless causal or local (128); d ≤ 192: 96 with a window, else 128, or 112 for dv > 128;
    above: 64 with a window, else 80."""
    if 64 < d <= 96:
        return 128 if causal or local else 144
    if 128 < d <= 192:
        return 96 if local else 128 if dv <= 128 else 112
    if d > 192:
        return 64 if local else 80
    return width


PRESETS: dict[str, Preset] = {
    "fa2": Preset(
        "fa2", "FlashAttention-2 forward (PyTorch's flash SDPA backend)",
        ((64, 128), (10**9, 64)), 128, reverse=True, split_kv=True, exp="exp2-unfused",
        normalise="reciprocal-rn", masked_lse="pos-inf", lse="ln", softcap="tanh-scaled",
        dtypes=SIXTEEN, alibi=True, sinks=False,
        verified="PyTorch 2.11 flash SDPA on an H200: bit for bit on ≥ 99.9 % (bf16)"),
    "fa4": Preset(
        "fa4", "FlashAttention-4 SM90 forward (flash_attn.cute, Hopper)",
        ((64, 128), (96, 144), (128, 128), (192, 128), (10**9, 80)), 192, reverse=True,
        split_kv=False, exp="exp2-fma", normalise="reciprocal", masked_lse="neg-inf",
        lse="log2", softcap="score-mod", dtypes=SIXTEEN,
        verified="flash-attn-4 4.0.0b36 on an H200 (sm_90)"),
    "fa4-sm100": Preset(
        "fa4-sm100", "FlashAttention-4 SM100 forward (Blackwell), from source only",
        ((10**9, 128),), 128, reverse=True, split_kv=False, exp="exp2-emu",
        normalise="reciprocal", masked_lse="neg-inf", lse="log2", softcap="score-mod",
        dtypes=SIXTEEN + EIGHT, threshold16=8.0, threshold8=0.0, max_offset8=8,
        row_sum="eight", verified="unverified on hardware: modelled from flash_attn/cute source"),
    "tiles": Preset(
        "tiles", "osm's own readable loop (attention/): exp(S − m), O / l",
        ((64, 128), (10**9, 64)), 128, reverse=False, split_kv=False, exp="exp",
        normalise="divide", masked_lse="neg-inf", lse="ln", softcap="scaled",
        dtypes=("float64", "float32") + SIXTEEN + EIGHT, alibi=True, row_sum="plain",
        verified="the float64 reference (docs/numerics.md#state)"),
}


SMS = 132  # streaming multiprocessors of an H100 / H200 SXM (an A100 has 108)


def _num_splits(work: int, slots: int, n_blocks: int, most: int = 128) -> int:
    """FlashAttention-2's split-KV heuristic (flash_api.cpp num_splits_heuristic)."""
    if work >= 0.8 * slots:
        return 1
    most = min(most, slots, n_blocks)

    def eligible(n: int) -> bool:  # n splits that do not just repeat n - 1's blocks per split
        return n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1))

    eff = {}
    for n in range(1, most + 1):
        if eligible(n):
            waves = work * n / slots
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    return next((n for n, e in eff.items() if e >= 0.85 * best), 1)


def fa2_plan(b: int, h: int, t: int, s: int, d: int, sms: int = SMS) -> tuple[int, int, int]:
    """(block_q, block_k, splits) of FlashAttention-2's forward for these sizes.

    Few (batch · head · 64-row) blocks for the GPU's 2·sms slots: the split-KV kernel, with
    64-row tiles, block_k 256 (d ≤ 64), 128 (d ≤ 128) or 64, and `splits` key ranges merged in
    float32. Otherwise the standard kernel: 128-row tiles, block_k 128 (d ≤ 64) else 64.
    Example: fa2_plan(1, 8, 1024, 1024, 64) -> (64, 256, 2)
    """
    block_n = 256 if d <= 64 else 128 if d <= 128 else 64
    splits = _num_splits(b * h * -(-t // 64), 2 * sms, -(-s // block_n))
    if splits <= 1:
        return (128, 128 if d <= 64 else 64, 1)
    return 64, block_n, splits


def mma_for(kernel: str | None, mma: str | None) -> str:
    """How the matmuls of a run of `kernel` round: `mma` where given, else a preset's own
    arithmetic, the tensor cores' truncating accumulation (PRESET_MMA: bit for bit, at about
    twice BLAS's time: benchmarks/bench_mma.py), and numpy's BLAS for osm's own tiles
    (TILES_MMA; also for None: no tiles). One Error line for another mode, or tensor-core on
    osm's own loop, whose matmuls are numpy's. Every entry point resolves its `mma` here.

    Example: mma_for("fa2", None) -> "tensor-core"; mma_for("tiles", None) -> "blas"
    """
    if mma is None:
        return TILES_MMA if kernel in (None, "tiles") else PRESET_MMA
    if mma not in MMAS:
        raise OsmError(f"`mma` must be one of {', '.join(MMAS)}, not {mma!r}")
    if kernel in (None, "tiles") and mma != TILES_MMA:
        raise OsmError(f"`mma` {mma} models a kernel preset's matmuls; `kernel` tiles is osm's "
                       "own loop")
    return mma


def preset(name: str) -> Preset:
    """The preset of a kernel name; a usage error listing them for any other name.

    Example: preset("fa4").block_k(128) -> 128
    """
    if name not in PRESETS:  # "tiles" runs flash/ itself (model.run)
        raise OsmError(f"unknown kernel {name!r}; the presets are {', '.join(KERNELS)}")
    return PRESETS[name]  # "tiles" is no preset: flash/'s own loop


def default_kernel(dtype: str | None, opts=None) -> str:
    """The kernel a run models when none is named: fa2 for 16-bit inputs, fa4-sm100 for FP8
    (the one FP8 kernel of the presets), osm's own tiles for fp32 and fp64. With opts (a
    ScoreOptions) the first of those kernels that takes the run's options: fa4 for 16-bit
    inputs with sinks (FA2 has none), tiles for a float mask, ALiBi with sinks or a
    score_mod.

    Example: default_kernel("bfloat16") -> "fa2"
    """
    candidates = {**dict.fromkeys(SIXTEEN, ("fa2", "fa4")),
                  **dict.fromkeys(EIGHT, ("fa4-sm100",))}.get(dtype, ())
    if opts is None:
        return candidates[0] if candidates else "tiles"
    asks = _asks(opts)
    for name in candidates:
        p = PRESETS[name]
        if (not asks["alibi"] or p.alibi) and (not asks["sinks"] or p.sinks) \
                and not asks["float_mask"] and not asks["score_mod"]:
            return name
    return "tiles"


def kernel_for(model, kernel: str | None, opts=None) -> str | None:
    """The kernel the run of `model` (precision.model's Model, or None) models: the one named,
    else fa2 for 16-bit, fa4-sm100 for FP8 and osm's own tiles otherwise, or the first of
    these that takes opts' sinks, ALiBi or mask (default_kernel); None for precision naive
    (no tiles). A preset needs a model (`dtype`) and a tiled one."""
    if model is not None and model.precision == "naive":
        if kernel not in (None, "tiles"):
            raise OsmError(f"`kernel` {kernel} models a tiled kernel; `precision` naive is "
                           "one-shot attention")
        return None
    name = kernel or (default_kernel(model.name, opts) if model is not None else "tiles")
    if name != "tiles" and model is None:
        takes = " or ".join(PRESETS[name].dtypes)
        raise OsmError(f"`kernel` {name} models a kernel of {takes} inputs; give `dtype` "
                       "(e.g. `dtype` bf16), or `kernel` tiles for osm's own loop")
    return name


def judged_as(dtype: str | None, kernel: str | None, out, name: str, q, k, v):
    """(dtype, note): the dtype check judges a kernel's out in, `dtype` as given, else out's
    own; a kernel preset named for float32 tensors that all hold 16-bit values judges them
    in that dtype (a preset takes 16-bit inputs), and the note says so (None otherwise)."""
    from .check import output_dtype
    from .dtypes import dtype_name, fitting_16bit, resolve_dtype

    dt = dtype or output_dtype(out, name)
    dname = resolve_dtype(dt)[0] if isinstance(dt, str) else dtype_name(dt)
    if dtype is None and kernel not in (None, "tiles") and dname == "float32":
        narrow = fitting_16bit(out, q, k, v)
        if narrow is not None:
            return narrow, (f"`kernel` {kernel} takes 16-bit inputs; OUT, Q, K and V are "
                            f"float32 holding {narrow} values: judged as {narrow} (`dtype` "
                            "chooses)")
    return dt, None


def preset_refusals(name: str, *, order: str = "forward", form: str = "rescale",
                    splits: int | None = None, block_q: int | None = None,
                    descale=None, dtype: str | None = None) -> None:
    """What kernel `name` does not take, as one error naming both: another tile order, the
    merge form, splits, block_q, descales off FP8; tiles takes no descales (nor any mma but
    blas: mma_for, which every entry point calls to resolve its mma). The one place these are
    checked, for every entry point."""
    if name == "tiles":
        if descale is not None:
            raise OsmError("`q_descale`, `k_descale` and `v_descale` are FP8's descale factors "
                           "of a kernel; `kernel` tiles is osm's own loop (use `kernel` "
                           "fa4-sm100)")
        return
    p = PRESETS[name]
    visits = "last to first" if p.reverse else "first to last"
    if order != "forward":
        raise OsmError(f"`order` {order} needs `kernel` tiles; {name} visits its K/V tiles "
                       f"{visits}")
    if form != "rescale":
        raise OsmError(f"`form` {form} needs `kernel` tiles; {name} updates its state in the "
                       "rescale form")
    if splits is not None:
        how = ("chooses its split-KV ranges itself (FA2's heuristic)" if p.split_kv
               else "runs its K/V in one pass")
        raise OsmError(f"`splits` {splits} needs `kernel` tiles; {name} {how}")
    if block_q is not None:
        raise OsmError(f"`block_q` {block_q} needs `kernel` tiles; {name} runs query tiles of "
                       f"{p.block_q} rows")
    if descale is not None and not any(d.startswith("float8") for d in p.dtypes):
        raise OsmError(f"`q_descale`, `k_descale` and `v_descale` scale FP8 inputs; kernel "
                       f"{name} takes no FP8 (`kernel` fa4-sm100 with `dtype` e4m3 or e5m2)")
    if descale is not None and not (dtype or "").startswith("float8"):
        raise OsmError("`q_descale`, `k_descale` and `v_descale` scale FP8 inputs; use them "
                       "with `dtype` e4m3 or e5m2")


def refuse_scale(kernel: str, scale: float | None) -> None:
    """One Error line for a `softmax_scale` ≤ 0 on a kernel preset: the kernels take each
    row's max of the unscaled S and fold the scale into exp2(S·c − max(S)·c), which stays ≤ 1
    only for a positive scale (with a negative one the kernel's P and α overflow, with 0 its
    rescale is NaN), so there is no kernel's arithmetic to model; osm's own tiles take the max
    of the scaled scores and run it (the scale note says what it does).

    Example: refuse_scale("fa2", -1.0) raises OsmError
    """
    if kernel not in (None, "tiles") and scale is not None and not scale > 0:
        raise OsmError(f"`softmax_scale` {scale:g}: kernel {kernel} takes each row's max of the "
                       "unscaled scores and exp2 of (S − max)·scale·log2 e, finite only for a "
                       "positive scale; `kernel` tiles runs it")


def _asks(opts) -> dict:
    """The options of a run that some presets do not take (Preset.check's keywords)."""
    mask = getattr(opts, "mask", None)
    return {"alibi": getattr(opts, "alibi_slopes", None) is not None,
            "sinks": getattr(opts, "sinks", None) is not None,
            "float_mask": mask is not None and getattr(mask, "dtype", None) is not None
            and mask.dtype.kind != "b",
            "score_mod": getattr(opts, "score_mod", None) is not None}


__all__ = ["EIGHT", "PRESETS", "SIXTEEN", "SMS", "Preset", "default_kernel", "fa2_plan",
           "judged_as", "kernel_for", "mma_for", "preset", "preset_refusals", "refuse_scale"]
