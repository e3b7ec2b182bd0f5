"""Block masks from a mask_mod, and a kernel's own block-sparse metadata judged against one.

FlexAttention's BlockMask (and FA4's block-sparse tensors) classify every (Q tile, K/V tile)
pair of every batch and head: listed in `kv_indices` (the first `kv_num_blocks` of each row)
a tile is partial (computed with the mask), listed in `full_kv_indices` (the first
`full_kv_num_blocks`) it is full (computed without it), listed in neither it is empty
(skipped). `block_kinds` makes that map from a mask_mod; `judge_block_mask` compares a
kernel's claim with it and names every tile claimed full that is partial (its mask is then
never applied: keys it must hide are seen) and every tile left out that has a visible key
(keys it must see are skipped). A tile claimed partial that is full or empty is only slower.
FA4 names the same four tensors mask_block_cnt, mask_block_idx, full_block_cnt, full_block_idx.
Leaves out: reading files (io/), the tile walk's own use of the kinds (plan.py).

Example: block_kinds(mods.causal(), 1, 1, 256, 256, 128, 128)[0, 0] -> [[1, 0], [2, 1]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.errors import InputError

from .mods import MaskMod

EMPTY, PARTIAL, FULL = 0, 1, 2
KIND_NAMES = {EMPTY: "empty", PARTIAL: "partial", FULL: "full"}
ALIASES = {"mask_block_cnt": "kv_num_blocks", "mask_block_idx": "kv_indices",
           "full_block_cnt": "full_kv_num_blocks", "full_block_idx": "full_kv_indices"}


def block_kinds(mask_mod, b: int, h: int, t: int, s: int, block_q: int,
                block_k: int) -> np.ndarray:
    """(B, H, n_q, n_k) kinds (EMPTY, PARTIAL, FULL) of every tile pair of every batch and
    head, the last tiles short where t or s is not a multiple of the block."""
    mod = MaskMod.of(mask_mod)
    nq, nk = -(-t // block_q), -(-s // block_k)
    kinds = np.empty((b, h, nq, nk), dtype=np.int8)
    bi, hi = np.arange(b).reshape(b, 1, 1, 1), np.arange(h).reshape(1, h, 1, 1)
    for i in range(nq):
        q_idx = np.arange(i * block_q, min(t, (i + 1) * block_q)).reshape(1, 1, -1, 1)
        for j in range(nk):
            kv_idx = np.arange(j * block_k, min(s, (j + 1) * block_k)).reshape(1, 1, 1, -1)
            seen = np.broadcast_to(mod(bi, hi, q_idx, kv_idx),
                                   (b, h, q_idx.shape[2], kv_idx.shape[3]))
            kinds[:, :, i, j] = np.where(seen.all(axis=(2, 3)), FULL,
                                         np.where(seen.any(axis=(2, 3)), PARTIAL, EMPTY))
    return kinds


@dataclass(frozen=True)
class BlockMaskReport:
    """A kernel's block mask against the mask_mod's: the tiles it gets wrong, named."""

    block_q: int
    block_k: int
    tiles: int  # tile pairs over all batches and heads
    wrong: tuple[str, ...]  # one line per wrong tile (at most `shown`)
    wrong_count: int
    slower: int  # claimed partial where full or empty: right, but masked or computed in vain

    @property
    def passed(self) -> bool:
        return self.wrong_count == 0


def judge_block_mask(mask_mod, b: int, h: int, t: int, s: int, arrays: dict,
                     block_size=(128, 128), shown: int = 10) -> BlockMaskReport:
    """The kernel's block-sparse arrays (FlexAttention's or FA4's names, shaped (B or 1,
    H or 1, n_q) and (…, n_q, n_k)) against the mask_mod's block_kinds for Q (B, H, t) and
    K (…, s)."""
    got = {ALIASES.get(n, n): np.asarray(x) for n, x in arrays.items()}
    need = ("kv_num_blocks", "kv_indices")
    if any(n not in got for n in need):
        raise InputError("a block mask holds kv_num_blocks and kv_indices (FlexAttention; "
                         "FA4: mask_block_cnt, mask_block_idx), and full_kv_num_blocks, "
                         f"full_kv_indices where it has full tiles; got {', '.join(arrays)}")
    bq, bk = (int(x) for x in block_size)
    if bq < 1 or bk < 1:
        raise InputError(f"block sizes must be positive, not {bq}, {bk}")
    want = block_kinds(mask_mod, b, h, t, s, bq, bk)
    nq, nk = want.shape[2:]
    claim = np.full(want.shape, EMPTY, dtype=np.int8)
    for num, idx, kind in (("kv_num_blocks", "kv_indices", PARTIAL),
                           ("full_kv_num_blocks", "full_kv_indices", FULL)):
        if num not in got:
            continue
        counts = _fit(got[num], (b, h, nq), num).astype(np.int64)
        index = _fit(got[idx], (b, h, nq, got[idx].shape[-1]), idx).astype(np.int64)
        for bi, hi, qi in np.ndindex(b, h, nq):
            for kj in index[bi, hi, qi, :max(0, int(counts[bi, hi, qi]))]:
                if not 0 <= kj < nk:
                    raise InputError(f"{idx} lists K/V tile {kj} for batch {bi}, head {hi}, "
                                     f"Q tile {qi}; there are {nk}")
                claim[bi, hi, qi, kj] = max(claim[bi, hi, qi, kj], kind)
    bad = (claim == FULL) & (want == PARTIAL) | (claim == EMPTY) & (want != EMPTY)
    lines = []
    for bi, hi, qi, kj in zip(*np.nonzero(bad), strict=True):
        if len(lines) == shown:
            break
        said, real = KIND_NAMES[int(claim[bi, hi, qi, kj])], KIND_NAMES[int(want[bi, hi, qi,
                                                                                  kj])]
        what = "claimed full but partial: its mask is never applied" if said == "full" else (
            f"left out (empty) but {real}: visible keys skipped")
        lines.append(f"batch {bi}, head {hi}, Q tile {qi} (rows {qi * bq}:{min(t, qi * bq + bq)})"
                     f", K/V tile {kj} (keys {kj * bk}:{min(s, kj * bk + bk)}): {what}")
    slower = int(np.count_nonzero((claim == PARTIAL) & (want != PARTIAL)))
    return BlockMaskReport(bq, bk, int(want.size), tuple(lines), int(np.count_nonzero(bad)),
                           slower)


def _fit(x: np.ndarray, shape: tuple, name: str) -> np.ndarray:
    """x broadcast to shape (a block mask shared by batches or heads has 1 there)."""
    try:
        return np.broadcast_to(x, shape)
    except ValueError:
        raise InputError(f"{name} has shape {x.shape}; these inputs need {shape} (or 1 for a "
                         "batch or head shared)") from None


def judge_against(opts, q, k, load) -> BlockMaskReport:
    """A kernel's block mask, load() its arrays (with their block_size, default 128,128),
    against opts' mask_mod for Q and K as given (in opts.layout)."""
    from .shapes import as_bhnd

    if opts.mask_mod is None:
        raise InputError("`block_mask` is judged against the mask_mod: give `mask_mod`")
    arrays = dict(load())
    size = arrays.pop("block_size", (128, 128))
    q4, k4 = as_bhnd(np.asarray(q), opts.layout, "Q"), as_bhnd(np.asarray(k), opts.layout, "K")
    return judge_block_mask(opts.mask_mod, q4.shape[0], q4.shape[1], q4.shape[2], k4.shape[2],
                            arrays, np.ravel(size))


__all__ = ["BlockMaskReport", "block_kinds", "judge_against", "judge_block_mask"]
