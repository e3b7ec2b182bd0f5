"""Split-KV (Flash-Decoding): K/V cut into key ranges, each run to (O_s, LSE_s), then merged.

`split_runs` runs the tiled forward over each key range (the parts of a split-KV run, also
used by precision/'s FA2 schedule); `split_kv` cuts the keys into near-equal chunks, merges
the parts with core.merge and compares the result with the unsplit run
(docs/numerics.md#split-kv-merge). Leaves out: the merge arithmetic itself (core/merge.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.merge import merge_detail, split_edges
from osm_cli.core.reference import max_abs_diff
from osm_cli.errors import InputError

from .forward import Attention, attention, masked_as
from .options import Tiling, default_blocks, layout_of
from .plan import O_SHOWN
from .shapes import as_bhnd, row_of


@dataclass(frozen=True)
class Split:
    """One split of a split-KV run, as the traced row saw it."""

    split: int
    start: int
    stop: int
    lse: float
    weight: float
    o: np.ndarray  # first O_SHOWN components of the normalised O_s


@dataclass(frozen=True)
class SplitRun:
    """Flash-Decoding: K/V cut into chunks, each run to (O_s, LSE_s), then merged."""

    out: np.ndarray
    lse: np.ndarray
    splits: tuple[Split, ...]
    max_abs_diff: float  # merged vs the unsplit run, over all of O
    max_lse_diff: float


def split_runs(q, k, v, ranges, *, reverse: bool = False, tiling: Tiling | None = None,
               **kwargs) -> list[Attention]:
    """attention over each key range (start, stop) of `ranges`: the parts of a split-KV run.

    kwargs are attention's; each part's fully masked rows get LSE -inf whatever masked_lse says,
    as a merge needs them. reverse visits each part's K/V tiles last to first (FA2's kernel).
    """
    kwargs = {**kwargs, "masked_lse": "neg-inf"}
    tiling = tiling or Tiling()
    bk = tiling.block_k or kwargs.get("block_k") or default_blocks(np.shape(q)[-1])[1]
    parts = []
    for a, b in ranges:
        order = np.arange(-(-(b - a) // bk))[::-1] if reverse else tiling.order
        parts.append(attention(q, k, v, tiling=replace(tiling, keys=(int(a), int(b)),
                                                       order=order), **kwargs))
    return parts


def split_kv(q, k, v, splits: int, unsplit: Attention, **kwargs) -> SplitRun:
    """Run attention on `splits` near-equal chunks of the keys and merge them.

    kwargs are attention's (opts, tiling, hooks or their fields, traced row); empty chunks get
    LSE -inf and weight 0. The result is compared with `unsplit`, the same run without
    splitting.
    """
    if splits < 1:
        raise InputError(f"`splits` must be at least 1, not {splits}")
    layout = layout_of(kwargs)
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    edges = split_edges(s, splits)
    parts = split_runs(q, k, v, zip(edges[:-1], edges[1:], strict=True), **kwargs)
    merged = merge_detail([p.out for p in parts], [p.lse for p in parts])
    lse = masked_as(merged.lse, unsplit.options.masked_lse)
    out = merged.out.astype(unsplit.out.dtype)
    traced = unsplit.trace.at
    rows = []
    for n, (p, a, b) in enumerate(zip(parts, edges[:-1], edges[1:], strict=True)):
        w = as_bhnd(merged.weights[n][..., None], "bhnd", "weights")[..., 0]  # LSE-shaped
        rows.append(Split(n, int(a), int(b), float(row_of(p.lse[..., None], traced, "bhnd")[0]),
                          float(w[traced]), row_of(p.out, traced, layout)[:O_SHOWN].astype(float)))
    return SplitRun(out, lse, tuple(rows), max_abs_diff(out, unsplit.out),
                    max_abs_diff(lse, unsplit.lse))


__all__ = ["Split", "SplitRun", "split_kv", "split_runs"]
