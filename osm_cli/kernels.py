"""Real kernels' numerics as a namespace: the kernel presets (fa2, fa4, fa4-sm100: frozen
records of their schedule and arithmetic), `run_kernel` (a preset's forward on Q, K, V that
already hold its dtype's values, tensors first), the precision models and dtypes, and
FlashAttention's test rule.

    >>> import numpy as np
    >>> from osm_cli import kernels
    >>> kernels.preset("fa2").block_k(64)
    128
    >>> kernels.KERNELS
    ('fa2', 'fa4', 'fa4-sm100', 'tiles')

Leaves out: the emulation itself (precision/emulate.py), judging a kernel (osm_cli.check).
"""

from __future__ import annotations

from collections.abc import Callable

from osm_cli.api.forward import attention
from osm_cli.api.keywords import documented
from osm_cli.flash.forward import Attention
from osm_cli.precision.dtypes import limits, round_to, ulp
from osm_cli.precision.emulate import Descale
from osm_cli.precision.model import Model, model
from osm_cli.precision.names import KERNELS, MMAS
from osm_cli.precision.presets import PRESETS, Preset, default_kernel, preset
from osm_cli.precision.rule import fa_rule, judge


@documented()
def run_kernel(
    q, k, v, *, kernel: str = "fa2", softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple | None = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
    layout: str = "bhnd", kv_layout: str = "nhd", causal_align: str = "bottom-right",
    attn_mask=None, score_mod=None, mask_mod=None,
    block_k: int | None = None, rescale_threshold: float | None = None,
    dtype: str | None = None, mma: str | None = None, q_descale=None, k_descale=None,
    v_descale=None, masked_lse: str | None = None,
    trace_at: tuple | None = (0, 0, 0),
    progress: Callable[[int, int], None] | None = None,
) -> Attention:
    """A kernel preset's forward as the kernel computes it: its tiles, its order, exp2 on an
    FMA, its normalisation and its LSE (precision/emulate.py).

    Parameters
    ----------
    q, k, v : array
        Q, K, V holding the kernel's dtype values (a 16-bit or FP8 array, or float32 holding
        them), in `layout`.
    kernel : {{"fa2", "fa4", "fa4-sm100", "tiles"}}
        The preset whose loop runs ("tiles": osm's own loop with the dtype's rounding).
    {score}
    block_k : int, optional
        Replaces the kernel's own K/V tile width (a teaching run).
    rescale_threshold : float, optional
        Lazy rescale τ in natural-log units; None: the kernel's own for the dtype.
    dtype : str, optional
        The kernel's dtype; None: q's own (bfloat16, float16, float8).
    mma : {{"tensor-core", "blas"}}, optional
        How the matmuls round; None: a preset's "tensor-core" (bit-faithful), tiles' "blas".
    q_descale, k_descale, v_descale : array (B, Hkv), optional
        FP8's descale factors.
    masked_lse : {{"neg-inf", "pos-inf", "zero"}}, optional
        A fully masked row's LSE; None: the kernel's own.
    trace_at : (int, int, int or sequence of int) or None
        The traced (batch, head, query) row, or several queries of the head (`.trace.rows`).
    progress : callable, optional
        progress(done, total), called as Q tiles finish.

    Returns
    -------
    Attention
        As `osm_cli.attention`'s: out holds the kernel's output dtype's values (in float32
        where numpy has no such dtype), the LSE is float32.

    Examples
    --------
    >>> import numpy as np, ml_dtypes
    >>> from osm_cli.kernels import run_kernel
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 8, 64)).astype(ml_dtypes.bfloat16)
    ...            for _ in range(3))
    >>> r = run_kernel(q, k, v, kernel="fa2", causal=True)
    >>> r.options.kernel, r.lse.shape, bool((r.out.astype(ml_dtypes.bfloat16) == r.out).all())
    ('fa2', (1, 2, 8), True)
    """
    import numpy as np

    from osm_cli.precision.dtypes import dtype_name

    return attention(
        q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes, learnable_sink=learnable_sink,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        page_table=page_table, layout=layout, kv_layout=kv_layout, causal_align=causal_align,
        attn_mask=attn_mask, score_mod=score_mod, mask_mod=mask_mod, block_k=block_k,
        rescale_threshold=rescale_threshold,
        dtype=dtype or dtype_name(np.asarray(q).dtype), kernel=kernel, mma=mma,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, masked_lse=masked_lse,
        trace_at=trace_at, progress=progress)


__all__ = ["KERNELS", "MMAS", "PRESETS", "Descale", "Model", "Preset", "default_kernel",
           "fa_rule", "judge", "limits", "model", "preset", "round_to", "run_kernel", "ulp"]
