"""A kernel preset's backward arithmetic, step by step (docs/numerics.md#kernel-backward): what
FlashAttention-2 (PyTorch's flash SDPA backend) and FlashAttention-4 (SM90) do to the bits of
dQ, dK and dV, as a hook that osm's tiled backward loop (flash/backward.py) runs in place of
its own tile update.

Per (Q tile, K/V tile) pair, in float32 as the kernels hold it:
  S  = Q·Kᵀ unscaled (the tensor cores: gpu_ops.matmul), softcapped as FA4's score_mod
  P  = ex2(S·c − LSE·log2e): FA2 rounds both products first (UNFUSE_FMA), FA4 one FMA
  dP = dO·Vᵀ;  dS = P·(dP − D), each op rounded;  FA4's softcap: dS·(1 − tanh²)
  dV += P16ᵀ·dO and dK += dS16ᵀ·Q in the tensor cores' accumulators, chained over the Q tiles
  (FA2 visits them last to first); dQ_i gets dS16·K, a fresh accumulator per K/V tile, added
  in float32 (the GPU's atomics: their order varies between runs, docs/numerics.md)
D = rowsum(dO ∘ O) in the kernel's order (`delta`): each thread sums its 8-column chunks in
turn, then the threads of a row in a butterfly (FA2: offsets from half the threads down; FA4:
from 1 up). At the end dQ·scale and dK·scale (FA4 under GQA: each kv head's group summed in
float32 first), rounded to the dtype. Where numba is installed, P, dS and their bfloat16
operands come from one compiled pass over the tile (_bwd_numba.py, the same bits as the numpy
arithmetic here, which stays for the rest: FA4's softcap, other Ops, no numba).

Leaves out: the loop, the masks and the traces (flash/backward.py), FA2's softcap and ALiBi
(PyTorch's build has neither), score_mods, dsink (osm's formula), FP8.

Example: flash_backward(model("bf16"), q, k, v, do, out, lse, kernel="fa2", mma="tensor-core")
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.backward import GradUpdate
from osm_cli.flash.masks import apply_masks

from . import gpu_approx
from .dtypes import DTYPES
from .gpu_ops import F32, LOG2E, Ops, fma, matmul
from .mma import HAVE_NUMBA
from .model import Model

BF16 = DTYPES["bfloat16"]


@dataclass(frozen=True)
class KernelBackward:
    """One kernel's backward arithmetic (module docstring); the fields are what an ablation
    switches (benchmarks/kernel_ablation.py --backward)."""

    kernel: str  # "fa2" or "fa4": the defaults below follow it
    mma: str = "tensor-core"
    exp: str = "unfused"  # "unfused" (FA2), "fma" (FA4)
    delta: str = "fa2"  # "fa2", "fa4" (D's order), "plain" (float32, numpy's order)
    reverse_q: bool = True  # Q tiles last to first (FA2)
    group_fp32: bool = False  # GQA: a kv head's dK, dV summed over its group in float32 (FA4)
    scale_c: str = "f32"  # c = scale·log2e: "f32" (float32 scale times float32 log2e, FA2's
    # fl(double(scale)·log2e) gives the same for the captures) or "f64" (from the double scale)
    dtanh: str = "fma"  # FA4's softcap factor 1 − t²: "fma" (one rounding) or "two"
    head_dim: int = 0  # the kernel's instantiated head dim (FA2: 32, 64, 96, …); 0: from d
    ops: Ops = Ops()
    softcap_mode: str = "none"  # "score-mod" (FA4), "none"

    # ------------------------------------------------------------------ D
    def delta_of(self, do: np.ndarray, o: np.ndarray) -> np.ndarray:
        """D = rowsum(dO ∘ O) over the last axis, float32, in the kernel's order."""
        do = np.asarray(do, dtype=F32)
        o = np.asarray(o, dtype=F32)
        if self.delta == "plain" or do.size == 0:
            return np.einsum("...d,...d->...", do, o)
        d = do.shape[-1]
        hd = self.head_dim or _hdim(d)
        if self.delta == "fa2":
            width = 64 if hd % 64 == 0 else 32  # kBlockKSmem
        else:  # FA4's gmem_k_block_size (flash_bwd_preprocess.py)
            width = 128 if hd % 128 == 0 else 64 if hd % 64 == 0 else 32 if hd % 32 == 0 else 16
        threads = width // 8
        pad = hd - d
        if pad:
            zeros = np.zeros((*do.shape[:-1], pad), F32)
            do, o = np.concatenate([do, zeros], -1), np.concatenate([o, zeros], -1)
        # (…, iteration, thread, 8): thread t holds columns it·width + 8t + e
        prod = (do * o).reshape(*do.shape[:-1], hd // width, threads, 8)  # exact products
        seq = np.moveaxis(prod, -3, -2).reshape(*prod.shape[:-3], threads, -1)  # (…, t, it·8+e)
        acc = seq[..., 0].copy()
        for j in range(1, seq.shape[-1]):  # an FMA chain: the products are exact
            acc = (acc + seq[..., j]).astype(F32)
        return _butterfly(acc, descending=self.delta == "fa2")

    # ------------------------------------------------------------------ one tile pair
    def step(self, q, k, v, do, lse, d, *, scale: float, heads: int, dk, dv, visible=None,
             mask=None, softcap: float | None = None, p_round=None, ds_round=None,
             kt=None, vt=None) -> GradUpdate:
        """One (Q tile, K/V tile) pair for a stack of rows (…, rows, ·): q, do and lse, d (…,
        rows) of the tile's rows (g heads stacked, as flash/backward.py stacks them), k, v of
        its keys; dk and dv the K/V tile's accumulators per head (…, g, keys, ·). Returns the
        new accumulators as the update's dk and dv, and this tile's dQ share as its dq. kt and
        vt, where given, are Kᵀ and Vᵀ (the loop makes them once a K/V tile: fewer copies)."""
        q = np.ascontiguousarray(q, F32)  # each read by two matmuls: one copy, not two
        do = np.ascontiguousarray(do, F32)
        kt = np.swapaxes(k, -1, -2) if kt is None else kt
        vt = np.swapaxes(v, -1, -2) if vt is None else vt
        s = matmul(q, kt, self.mma)
        pre = None
        if softcap is not None:  # FA4: cap·tanh(S·scale / cap); the exponent's c is log2e
            cap = F32(softcap)
            with np.errstate(over="ignore"):
                pre = self.ops.tanh_(((s * F32(scale)).astype(F32) / cap).astype(F32))
            s = (cap * pre).astype(F32)
        s = apply_masks(s, visible, mask)
        c = F32(LOG2E) if softcap is not None else self._c(scale)
        if pre is None and self._compiled():  # P, dS and their roundings in one pass
            dp = matmul(do, vt, self.mma)
            p, ds, pr, dsr = _p_ds(s, lse, d, dp, c, self.exp == "fma", p_round, ds_round)
            return self._products(q, k, do, p, ds, pr, dsr, dp, heads, dk, dv)
        with np.errstate(invalid="ignore", over="ignore"):
            ls = (np.asarray(lse, F32) * F32(LOG2E)).astype(F32)[..., None]
            if self.exp == "unfused":
                x = ((s * c).astype(F32) - ls).astype(F32)
            else:
                x = fma(s, c, -ls)
            x = np.where(np.isnan(x), F32(-np.inf), x)  # −inf − (+inf): a masked row
        p = self.ops.exp2(x)
        dp = matmul(do, vt, self.mma)
        ds = (p * (dp - np.asarray(d, F32)[..., None]).astype(F32)).astype(F32)
        if pre is not None:
            factor = (fma(-pre, pre, F32(1)) if self.dtanh == "fma"
                      else (F32(1) - (pre * pre).astype(F32)).astype(F32))
            ds = (ds * factor).astype(F32)
        pr = p if p_round is None else p_round(p.copy())
        dsr = ds if ds_round is None else ds_round(ds.copy())
        return self._products(q, k, do, p, ds, pr, dsr, dp, heads, dk, dv)

    def _products(self, q, k, do, p, ds, pr, dsr, dp, heads, dk, dv) -> GradUpdate:
        """The tile's dQ share and the new dV, dK accumulators from P, dS and their 16-bit
        operands pr, dsr."""
        dq = matmul(dsr, k.astype(F32, copy=False), self.mma)
        lead, rows = p.shape[:-2], p.shape[-2]
        per = rows // heads

        def by_head(x):
            return x.reshape(*lead, heads, per, x.shape[-1])

        new_dv = matmul(np.swapaxes(by_head(pr), -1, -2), by_head(do), self.mma, dv)
        new_dk = matmul(np.swapaxes(by_head(dsr), -1, -2), by_head(q), self.mma, dk)
        return GradUpdate(p, ds, new_dv, new_dk, dq, dp)

    def _compiled(self) -> bool:
        """Whether P and dS take the compiled pass (_bwd_numba.py): numba installed, the
        H200's ex2 (the default Ops) from its compact tables, FA2's or FA4's exponent."""
        return (HAVE_NUMBA and self.ops.ex2 is gpu_approx.ex2 and self.exp in ("unfused", "fma")
                and gpu_approx.ex2_compact() is not None)

    def _c(self, scale: float) -> np.float32:
        if self.scale_c == "f64":
            return F32(float(scale) * (1.0 / np.log(2.0)))
        return F32(F32(scale) * F32(LOG2E))

    # ------------------------------------------------------------------ the group's sum
    def group_sum(self, x: np.ndarray) -> np.ndarray:
        """(G, g, …) summed over g one head after another in float32 (FA4's reduce-adds)."""
        acc = x[:, 0].copy()
        for h in range(1, x.shape[1]):
            acc = (acc + x[:, h]).astype(acc.dtype)
        return acc


def _p_ds(s, lse, d, dp, c, fused: bool, p_round, ds_round):
    """P, dS, P's and dS's 16-bit operands of step's numpy arithmetic (no softcap), by the
    compiled pass; bfloat16's rounding (a Model's round_p) there too, other rounders after."""
    from ._bwd_numba import p_ds

    shape = s.shape
    keys = shape[-1]
    s2 = np.ascontiguousarray(s, F32).reshape(-1, keys)
    dp2 = np.ascontiguousarray(dp, F32).reshape(-1, keys)
    with np.errstate(over="ignore", invalid="ignore"):
        ls = (np.asarray(lse, F32) * F32(LOG2E)).astype(F32).reshape(-1)
    d1 = np.ascontiguousarray(d, F32).reshape(-1)
    bf16 = _is_bf16(p_round) and _is_bf16(ds_round)
    p, ds = np.empty_like(s2), np.empty_like(s2)
    pr, dsr = (np.empty_like(s2), np.empty_like(s2)) if bf16 else (p, ds)
    nan = p_ds(s2, ls, d1, dp2, c, fused, *gpu_approx.ex2_compact(), p, ds, pr, dsr, bf16)
    p, ds, pr, dsr = (x.reshape(shape) for x in (p, ds, pr, dsr))
    if nan or not bf16:  # NaN's bits, other rounders: numpy's casts
        pr = p if p_round is None else p_round(p.copy())
        dsr = ds if ds_round is None else ds_round(ds.copy())
    return p, ds, pr, dsr


def _is_bf16(rnd) -> bool:
    """Whether rnd is a Model's round_p to bfloat16 (the compiled pass's own rounding)."""
    owner = getattr(rnd, "__self__", None)
    return (isinstance(owner, Model) and getattr(rnd, "__func__", None) is Model.round_p
            and owner.dtype == BF16)


def _hdim(d: int) -> int:
    """The head dim a kernel is instantiated for: d rounded up to a multiple of 32."""
    return -(-d // 32) * 32


def _butterfly(x: np.ndarray, descending: bool) -> np.ndarray:
    """The threads' (last axis) sum by shfl_xor: offsets n/2, n/4, …, 1 (descending) or 1, 2,
    …, n/2, as lane 0 ends with it."""
    n = x.shape[-1]
    offsets = []
    o = n // 2 if descending else 1
    while 1 <= o < n:
        offsets.append(o)
        o = o // 2 if descending else o * 2
    for o in offsets:
        idx = np.arange(n) ^ o
        x = (x + x[..., idx]).astype(F32)
    return x[..., 0]


def kernel_backward(name: str, mma: str, **changes) -> KernelBackward:
    """The backward arithmetic of preset `name` (fa2 or fa4) with mma's matmuls; changes
    replace fields (an ablation)."""
    base = {"fa2": dict(exp="unfused", delta="fa2", reverse_q=True, group_fp32=False),
            "fa4": dict(exp="fma", delta="fa4", reverse_q=False, group_fp32=True,
                        scale_c="f64", softcap_mode="score-mod")}[name]
    return KernelBackward(name, mma, **{**base, **changes})


KERNEL_BACKWARDS = ("fa2", "fa4")

__all__ = ["KERNEL_BACKWARDS", "KernelBackward", "kernel_backward"]
