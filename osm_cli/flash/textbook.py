"""The forward's loop on one screen, in the paper's names: what forward.py and fast.py compute.

`attn_fwd_inner` is the inner loop of FlashAttention-2's forward (FA2 Algorithm 1, lines 8-10)
in the shape of Triton's `_attn_fwd_inner` (python/tutorials/06-fused-attention.py): the state
of one Q tile's rows goes in, every K/V tile is folded into it, the state comes out. Its names
are the paper's: m_i the running max, l_i the running sum of exp(S − m_i), alpha the factor the
old state shrinks by, acc the unnormalised output. It starts from the textbook state m = −inf,
l = 0, acc = 0 (not Triton's l = 1: docs/numerics.md#state). `textbook_attention` runs it over
every Q tile of plan.py's walk and divides once at the end.

It is the same arithmetic as core.state.rescale_step, operation for operation, so its output
is bit for bit osm's own loop and the fused one (tests/flash/test_textbook.py). The tiles, masks and
skipped tiles are plan.py's (one walk for every loop); the scores are masks.score_tile's.
Leaves out: sinks, the merge form, lazy rescaling, precision models, traces, threads
(forward.py and fast.py run those), packed batches.

Example: out, lse = textbook_attention(q, k, v, ScoreOptions(causal=True))
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from osm_cli.core.state import block_max
from osm_cli.errors import InputError

from .options import Hooks, ScoreOptions, Tiling
from .plan import make_plan, q_rows, tiles
from .shapes import from_bhnd


def attn_fwd_inner(m_i: np.ndarray, l_i: np.ndarray, acc: np.ndarray,
                   blocks: Iterable[tuple[np.ndarray, np.ndarray]]):
    """Fold K/V tiles into one Q tile's state: blocks yields (S, V) per visible tile, S the
    tile's scaled scores (rows, keys; −inf where masked), V its value rows (keys, dv)."""
    for s, v in blocks:
        m_ij = np.maximum(m_i, block_max(s))  # the running max after this tile
        ref = np.where(np.isneginf(m_ij), 0, m_ij)  # a row with only −inf so far subtracts 0
        with np.errstate(over="ignore"):  # exp of a very negative s − m is rightly 0
            alpha = np.exp(m_i - ref)  # what the old l_i and acc are worth against m_ij
            p = np.exp(s - ref[..., None])  # this tile's probabilities, not yet normalised
        l_i = l_i * alpha + p.sum(axis=-1)
        acc = acc * alpha[..., None] + p @ v
        m_i = m_ij
    return m_i, l_i, acc


def textbook_attention(q, k, v, opts: ScoreOptions | None = None, *, block_q: int | None = None,
                       block_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of softmax(scale·Q·Kᵀ + mask)·V by attn_fwd_inner, one Q tile at a time:
    out shaped like q (opts.layout), lse (B, H, N). opts: the score options (causal, window,
    mask, softcap, ALiBi; ScoreOptions()); block_q, block_k as attention's."""
    opts = opts or ScoreOptions()
    if opts.sinks is not None or opts.packing.active:
        raise InputError("the textbook loop takes a dense batch without sinks")
    plan = make_plan(q, k, v, opts, Tiling(block_q=block_q, block_k=block_k), Hooks(), None)
    b, hk, g = plan.groups
    out = np.zeros((b, hk, g, plan.t, plan.v3.shape[-1]), dtype=plan.accum)
    lse = np.zeros((b, hk, g, plan.t), dtype=plan.accum)
    for i0 in plan.q_starts:
        qt, n, _ = q_rows(plan, i0)
        m_i = np.full(qt.shape[:-1], -np.inf, dtype=plan.accum)  # the textbook start
        l_i = np.zeros(qt.shape[:-1], dtype=plan.accum)
        acc = np.zeros((*qt.shape[:-1], plan.v3.shape[-1]), dtype=plan.accum)
        blocks = ((s[0], v) for _, s, v in tiles(plan, (i0,), qt[None]) if s is not None)
        m_i, l_i, acc = attn_fwd_inner(m_i, l_i, acc, blocks)
        empty = l_i == 0  # every key hidden: out 0, LSE −inf (docs/numerics.md#masked-rows)
        with np.errstate(divide="ignore"):
            lse_i = np.where(empty, -np.inf, m_i + np.log(l_i))
        out_i = acc / np.where(empty, 1, l_i)[..., None]
        out[..., i0:i0 + n, :] = out_i.reshape(b, hk, g, n, -1)
        lse[..., i0:i0 + n] = lse_i.reshape(b, hk, g, n)
    hq = hk * g
    return from_bhnd(out.reshape(b, hq, plan.t, -1), np.ndim(q), opts.layout), lse.reshape(
        b, hq, plan.t)


__all__ = ["attn_fwd_inner", "textbook_attention"]
