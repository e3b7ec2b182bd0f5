"""Where a kernel's backward rounds: the flash model of FA2's backward, and plain same-dtype
attention's gradients, FlashAttention's test `pt` (docs/numerics.md#backward-precision).

- flash: Q, K, V, O and dO in the dtype; D = rowsum(dO ∘ O) in float32; S, P, dP and dS in
  float32; P rounded to the dtype before Pᵀ·dO, dS rounded to the dtype before dS·K and
  dSᵀ·Q (the tensor cores' 16-bit operands); dQ, dK, dV accumulated in float32, times the
  scale at the end, rounded to the dtype once. Under GQA each query head's dK and dV are
  rounded to the dtype before the group's sum, as FA2 writes them per head and then sums;
  FA3/FA4 (--kernel fa4, fa4-sm100) sum the group in float32. Tiles: the kernel's backward
  tiles for the head dim (`fa2_backward_blocks`, `fa4_backward_blocks`).
- plain: autograd through plain attention in the dtype (model.plain), each op rounded.

A preset's backward (fa2, fa4) runs its kernel's own arithmetic instead (kernel_backward.py)
where its matmuls are the tensor cores' (the default) and it models the options
(`kernel_arithmetic`); the flash model above is then osm's own tiles', `mma="blas"`'s, and
fa4-sm100's, ALiBi's, a score_mod's, a float mask's and FA2's softcap's.

Leaves out: the tile loop (flash/backward.py), the verdict (rule.py), check (check.py).

Example: flash_backward(model("bf16"), q, k, v, do, out, lse).dq
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from osm_cli.flash.backward import Backward, attention_backward
from osm_cli.flash.options import Hooks, ScoreOptions, Tiling
from osm_cli.flash.reference import reference_backward

from .dtypes import bits, carrier, round_to
from .kernel_backward import KERNEL_BACKWARDS, kernel_backward
from .model import Model


def fa2_backward_blocks(d: int) -> tuple[int, int]:
    """(block_q, block_k) of FA2's backward on sm80 and later (run_mha_bwd_hdim*):
    128 × 128 up to d = 64, 64 × 128 up to d = 128, 64 × 64 beyond.
    Example: fa2_backward_blocks(64) -> (128, 128)"""
    if d <= 64:
        return 128, 128
    if d <= 128:
        return 64, 128
    return 64, 64


def fa4_backward_blocks(d: int, causal: bool = False) -> tuple[int, int]:
    """(block_q, block_k) of FA4's SM90 backward (flash_attn/cute, _tile_size_bwd_sm90):
    128 × 128 up to d = 64, 64 × 128 up to 96, 80 × 128 up to 128 (64 × 128 causal or local),
    64 × 96 up to 192, 64 × 48 beyond.
    Example: fa4_backward_blocks(128) -> (80, 128)"""
    if d <= 64:
        return 128, 128
    if d <= 96:
        return 64, 128
    if d <= 128:
        return (64 if causal else 80), 128
    return (64, 96) if d <= 192 else (64, 48)


GROUP_IN_FP32 = ("fa4", "fa4-sm100")  # FA3/FA4: a kv head's dK, dV summed over its group in fp32


def flash_hooks(m: Model, kernel: str | None = None) -> Hooks:
    """The backward's Hooks of model m: the state's dtype, P and dS rounded, and under GQA
    each query head's dK and dV rounded before the group's sum (FA2) or not (FA3/FA4, whose
    kv head accumulates its group in float32); none where the dtype is as wide as the state."""
    if m.p_round is None:
        return Hooks(m.accum)
    return Hooks(m.accum, m.round_p, m.round_p, None if kernel in GROUP_IN_FP32 else m.round_p)


def flash_backward(m: Model, q, k, v, do, out=None, lse=None, *,
                   opts: ScoreOptions | None = None, tiling: Tiling | None = None,
                   kernel: str | None = None, mma: str | None = None, arith=None,
                   **kwargs) -> Backward:
    """The flash model's backward: attention_backward with model m's rounding, dQ, dK, dV
    rounded to the dtype at the end. q, k, v and do hold the dtype's values already
    (round_inputs); out and lse are the forward's (a kernel's; without them osm's flash model
    runs the forward, O rounded to the dtype as a kernel stores it). kernel: the preset whose
    forward gives O and LSE (presets.py; default fa2 for 16-bit, fa4-sm100 for FP8, tiles
    otherwise) and whose backward is modelled: fa4 and fa4-sm100 take FA4's backward tiles and
    sum GQA's dK, dV in float32; the others FA2's tiles and per-head rounding. tiling replaces
    the tiles; mma is how the matmuls round (presets.mma_for: a preset's tensor cores by
    default): with "tensor-core" fa2 and fa4 run their kernel's own backward arithmetic too
    (kernel_backward.py: the order of D, S unscaled, P's exp2, the tensor cores' chained dK and
    dV), with "blas" osm's own backward arithmetic in the model's dtypes; arith, a
    kernel_backward.KernelBackward, replaces that arithmetic (an ablation:
    benchmarks/kernel_bits.py). kwargs are attention_backward's
    (trace_at, trace_key, progress)."""
    from .presets import default_kernel, mma_for, refuse_scale

    # score options given as keywords (causal=True …) hold for the forward run here too
    score = {key: kwargs.pop(key) for key in [key for key in kwargs if key in _SCORE_FIELDS]}
    opts = replace(opts or ScoreOptions(), **score)
    name = kernel or default_kernel(m.name, opts)
    mma = mma_for(name, mma)
    refuse_scale(name, opts.scale)
    if tiling is None:
        d = np.shape(q)[-1]
        tiling = Tiling(*(fa4_backward_blocks(d, bool(opts.causal or opts.window is not None))
                          if name in GROUP_IN_FP32 else fa2_backward_blocks(d)))
    own = out is None and lse is None
    if own:
        from .kernels import run_flash  # the forward's schedule, beside the backward's own

        extra = {} if name == "tiles" else {"mma": mma}
        fwd = run_flash(m, q, k, v, trace_at=None, kernel=name, opts=opts, **extra)
        out, lse = fwd.out, fwd.lse
    hooks = flash_hooks(m, name)
    if kernel_arithmetic(name, m, opts, mma):
        hooks = replace(hooks, kernel=arith or kernel_backward(name, mma))
    res = attention_backward(q, k, v, do, out=out, lse=lse, opts=opts, tiling=tiling,
                             hooks=hooks, **kwargs)
    res = replace(res, own_forward=own)
    if bits(m.dtype) >= bits(res.dq.dtype):
        return res
    dq, dk, dv = (round_to(x, m.dtype, x.dtype) for x in (res.dq, res.dk, res.dv))
    return replace(res, dq=dq, dk=dk, dv=dv)


_SCORE_FIELDS = frozenset(f.name for f in fields(ScoreOptions))


def kernel_arithmetic(name: str, m: Model, opts: ScoreOptions, mma: str) -> bool:
    """Whether flash_backward runs kernel `name`'s own backward arithmetic (kernel_backward.py)
    rather than osm's: with the tensor cores' matmuls (mma, resolved), for fa2 and fa4 in 16
    bits, and for options it models: not ALiBi, a score_mod, a float mask, nor FA2's softcap.

    Example: kernel_arithmetic("fa2", model("bf16"), ScoreOptions(), "tensor-core") -> True
    """
    mask = opts.mask
    return (mma == "tensor-core" and name in KERNEL_BACKWARDS and m.p_round is not None
            and opts.alibi_slopes is None and opts.score_mod is None
            and (name != "fa2" or opts.softcap is None)
            and (mask is None or np.asarray(mask).dtype.kind == "b"))


def plain_backward(q, k, v, do, dtype, opts: ScoreOptions | None = None,
                   **options) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of plain attention in `dtype` (FlashAttention's test `pt`, upcast=False):
    autograd's chain through model.plain with each op rounded, carried in float32."""
    dt = np.dtype(dtype)
    c = carrier(dt)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return reference_backward(q, k, v, do, opts, **options,
                                  rnd=lambda x: round_to(x, dt, c), carry=c)


__all__ = ["GROUP_IN_FP32", "fa2_backward_blocks", "fa4_backward_blocks", "flash_backward",
           "flash_hooks", "kernel_arithmetic", "plain_backward"]
