"""`attention_backward` in FlashAttention's words: dQ, dK, dV (and dsink) for the upstream
gradient dout, tile by tile, from the forward's out and lse (a kernel's, or osm's own).

What `osm backward` runs, through the same report (reports/backward.py): osm's own loop, or
with dtype= a kernel's backward model (FA2's, or FA4's for fa4 and fa4-sm100).
Leaves out: the forward (forward.py), judging a kernel's gradients (check.py).
"""

from __future__ import annotations

from collections.abc import Callable

from osm_cli.flash.backward import Backward
from osm_cli.flash.options import Tiling

from .keywords import documented, scores_of


@documented()
def attention_backward(
    q, k, v, out, dout, *, lse=None, softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple | None = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
    layout: str = "bhnd", kv_layout: str = "nhd", causal_align: str = "bottom-right",
    attn_mask=None, score_mod=None, mask_mod=None,
    block_q: int | None = None, block_k: int | None = None,
    dtype: str | None = None, kernel: str | None = None, mma: str | None = None,
    trace_at: tuple | None = (0, 0, 0), trace_key: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Backward:
    """The gradients of softmax(softmax_scale·Q·Kᵀ + mask)·V for dout, FlashAttention-2's
    backward loop (dQ, dK, dV from P recomputed with the LSE, D = rowsum(dO ∘ O)).

    Parameters
    ----------
    q, k, v : array
        As `attention`'s.
    out : array or None
        The forward's output; None (with lse None): osm runs its own forward first.
    dout : array
        The upstream gradient dO, shaped like out.
    lse : array, optional
        The forward's LSE, (B, H, N) as FlashAttention returns it (for bnhd inputs also
        (B, N, H)), in any masked-row convention; given with out.
    {score}
    block_q, block_k : int, optional
        The backward's tiles; None: FA2's forward tiles (a kernel model: its backward's).
    {kernel}
    trace_at : (int, int, int or sequence of int) or None
        (batch, query head, query): the traced query row; a sequence of queries traces each
        (`.trace.rows`, `.trace.queries`); None: no traces.
    trace_key : int
        The key row traced in that query head's kv head.
    progress : callable, optional
        progress(done, total), called as K/V tiles finish.

    Returns
    -------
    Backward
        `.dq`, `.dk`, `.dv` shaped like q, k, v; `.delta` (D, shaped like the LSE); `.dsink`
        with learnable_sink; `.shapes`, `.options`, `.tiles`, `.counters` as attention's, and
        `.trace`: the query rows' steps (`.trace.steps`, `.trace.rows`) and the traced key's
        (`.trace.key_steps`).

    Examples
    --------
    >>> import numpy as np, osm_cli
    >>> q = k = v = np.eye(4)[None, None]
    >>> g = osm_cli.attention_backward(q, k, v, None, np.ones((1, 1, 4, 4)), causal=True)
    >>> g.dq.shape, g.delta.shape
    ((1, 1, 4, 4), (1, 1, 4))
    """
    from osm_cli.precision.model import prepare
    from osm_cli.reports.backward import backward_report

    opts = scores_of(locals())
    m, (q, k, v), _ = prepare(dtype, None, None, q, k, v)
    if m is not None:
        from osm_cli.precision.dtypes import round_inputs

        dout = round_inputs({"dO": dout}, m.dtype)[0][0]
    rep = backward_report(q, k, v, dout, opts, Tiling(block_q=block_q, block_k=block_k),
                          out=out, lse=lse, model=m, with_reference=False, kernel=kernel,
                          mma=mma, trace_at=trace_at, trace_key=trace_key,
                          progress=progress)
    return rep.result


__all__ = ["attention_backward"]
