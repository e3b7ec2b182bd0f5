"""The battery's targets: a kernel from `path/to/file.py:function` or `package.module:function`,
or a built-in adapter to a known kernel, each declaring the features it takes.

Built-ins: `sdpa` (torch's scaled_dot_product_attention; backend flash, efficient, cudnn or
math, on CUDA), `flex` (torch's flex_attention with FlexAttention's score_mod and mask_mod;
backend eager, the default, or compiled: torch.compile'd), `flash_attn` (FlashAttention-2's
flash_attn_func / flash_attn_varlen_func / flash_attn_with_kvcache), `flash_attn.cute`
(FlashAttention-4), `osm:fa2` and `osm:fa4` (osm's own kernel models, numpy: a self-test).
torch and the kernels' packages are imported only when their adapter is called.
Leaves out: calling with guards (kernel.py), judging (runner.py).

Example: load("tests/kernels/planted.py:flash").osm_features
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from osm_cli.errors import InputError

BUILTINS = ("sdpa", "flex", "flash_attn", "flash_attn.cute", "osm:fa2", "osm:fa4")
BACKENDS = ("flash", "efficient", "cudnn", "math")
FLEX_BACKENDS = ("eager", "compiled")
BACKEND_OF = {"sdpa": BACKENDS, "flex": FLEX_BACKENDS}


def load(target: str, backend: str | None = None) -> Callable:
    """The function TARGET names, a built-in adapter or `file.py:function` /
    `module:function`; an InputError that says what was not found."""
    if target in BUILTINS:
        return builtin(target, backend)
    if backend is not None:
        raise InputError("`backend` applies to the sdpa and flex targets only")
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise InputError(f"TARGET must be path/to/file.py:function, package.module:function or "
                         f"one of {', '.join(BUILTINS)}; got {target!r}")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise InputError(f"{where}: no such file")
        mod_name = f"osm_battery_target_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise InputError(f"{where}: not a Python file osm can load")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise InputError(f"{where}: loading it raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise InputError(f"cannot import {where}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"{where} has no function {name!r}")
    return fn


def declared_features(fn: Callable) -> frozenset | None:
    """fn.osm_features ("causal,gqa" or a list) as a set; None when it declares nothing."""
    raw = getattr(fn, "osm_features", None)
    if raw is None:
        return None
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    return frozenset(x.strip() for x in items if x.strip())


def _declare(fn: Callable, features: str, arrays: str = "torch") -> Callable:
    fn.osm_features = features
    fn.osm_arrays = arrays
    return fn


def builtin(name: str, backend: str | None = None) -> Callable:
    if backend is not None and name not in BACKEND_OF:
        raise InputError("`backend` applies to the sdpa and flex targets only")
    if backend is not None and backend not in BACKEND_OF[name]:
        raise InputError(f"backend must be one of {', '.join(BACKEND_OF[name])} for {name}, "
                         f"not {backend!r}")
    if name == "sdpa":
        return _declare(_sdpa(backend), "causal,gqa,grad")
    if name == "flex":
        return _declare(_flex(backend == "compiled"),
                        "causal,gqa,window,softcap,alibi,score_mod,mask_mod,lse,grad")
    if name == "flash_attn":
        return _declare(_flash_attn, "causal,gqa,window,softcap,alibi,varlen,paged,lse,grad")
    if name == "flash_attn.cute":
        return _declare(_flash_attn_cute, "causal,gqa,window,softcap,sink,varlen,paged,lse,grad")
    kernel = name.split(":")[1]
    return _declare(_osm_model(kernel), "causal,gqa,window,softcap,alibi,varlen,paged,lse"
                    + (",sink" if kernel == "fa4" else ""), "numpy")


def _sdpa(backend: str | None) -> Callable:
    def sdpa(q, k, v, softmax_scale=None, causal=False):
        """torch's scaled_dot_product_attention on FlashAttention's (B, N, H, d) layout;
        causal bottom-right (causal_lower_right), GQA through enable_gqa."""
        import contextlib

        from torch.nn.functional import scaled_dot_product_attention

        mask = None
        if causal:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(q.shape[1], k.shape[1])
        ctx = contextlib.nullcontext()
        if backend is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient":
                     SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                     "math": SDPBackend.MATH}[backend]
            ctx = sdpa_kernel([which])
        with ctx:
            out = scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                scale=softmax_scale, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)

    sdpa.__name__ = f"sdpa_{backend}" if backend else "sdpa"
    return sdpa


def _flex(compiled: bool) -> Callable:
    def flex(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
             alibi_slopes=None, score_mod=None, mask_mod=None):
        """torch's flex_attention: the masks as a mask_mod (bottom-right) and-ed with the
        case's mask_mod, softcap and ALiBi as a score_mod before the case's score_mod, in
        osm's order; -> (out, lse)."""
        import warnings

        import torch
        from torch.nn.attention.flex_attention import create_block_mask

        b, t, h, _ = q.shape
        s = k.shape[1]
        left, right = window_size
        if causal:
            right = 0
        off = s - t

        def mask_all(bb, hh, i, j):
            ok = j >= 0
            if right >= 0:
                ok = ok & (j <= i + off + right)
            if left >= 0:
                ok = ok & (j >= i + off - left)
            if mask_mod is not None:
                ok = ok & mask_mod(bb, hh, i, j)
            return ok

        def score_all(score, bb, hh, i, j):
            if softcap:
                score = softcap * torch.tanh(score / softcap)
            if alibi_slopes is not None:
                slope = alibi_slopes[bb, hh] if alibi_slopes.dim() == 2 else alibi_slopes[hh]
                score = score - slope * (i + off - j).abs()
            if score_mod is not None:
                score = score_mod(score, bb, hh, i, j)
            return score

        block = None
        if left >= 0 or right >= 0 or mask_mod is not None:
            block = create_block_mask(mask_all, None, None, t, s, device=q.device)
        modded = softcap or alibi_slopes is not None or score_mod is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex without torch.compile warns that it is unfused
            out, lse = _flex_attention(compiled)(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                score_mod=score_all if modded else None, block_mask=block,
                scale=softmax_scale, enable_gqa=k.shape[2] != h, return_lse=True)
        return out.transpose(1, 2), lse

    flex.__name__ = "flex_compiled" if compiled else "flex"
    return flex


