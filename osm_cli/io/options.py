"""Option values that name files or hold text, read into the library's records: the score
options and the kernels' inputs (`score_options`), FlexAttention's mods from their specs
(`read_mods`), FP8's descale factors (`read_descales`). The parameters are the library's names
(window_size "LEFT,RIGHT", attn_mask a file, alibi_slopes a file or "auto", …) and so are the
errors' words: the command line prints each `parameter` as its flag (cli/flags.py).

Leaves out: checking the values themselves (flash/options.ScoreOptions, api/keywords.descale
do it once for every entry point), the options' declarations (cli/).

Example: score_options(None, window_size="2,0").window -> (2, 0)
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from osm_cli.errors import InputError

from .load import check_real, load_array, load_function, load_mask, parse_pair

# the kernels' inputs that are integer index arrays (varlen and paged batches)
INDEX_ARRAYS = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table")


def read_array(path, name: str, ints: bool = False) -> np.ndarray:
    """An option's tensor file read into memory: real numbers (integers when `ints`)."""
    arr = load_array(Path(path), mmap=False)
    check_real(arr, path)
    if ints and arr.dtype.kind not in "iu":
        raise InputError(f"{path}: {name} must hold integers; it has dtype {arr.dtype}")
    return arr


def heads_of(q, layout: str, packed: bool) -> int:
    """The query heads of Q as given (1 for 1-D and 2-D inputs)."""
    shape = np.shape(q)
    if len(shape) < 3:
        return 1
    return shape[-2] if packed or layout == "bnhd" else shape[-3]


def read_mods(score_mod: str | None, mask_mod, heads: int) -> dict:
    """FlexAttention's score_mod and mask_mod from their specs (mask_mod: several, and-ed), as
    ScoreOptions' keywords (the ones given)."""
    from osm_cli.flash.mods import all_of, from_spec

    read = functools.partial(read_array, name="a mod's table")
    got = {}
    if score_mod is not None:
        got["score_mod"] = from_spec(score_mod, "score", read, load_function, heads)
    if mask_mod:
        got["mask_mod"] = all_of(*(from_spec(spec, "mask", read, load_function, heads)
                                   for spec in mask_mod))
    return got


def scores_with_mods(s, score_mod: str | None = None, mask_mod=None):
    """A score vector or matrix (trace's, sweep's) through the mods of these specs: row r is
    q_idx r, position j is kv_idx j (flash.mods.modded_scores); as it is without any."""
    if score_mod is None and not mask_mod:
        return s
    from osm_cli.flash.mods import modded_scores

    got = read_mods(score_mod, mask_mod, heads_of(s, "bhnd", False))
    return modded_scores(s, got.get("score_mod"), got.get("mask_mod"))


def kernel_inputs(q, layout: str = "bhnd", *, softcap: float | None = None, alibi_slopes=None,
                  learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                  page_table=None, kv_layout: str = "nhd", score_mod: str | None = None,
                  mask_mod=None) -> dict:
    """ScoreOptions' keywords for the kernels' inputs: the files read and checked, alibi_slopes
    "auto" as the standard slopes for Q's heads, the mods built from their specs."""
    from osm_cli.flash.options import alibi_auto

    got = {"softcap": softcap, "kv_layout": kv_layout}
    paths = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
             "seqused_k": seqused_k, "page_table": page_table}
    for name, path in paths.items():
        if path is not None:
            got[name] = read_array(path, f"`{name}`", ints=True)
    if learnable_sink is not None:
        got["sinks"] = read_array(learnable_sink, "`learnable_sink`")
    packed = any(p is not None for p in paths.values())
    if alibi_slopes == "auto":
        got["alibi_slopes"] = alibi_auto(heads_of(q, layout, packed))
    elif alibi_slopes is not None:
        got["alibi_slopes"] = read_array(alibi_slopes, "`alibi_slopes`")
    if score_mod is not None or mask_mod:
        got.update(read_mods(score_mod, mask_mod, heads_of(q, layout, packed)))
    return got


def score_options(q=None, *, causal: bool = False, causal_align: str = "bottom-right",
                  window_size: str | None = None, attn_mask: str | None = None,
                  softmax_scale: float | None = None, layout: str = "bhnd",
                  inputs: dict | None = None):
    """flash.options.ScoreOptions from option values: window_size "LEFT,RIGHT" (kept as given,
    -1,-1 too), attn_mask a mask file, `inputs` kernel_inputs' keywords (as given: paths)."""
    from osm_cli.flash.options import ScoreOptions

    win = None if window_size is None else parse_pair(window_size, "`window_size`")
    extra = {} if inputs is None else kernel_inputs(q, layout, **inputs)
    mask = None if attn_mask is None else load_mask(attn_mask)
    return ScoreOptions(causal=causal, scale=softmax_scale, layout=layout,
                        causal_align=causal_align, window=win, mask=mask, **extra)


def with_bundle_inputs(opts, path: str):
    """opts with the kernels' inputs a bundle holds (varlen, paged, sinks, ALiBi) where opts
    has none of its own."""
    from dataclasses import replace

    from .bundles import bundle_inputs

    held = bundle_inputs(path)
    return replace(opts, **{n: x for n, x in held.items() if getattr(opts, n) is None})


def read_descales(q_descale=None, k_descale=None, v_descale=None):
    """FP8's descale factors from their files as emulate.Descale (None when none is given):
    the files are read only when all three are given (precision.descale names a
    missing one first)."""
    from osm_cli.precision.descale import descale

    paths = {"q": q_descale, "k": k_descale, "v": v_descale}
    if any(p is None for p in paths.values()):
        return descale(*(None if p is None else 0.0 for p in paths.values()))
    arrays = {n: read_array(p, f"`{n}_descale`") for n, p in paths.items()}
    return descale(arrays["q"], arrays["k"], arrays["v"])


__all__ = ["INDEX_ARRAYS", "heads_of", "kernel_inputs", "read_array", "read_descales",
           "read_mods", "score_options", "scores_with_mods", "with_bundle_inputs"]
