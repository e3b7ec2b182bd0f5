"""FA2's split-KV kernel (docs/numerics.md#fa2-schedule): where its heuristic picks it, the keys
in ranges, each run by the kernel's loop to a float32 (O, LSE) of its own, and the combine
kernel that merges them in its own float32 order.

Leaves out: the loop that runs a range (emulate.py), the heuristic (presets.fa2_plan).

Example: fa2_combine([o0, o1], [lse0, lse1], 64) -> (out, lse)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from osm_cli.flash.forward import Attention, ScoreOptions, masked_as, summed
from osm_cli.flash.records import Counters
from osm_cli.flash.shapes import as_bhnd

from .gpu_libm import expf, logf
from .gpu_ops import F32, fma
from .presets import SMS, fa2_plan


def split_kv_run(q, k, v, opts: ScoreOptions, masked_lse: str, trace_at, dense,
                 sms: int | None) -> Attention:
    """FA2's split-KV kernel where its heuristic picks it: each key range run to a float32
    (O, LSE) of its own (−inf for a range without keys), combined in float32
    (docs/numerics.md#fa2-schedule)."""
    layout = opts.layout
    b, h, t, d = as_bhnd(np.asarray(q), layout, "Q").shape
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    _, bk, splits = fa2_plan(b, h, t, s, d, sms or SMS)
    if splits <= 1:
        return dense(q, k, v, opts=opts, masked_lse=masked_lse, trace_at=trace_at)
    n_blocks = -(-s // bk)
    per = max(1, -(-n_blocks // splits))
    ranges = [(j * bk, min(s, (j + per) * bk)) for j in range(0, n_blocks, per)]
    parts = [dense(q, k, v, opts=opts, masked_lse="neg-inf", trace_at=trace_at, keys=r,
                   block_k=bk) for r in ranges]
    # O is stored like Q, the LSE as (B, H, N): bnhd's O is combined with its N and H swapped
    swap = layout == "bnhd" and np.ndim(parts[0].out) >= 3
    outs = [np.swapaxes(p.out, -3, -2) if swap else p.out for p in parts]
    out, merged_lse = fa2_combine(outs, [p.lse for p in parts], d)
    out = np.swapaxes(out, -3, -2) if swap else out
    lse = masked_as(merged_lse, masked_lse)
    first = parts[0]
    rows = tuple(tuple(st for p in parts for st in p.trace.rows[r])
                 for r in range(len(first.trace.rows)))
    return replace(
        first, out=out, lse=lse, options=replace(first.options, masked_lse=masked_lse,
                                                 splits=len(parts)),
        tiles=replace(first.tiles, **summed([p.tiles for p in parts], "computed", "skipped",
                                            "total")),
        counters=Counters(**summed([p.counters for p in parts], "rescales", "row_visits"),
                          masked_rows=int(np.isneginf(lse).sum())),
        trace=replace(first.trace, rows=rows, outs=None))


def fa2_combine(outs: list, lses: list, d: int) -> tuple[np.ndarray, np.ndarray]:
    """FA2's split-KV combine kernel (flash_fwd_kernel.h, combine_attn_seqk_parallel) in its
    float32 order, with CUDA's expf and logf (gpu_libm: PyTorch builds it without fast math):
    m = the splits' largest LSE (0 if all are −inf); Σ exp(LSE_s − m) summed as
    its threads do (each lane's splits in turn, then a butterfly over the lanes: the lane
    count and splits per lane follow from the head dim and the split count); L = ln Σ + m;
    O = Σ_s exp(LSE_s − L)·O_s, one fused multiply-add per split in split order. A row that no
    split saw gets L = −inf (the kernel writes +inf) and O = 0.

    Example: fa2_combine([o0, o1], [l0, l1], 64) -> (out, lse), both float32
    """
    lse = np.stack([np.asarray(x, dtype=F32) for x in lses])
    dr = -(-d // 32) * 32  # the kernel's rounded head dim
    block_m = 4 if dr % 128 == 0 else 8 if dr % 64 == 0 else 16
    most = max(2, 1 << (len(lses) - 1).bit_length())  # kMaxSplits: a power of 2, at least 2
    lanes = min(most, 128 // block_m)
    with np.errstate(invalid="ignore", over="ignore"):
        top = lse.max(axis=0)
        top = np.where(np.isneginf(top), F32(0), top)
        e = expf(lse - top)
        e = np.concatenate([e, np.zeros((most - len(lses), *e.shape[1:]), F32)])
        per = e[:lanes].copy()
        for j in range(lanes, most, lanes):  # each lane's own splits, in turn
            per += e[j:j + lanes]
        while len(per) > 1:  # the butterfly: shfl_xor by half the lanes, then half again
            half = len(per) // 2
            per = per[:half] + per[half:]
        total = per[0]
        none = (total == 0) | np.isnan(total)
        logsum = np.where(none, F32(np.inf), logf(np.where(none, F32(1), total))
                          + top).astype(F32)
        scale = expf(lse - logsum)
    out = np.zeros(np.shape(outs[0]), dtype=F32)
    for sc, o in zip(scale, outs, strict=True):
        out = fma(np.asarray(o, dtype=F32), sc[..., None], out)
    return out, np.where(none, F32(-np.inf), logsum).astype(F32)


__all__ = ["fa2_combine", "split_kv_run"]
