"""`attention` and `attention_reference` in FlashAttention's words: tensors first, every
keyword explicit, the LSE as FlashAttention returns it ((B, H, N) for any layout; (H, total_q)
for a varlen batch).

`attention` runs osm's own tiled loop (flash/), or with dtype= a kernel's precision model
(precision/): what `osm attention` runs, through the same report (reports/attention.py), so
the library and the command line agree bit for bit. `attention_reference` is the float64
one-shot softmax(scale·Q·Kᵀ + mask)·V, its gradients with dout, or with dtype= plain attention
rounded op by op (FlashAttention's test `pt`, upcast=False).
Leaves out: the backward (backward.py), judging a kernel (check.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from osm_cli.flash.forward import Attention
from osm_cli.flash.options import Tiling

from .keywords import descale, documented, scores_of


@documented()
def attention(
    q, k, v, *, softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple | None = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
    layout: str = "bhnd", kv_layout: str = "nhd", causal_align: str = "bottom-right",
    attn_mask=None, score_mod=None, mask_mod=None,
    block_q: int | None = None, block_k: int | None = None,
    form: str = "rescale", rescale_threshold: float | None = None, dtype: str | None = None,
    kernel: str | None = None, mma: str | None = None, q_descale=None, k_descale=None,
    v_descale=None, masked_lse: str | None = None,
    trace_at: tuple | None = (0, 0, 0),
    progress: Callable[[int, int], None] | None = None,
) -> Attention:
    """softmax(softmax_scale·Q·Kᵀ + mask)·V, tile by tile, as FlashAttention computes it.

    Parameters
    ----------
    q, k, v : array
        Q (…, t, d), K (…, s, d), V (…, s, dv) in `layout`; K/V may have fewer heads (GQA).
    {score}
    block_q, block_k : int, optional
        The tiles' rows and keys; None: FA2's tiles for the head dim (a kernel's own).
    form : {{"rescale", "merge"}}
        The online update's form (docs/numerics.md#update-forms); osm's own loop only.
    rescale_threshold : float, optional
        Lazy rescale τ, natural log (docs/numerics.md#lazy-rescale); None: the kernel's own.
    {kernel}
    q_descale, k_descale, v_descale : array (B, Hkv), optional
        FP8's descale factors (FA3's names): the inputs hold x / descale.
    masked_lse : {{"neg-inf", "pos-inf", "zero"}}, optional
        The LSE of a row every key is hidden from; None: the kernel's own (−inf for tiles).
    trace_at : (int, int, int or sequence of int) or None
        (batch, head, query): the row whose tiles are recorded in `.trace.steps`; a
        sequence of queries, (0, 1, range(4)), traces those rows side by side
        (`.trace.rows`, `.trace.queries`, `.trace.outs`; `.trace.steps` is the first's);
        None: none.
    progress : callable, optional
        progress(done, total), called as Q tiles finish.

    Returns
    -------
    Attention
        `.out` shaped like Q (dv last), `.lse` (B, H, t) whatever the layout ((H, total_q) for
        a varlen batch); beside them the run: `.shapes`, `.options` (softmax_scale, causal,
        window, …), `.tiles` (block_q, block_k, computed, skipped, …), `.counters` (rescales,
        masked_rows, row_visits) and `.trace` (`.trace.steps`: the traced row's tiles).

    Examples
    --------
    >>> import numpy as np, osm_cli
    >>> q = k = v = np.eye(4)[None, None]
    >>> r = osm_cli.attention(q, k, v, softmax_scale=1.0, causal=True, block_k=2)
    >>> r.out.shape, r.lse.shape
    ((1, 1, 4, 4), (1, 1, 4))
    >>> [round(float(x), 4) for x in r.out[0, 0, 1]]
    [0.2689, 0.7311, 0.0, 0.0]
    >>> r.tiles.computed, r.tiles.skipped, r.options.softmax_scale
    (2, 0, 1.0)
    """
    from osm_cli.precision.model import prepare
    from osm_cli.reports.attention import attention_report

    opts = scores_of(locals())
    m, (q, k, v), notes = prepare(dtype, None, None, q, k, v)
    rep = attention_report(
        q, k, v, opts, Tiling(block_q=block_q, block_k=block_k, form=form), model=m,
        notes=notes, with_reference=False, progress=progress, kernel=kernel,
        mma=mma, descale=descale(q_descale, k_descale, v_descale),
        rescale_threshold=rescale_threshold, masked_lse=masked_lse, trace_at=trace_at)
    return rep.result


@dataclass(frozen=True)
class Reference:
    """What `attention_reference` returns: out and lse, and with dout the gradients."""

    out: np.ndarray
    lse: np.ndarray  # FlashAttention's layout, as attention's
    dq: np.ndarray | None = None
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None
    dsink: np.ndarray | None = None  # with learnable_sink: dL/dsink per query head

    @property
    def grads(self) -> tuple:
        """(dq, dk, dv)."""
        return self.dq, self.dk, self.dv

    def __iter__(self):
        """out, lse = attention_reference(...), as FlashAttention's attention_ref unpacks."""
        return iter((self.out, self.lse))


@documented()
def attention_reference(
    q, k, v, *, softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple | None = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
    layout: str = "bhnd", kv_layout: str = "nhd", causal_align: str = "bottom-right",
    attn_mask=None, score_mod=None, mask_mod=None,
    dout=None, dtype: str | None = None,
) -> Reference:
    """The one-shot attention every tiled run is compared with (FlashAttention's
    `attention_ref`): float64 by default, or plain attention in `dtype`.

    Parameters
    ----------
    q, k, v : array
        As `attention`'s.
    {score}
    dout : array, optional
        The upstream gradient dO (shaped like out): the gradients dq, dk, dv (and dsink) too.
    dtype : str, optional
        None: float64 throughout (upcast=True). A dtype ("bf16", "fp16", …): each op rounded
        to it with float32 inside, as PyTorch computes 16-bit tensors (upcast=False).

    Returns
    -------
    Reference
        `.out`, `.lse` (shaped as `attention`'s), and with dout `.dq`, `.dk`, `.dv`
        (`.dsink` with learnable_sink).

    Examples
    --------
    >>> import numpy as np, osm_cli
    >>> q = k = v = np.eye(4)[None, None]
    >>> ref = osm_cli.attention_reference(q, k, v, softmax_scale=1.0, causal=True)
    >>> bool(np.allclose(ref.out, osm_cli.attention(q, k, v, softmax_scale=1.0,
    ...                                             causal=True).out))
    True
    >>> osm_cli.attention_reference(q, k, v, dout=np.ones((1, 1, 4, 4))).dq.shape
    (1, 1, 4, 4)
    """
    opts = scores_of(locals())
    if dtype is None:
        from osm_cli.flash.reference import reference, reference_backward

        out, lse = reference(q, k, v, opts)
        grads = None if dout is None else reference_backward(q, k, v, dout, opts)
    else:
        from osm_cli.precision.backward import plain_backward
        from osm_cli.precision.dtypes import resolve_dtype
        from osm_cli.precision.model import plain

        dt = resolve_dtype(dtype)[1]
        out, lse = plain(q, k, v, dt, opts)
        grads = None if dout is None else plain_backward(q, k, v, dout, dt, opts)
    if grads is None:
        return Reference(out, lse)
    return Reference(out, lse, *grads, dsink=getattr(grads, "dsink", None))


__all__ = ["Reference", "attention", "attention_reference"]
