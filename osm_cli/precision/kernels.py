"""Kernel schedules: how a real kernel walks the tiles, beside osm's own readable order.

"tiles" is osm's own order (block_q, block_k and the tile order as given). "fa2" is
FlashAttention-2's forward: its tile sizes per head dim, K/V tiles visited last to first, and
its split-KV heuristic with the float32 combine (docs/numerics.md#fa2-schedule). Both run the
flash precision model (model.py) on dtype-valued inputs. Kernel presets (FA3/FA4) belong here.
Leaves out: where values are rounded (model.py), the verdict (rule.py).

Example: fa2_plan(1, 8, 1024, 1024, 64) -> (64, 256, 2)
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from osm_cli.attention.forward import Attention, Hooks, Tiling, attention, masked_as
from osm_cli.attention.options import default_blocks, layout_of
from osm_cli.attention.shapes import as_bhnd
from osm_cli.attention.split import split_runs
from osm_cli.core.merge import merge_detail
from osm_cli.errors import OsmError

from .model import Model, finish

SMS = 132  # streaming multiprocessors of an H100 / H200 SXM (an A100 has 108)
SCHEDULES = ("fa2", "tiles")


def _num_splits(work: int, slots: int, n_blocks: int, most: int = 128) -> int:
    """FlashAttention-2's split-KV heuristic (flash_api.cpp num_splits_heuristic)."""
    if work >= 0.8 * slots:
        return 1
    most = min(most, slots, n_blocks)

    def eligible(n: int) -> bool:  # n splits that do not just repeat n - 1's blocks per split
        return n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1))

    eff = {}
    for n in range(1, most + 1):
        if eligible(n):
            waves = work * n / slots
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    return next((n for n, e in eff.items() if e >= 0.85 * best), 1)


def fa2_plan(b: int, h: int, t: int, s: int, d: int, sms: int = SMS) -> tuple[int, int, int]:
    """(block_q, block_k, splits) of FlashAttention-2's forward for these sizes.

    Few (batch · head · 64-row) blocks for the GPU's 2·sms slots: the split-KV kernel, with
    64-row tiles, block_k 256 (d ≤ 64), 128 (d ≤ 128) or 64, and `splits` key ranges merged in
    float32. Otherwise the standard kernel: 128-row tiles, block_k 128 (d ≤ 64) else 64.
    Example: fa2_plan(1, 8, 1024, 1024, 64) -> (64, 256, 2)
    """
    block_n = 256 if d <= 64 else 128 if d <= 128 else 64
    splits = _num_splits(b * h * -(-t // 64), 2 * sms, -(-s // block_n))
    if splits <= 1:
        return (*default_blocks(d), 1)
    return 64, block_n, splits


def run_flash(m: Model, q, k, v, *, schedule: str = "tiles", sms: int = SMS,
              **kwargs) -> Attention:
    """The flash model: attention on dtype-valued inputs with P rounded, O / l rounded.

    q, k, v should already hold the dtype's values (round_inputs); kwargs are attention's.
    schedule "tiles" runs attention's own tiles (block_q, block_k, order as given); "fa2" follows
    FlashAttention-2's kernel: its tile sizes, K/V tiles visited last to first, and the split-KV
    kernel (key ranges run separately, O / l and LSE merged in float32) where its heuristic picks
    it for a GPU of `sms` multiprocessors. Where P is rounded relative to a running max, the
    schedule decides which max, so "fa2" matches that kernel element by element more often.
    """
    if schedule not in SCHEDULES:
        raise OsmError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    hooks = Hooks(m.accum, m.p_round)
    if schedule == "tiles":
        return finish(m, attention(q, k, v, hooks=hooks, **kwargs))
    opts = kwargs.get("opts")
    if opts is not None and opts.packing.active:
        # varlen and paged batches: FA2 runs each sequence without split-KV (mha_varlen_fwd)
        bq, bk = default_blocks(np.shape(q)[-1])
        return finish(m, attention(q, k, v, hooks=hooks, tiling=Tiling(
            block_q=bq, block_k=bk, reverse=True), **kwargs))
    layout = layout_of(kwargs)
    b, h, t, d = as_bhnd(np.asarray(q), layout, "Q").shape
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    bq, bk, splits = fa2_plan(b, h, t, s, d, sms)
    n_blocks = -(-s // bk)
    per = max(1, -(-n_blocks // splits))
    # no keys at all: one empty range, whose rows are fully masked (O = 0, LSE -inf)
    ranges = [(first * bk, min(s, (first + per) * bk)) for first in range(0, n_blocks, per)]
    ranges = ranges or [(0, 0)]
    parts = split_runs(q, k, v, ranges, reverse=True, hooks=hooks,
                       tiling=Tiling(block_q=bq, block_k=bk), **kwargs)
    res = parts[0] if len(parts) == 1 else _merge_parts(parts, m.accum)
    masked = kwargs.get("masked_lse", "neg-inf")
    if masked != "neg-inf":
        res = replace(res, lse=masked_as(res.lse, masked))
    return finish(m, res)


def _merge_parts(parts: list, accum: np.dtype) -> Attention:
    """FA2's split-KV combine (core.merge.merge_detail in `accum`): LSE = logsumexp over splits,
    O = Σ exp(LSE_s − LSE)·O_s, with the parts' tile counts added up."""
    merged = merge_detail([p.out for p in parts], [p.lse for p in parts], dtype=accum)
    lse = merged.lse
    head = parts[0]
    return replace(head, out=merged.out.astype(accum), lse=lse, tiles_computed=sum(
        p.tiles_computed for p in parts), tiles_skipped=sum(p.tiles_skipped for p in parts),
        rescales=sum(p.rescales for p in parts), masked_rows=int(np.isneginf(lse).sum()),
        trace=(), trace_out=None)


__all__ = ["SCHEDULES", "SMS", "fa2_plan", "run_flash"]