_COMPILED: list = []


def _eager(flex_attention) -> Callable:
    """Eager flex_attention traces its score_mod with Dynamo; after a battery's many shapes
    Dynamo's automatic dynamic shapes made that trace fail on the GPU with gradients
    (TorchRuntimeError from its fake-tensor pass, on an H200 with torch 2.11), so each shape
    is traced as it is."""
    def flex(*args, **kwargs):
        import torch

        with torch._dynamo.config.patch(automatic_dynamic_shapes=False, cache_size_limit=1024):
            return flex_attention(*args, **kwargs)

    return flex


def _flex_attention(compiled: bool) -> Callable:
    """flex_attention, or once torch.compile'd (recompiling as shapes and mods change, with
    room for every case of a battery)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return _eager(flex_attention)
    if not _COMPILED:
        import torch

        torch._dynamo.config.cache_size_limit = 1024
        torch._dynamo.config.accumulated_cache_size_limit = 4096
        _COMPILED.append(torch.compile(flex_attention))
    return _COMPILED[0]


def _flash_attn(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None, seqused_k=None, page_table=None):
    """FlashAttention-2: flash_attn_func, flash_attn_varlen_func, or flash_attn_with_kvcache
    for a paged cache; -> (out, lse)."""
    import flash_attn

    common = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size,
              "softcap": softcap, "alibi_slopes": alibi_slopes}
    if page_table is not None:
        return flash_attn.flash_attn_with_kvcache(
            q, k, v, cache_seqlens=seqused_k, block_table=page_table, return_softmax_lse=True,
            **common)
    if cu_seqlens_q is not None:
        out, lse, _ = flash_attn.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            return_attn_probs=True, **common)
        return out, lse
    out, lse, _ = flash_attn.flash_attn_func(q, k, v, return_attn_probs=True, **common)
    return out, lse


def _flash_attn_cute(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                     softcap=0.0, learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None,
                     max_seqlen_q=None, max_seqlen_k=None, seqused_k=None, page_table=None):
    """FlashAttention-4 (flash_attn.cute): flash_attn_func, or flash_attn_varlen_func for a
    varlen batch or a paged cache (q (B, N, H, d) with page_table and seqused_k; its backward
    takes no page_table, and the battery asks none of a paged case); window sides of −1 become
    None, its 'unbounded'; return_lse=True, since FA4 computes no LSE for a call that needs no
    backward otherwise; -> (out, lse)."""
    from flash_attn import cute

    win = tuple(None if w is None or w < 0 else int(w) for w in window_size)
    common = {"softmax_scale": softmax_scale, "causal": causal, "window_size": win,
              "softcap": softcap, "learnable_sink": learnable_sink, "return_lse": True}
    if page_table is not None:
        got = cute.flash_attn_varlen_func(q, k, v, page_table=page_table, seqused_k=seqused_k,
                                          **common)
    elif cu_seqlens_q is not None:
        got = cute.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens_q,
                                          cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                          **common)
    else:
        got = cute.flash_attn_func(q, k, v, **common)
    return got[0], got[1]


def _osm_model(kernel: str) -> Callable:
    def model_kernel(q, k, v, softmax_scale=None, causal=False, window_size=None, softcap=None,
                     alibi_slopes=None, learnable_sink=None, cu_seqlens_q=None,
                     cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None,
                     page_table=None):
        """osm's model of the kernel (precision/presets.py) on numpy arrays; -> (out, lse)."""
        from osm_cli.flash.options import ScoreOptions
        from osm_cli.precision.dtypes import dtype_name
        from osm_cli.precision.kernels import run_flash
        from osm_cli.precision.model import model

        packed = cu_seqlens_q is not None or page_table is not None
        # a dense batch runs as (B, H, N, d): osm's FA2 split-KV path mishandles bnhd (its
        # combine broadcasts (B, N, H) partials against (B, H, N) LSEs; the battery found it)
        dense = not packed
        opts = ScoreOptions(
            causal=causal, scale=softmax_scale, layout="bhnd" if dense else "bnhd",
            window=None if window_size is None else tuple(int(w) for w in window_size),
            softcap=softcap or None, alibi_slopes=alibi_slopes, sinks=learnable_sink,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
            page_table=page_table)
        dt = np.asarray(q).dtype
        if dense:
            q, k, v = (np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k, v))
        res = run_flash(model(dtype_name(dt)), q, k, v, kernel=kernel, opts=opts, trace_at=None)
        out = np.asarray(res.out)
        out = np.swapaxes(out, 1, 2) if dense else out
        lse = np.asarray(res.lse, dtype=np.float32)  # (B, H, N), or (H, total) for varlen
        lse = np.where(np.isneginf(lse), math.inf, lse)
        return np.ascontiguousarray(out).astype(dt), lse

    model_kernel.__name__ = f"osm_{kernel}"
    return model_kernel


__all__ = ["BACKENDS", "BUILTINS", "FLEX_BACKENDS", "builtin", "declared_features", "load"]
