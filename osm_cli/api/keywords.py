"""FlashAttention's keyword names turned into osm's option records, once for every public
function: `score_options` (softmax_scale, causal, window_size, softcap, alibi_slopes,
learnable_sink, the varlen and paged batch's arrays, and osm's layout, causal_align, attn_mask)
-> flash.options.ScoreOptions; `descale` (q_descale, k_descale, v_descale) -> Descale (from
precision/descale.py, where io/ reaches it too); and the parameters' documentation, written
once and put into each function's docstring.

FlashAttention's conventions: window_size=(left, right) with -1 (or None, FA4's) for an
unbounded side, (-1, -1) no window; softcap=0.0 none; learnable_sink one logit per query head.
Leaves out: running anything, checks of the values themselves (ScoreOptions, masks.make_band,
shapes.as_bhnd make them, once, for every entry point).

Example:
    >>> score_options(causal=True, window_size=(128, 0)).window
    (128, 0)
    >>> score_options(window_size=(-1, -1), softcap=0.0).window is None
    True
"""

from __future__ import annotations

import operator

from osm_cli.errors import InputError
from osm_cli.flash.options import ScoreOptions
from osm_cli.precision.descale import descale

# the keywords every public function takes, in signature order (score_options' own)
SCORE = ("softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "learnable_sink",
         "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table", "layout", "kv_layout",
         "causal_align", "attn_mask", "score_mod", "mask_mod")


def score_options(*, softmax_scale: float | None = None, causal: bool = False,
                  window_size: tuple | None = (-1, -1), softcap: float | None = 0.0,
                  alibi_slopes=None, learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  seqused_k=None, page_table=None, layout: str = "bhnd", kv_layout: str = "nhd",
                  causal_align: str = "bottom-right", attn_mask=None, score_mod=None,
                  mask_mod=None) -> ScoreOptions:
    """The ScoreOptions record of FlashAttention's keywords (see SCORE_DOC)."""
    return ScoreOptions(
        causal=bool(causal), scale=None if softmax_scale is None else float(softmax_scale),
        layout=layout, causal_align=causal_align, window=window(window_size), mask=attn_mask,
        softcap=softcap or None, alibi_slopes=alibi_slopes, sinks=learnable_sink,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        page_table=page_table, kv_layout=kv_layout, score_mod=score_mod, mask_mod=mask_mod)


def scores_of(given: dict) -> ScoreOptions:
    """score_options of a public function's locals() (its SCORE keywords)."""
    return score_options(**{name: given[name] for name in SCORE})


def window(window_size) -> tuple | None:
    """FlashAttention's window_size as osm's window: None for no window ((-1, -1), None)."""
    if window_size is None:
        return None
    try:
        left, right = window_size
        sides = tuple(-1 if x is None else operator.index(x) for x in (left, right))
    except (TypeError, ValueError):
        raise InputError("`window_size` must be a pair (left, right) of whole numbers of keys, "
                         f"-1 for an unbounded side; got {window_size!r}") from None
    return None if all(x < 0 for x in sides) else sides


SCORE_DOC = """\
softmax_scale : float, optional
        The scores' scale; None: 1/sqrt(d), d the head dim (docs/numerics.md#scale).
    causal : bool
        Hide the keys after each query (aligned by causal_align).
    window_size : (int, int)
        (left, right) keys seen around each query's diagonal; -1 (or None) an unbounded
        side, (-1, -1) no window (FlashAttention's convention).
    softcap : float
        C: a scaled score s becomes C·tanh(s / C); 0.0 none (docs/numerics.md#softcap).
    alibi_slopes : array (H,) or (B, H), optional
        ALiBi: −slope·|i + s − t − j| is added to the scores (docs/numerics.md#alibi).
    learnable_sink : array (H,), optional
        One logit per query head, in the softmax's denominator only (FA4's attention sinks).
    cu_seqlens_q, cu_seqlens_k : int array (B + 1,), optional
        Varlen: packed Q (total_q, H, d) and K/V, sequence b at cu[b]:cu[b + 1].
    seqused_k : int array (B,), optional
        The keys each sequence uses (a paged cache's length).
    page_table : int array (B, max_pages), optional
        Paged K/V: each sequence's page indices into K and V.
    layout : {"bhnd", "bnhd"}
        Dense Q, K, V as (B, H, N, d) (PyTorch) or (B, N, H, d) (FlashAttention); 3-D and
        2-D inputs drop the leading axes.
    kv_layout : {"nhd", "hnd"}
        A paged cache's pages: (num_pages, page_size, Hkv, d) or (num_pages, Hkv, page_size, d).
    causal_align : {"bottom-right", "top-left"}
        Where the causal diagonal sits when queries and keys differ in number.
    attn_mask : array, optional
        Broadcast to (B, H, t, s): bool True = attend, or float added to the scores.
    score_mod : callable, optional
        FlexAttention's score_mod(score, b, h, q_idx, kv_idx) -> score, on the scaled scores
        before the masks, called on whole tiles with broadcast index arrays (docs/score-mod.md).
    mask_mod : callable or list of callables, optional
        FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool, True = attend (a list: and-ed);
        tiles it hides are skipped, only partial ones are masked."""

KERNEL_DOC = """\
dtype : str, optional
        The kernel's dtype ("bf16", "fp16", "e4m3", …): Q, K, V are rounded to it and the
        kernel's precision model runs; None: osm's own loop in the inputs' precision.
    kernel : {"fa2", "fa4", "fa4-sm100", "tiles"}, optional
        The kernel whose loop and arithmetic run; None: fa2 for 16-bit dtypes, fa4-sm100 for
        FP8, tiles (osm's own loop) otherwise.
    mma : {"tensor-core", "blas"}, optional
        How a kernel preset's matmuls round; None: "tensor-core", the tensor cores' truncating
        float32 accumulation, bit-faithful (docs/numerics.md#tensor-cores); "blas": numpy's
        float32 BLAS, within an ulp and about twice as fast (osm's own tiles: always)."""


def documented(**parts: str):
    """Put the shared parameter docs into a function's docstring ({score}, {kernel})."""
    def put(fn):
        fn.__doc__ = fn.__doc__.format(score=SCORE_DOC, kernel=KERNEL_DOC, **parts)
        return fn
    return put


__all__ = ["KERNEL_DOC", "SCORE", "SCORE_DOC", "descale", "documented", "score_options",
           "scores_of", "window"]
