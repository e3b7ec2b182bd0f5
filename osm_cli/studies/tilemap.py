"""Tile maps: which (Q tile, K/V tile) pairs the tiled forward skips, and one head's probability
matrix to draw them over.

The forward decides tile by tile whether to skip: when the causal band or the window hides the
whole tile, or the user's mask or mask_mod hides it for every batch and head. `kind_map` asks
the forward's own tile walk (plan.walk) for every tile's kind at once (skip, partial: masked,
full: no mask), and `skip_map` for the skipped ones, so a picture (present/plot.py) can show
them without running the forward; `row_visits` counts the (row, tile) pairs computed, FA1
Proposition 4's block-sparse count. `head_probabilities` computes one head's
softmax(scale·QKᵀ + mask) in chunks of query rows, normalised over every key, keeping at most
rows × cols entries: the t × s matrix is never held. Leaves out: drawing, the forward itself.

Example: skip_map(q, k, block_q=4, block_k=2, causal=True) for t = s = 8 ->
    [[F, F, T, T], [F, F, F, F]]  (2 of 8 tiles skipped)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.reference import stable_softmax
from osm_cli.errors import InputError
from osm_cli.flash.forward import ScoreOptions
from osm_cli.flash.masks import make_band, scale_q, score_tile, with_mask_mod
from osm_cli.flash.mods import TileMod
from osm_cli.flash.options import Hooks, Tiling, split_options
from osm_cli.flash.plan import make_plan, walk
from osm_cli.flash.shapes import as_bhnd, broadcast_mask, check_inputs, kv_head


def skip_map(q, k, *, block_q: int, block_k: int, opts: ScoreOptions | None = None,
             **options) -> np.ndarray:
    """(n_q, n_k) booleans, True where attention skips tile (i, j) (forward order).

    opts (or its fields as keywords: causal, causal_align, window, mask, mask_mod, layout) as
    attention's.
    """
    return kind_map(q, k, block_q=block_q, block_k=block_k, opts=opts, **options) == "skip"


def kind_map(q, k, *, block_q: int, block_k: int, opts: ScoreOptions | None = None,
             **options) -> np.ndarray:
    """(n_q, n_k) of "skip", "partial" and "full": the tile walk's kind of each (Q tile, K/V
    tile) pair over every batch and head (plan.walk, the decision attention itself makes).
    Example: kind_map(q, k, block_q=4, block_k=2, causal=True)[0] for t = s = 8 ->
        ["partial", "partial", "skip", "skip"]
    """
    opts = split_options(options, opts)[0]
    if block_q < 1 or block_k < 1:
        raise InputError(f"block sizes must be positive (block_q {block_q}, block_k {block_k})")
    plan = make_plan(q, k, k, opts, Tiling(block_q=block_q, block_k=block_k), Hooks(), None)
    kinds = [tile.kinds for tile in walk(plan, tuple(plan.q_starts))]
    n_q, n_k = len(plan.q_starts), len(plan.starts)
    return np.array(kinds, dtype=object).reshape(n_k, n_q).T.astype(str)


def row_visits(skip: np.ndarray, t: int, block_q: int) -> int:
    """Σ over computed tiles of their query rows: the (row, K/V tile) pairs a kernel visits.

    Without skipping this is T_c·t, the count in FA1's tiled traffic; with skipped tiles it is
    the block-sparse count of FA1 Proposition 4. Example: row_visits([[F, F, T, T], [F, F, F, F]],
    8, 4) = 2·4 + 4·4 = 24 (of 32).
    """
    skip = np.asarray(skip, dtype=bool)
    rows = np.minimum(block_q, t - block_q * np.arange(skip.shape[0]))
    return int(((~skip).sum(axis=1) * rows).sum())


@dataclass(frozen=True)
class HeadMap:
    """One head's probabilities over the first rows × cols (query, key) pairs."""

    p: np.ndarray  # (rows, cols) float64, each row normalised over all s keys
    masked: np.ndarray  # (rows, cols) True where the score is -inf (mask, band or window)
    skip: np.ndarray  # (n_q, n_k) skip_map of the whole head
    batch: int
    head: int
    t: int  # queries and keys of the whole head
    s: int
    block_q: int
    block_k: int
    partial: np.ndarray | None = None  # (n_q, n_k) True where the tile is masked (partial)


def head_probabilities(
    q, k, *, batch: int = 0, head: int = 0, rows: int = 512, cols: int = 512,
    block_q: int, block_k: int, opts: ScoreOptions | None = None, **options,
) -> HeadMap:
    """softmax(scale·Q Kᵀ + mask) of query head `head` (its kv head by GQA), the first `rows`
    queries by the first `cols` keys, in float64, a chunk of rows at a time. opts (or its
    fields as keywords) as attention's."""
    opts = split_options(options, opts)[0]
    q4, k4 = as_bhnd(np.asarray(q), opts.layout, "Q"), as_bhnd(np.asarray(k), opts.layout, "K")
    check_inputs(q4, k4, k4)
    b, hq, t, d = q4.shape
    hk, s = k4.shape[1], k4.shape[2]
    if not (0 <= batch < b and 0 <= head < hq):
        raise InputError(f"batch {batch}, head {head} is outside Q's (B, H) = ({b}, {hq})")
    scale = opts.scale_for(d)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    um = None if opts.mask is None else broadcast_mask(np.asarray(opts.mask), (b, hq, t, s))
    kT = np.asarray(k4[batch, kv_head(head, hq, hk)], dtype=np.float64).T
    nr, nc = min(rows, t), min(cols, s)
    p = np.zeros((nr, nc))
    masked = np.ones((nr, nc), dtype=bool)
    chunk = max(1, (1 << 22) // max(1, s))
    for i0 in range(0, nr if s else 0, chunk):  # no keys: nothing to normalise over
        i1 = min(nr, i0 + chunk)
        idx = (np.array(batch), np.array(head), np.arange(i0, i1)[:, None], np.arange(s))
        mm = None if um is None else um[batch, head, i0:i1]
        if opts.mask_mod is not None:  # joined to the user's mask, as attention does
            mm = with_mask_mod(mm, np.broadcast_to(opts.mask_mod(*idx), (i1 - i0, s)))
        sc = score_tile(scale_q(q4[batch, head, i0:i1], scale, np.float64), kT,
                        None if band is None else band.visible(i0, i1, 0, s), mm,
                        mod=None if opts.score_mod is None else TileMod(opts.score_mod, idx))
        p[i0:i1] = stable_softmax(sc)[:, :nc]
        masked[i0:i1] = np.isneginf(sc[:, :nc])
    kinds = kind_map(q, k, block_q=block_q, block_k=block_k, opts=opts)
    return HeadMap(p, masked, kinds == "skip", batch, head, t, s, block_q, block_k,
                   kinds == "partial")


__all__ = ["HeadMap", "head_probabilities", "kind_map", "row_visits", "skip_map"]
