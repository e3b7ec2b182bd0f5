"""flash/blockmask.py: the block mask a mask_mod makes, and a kernel's block-sparse arrays
(FlexAttention's names and FA4's) judged against it, the wrong tiles named."""

from __future__ import annotations

import numpy as np
import pytest

from osm_cli.errors import InputError
from osm_cli.flash import mods
from osm_cli.flash.blockmask import FULL, PARTIAL, block_kinds, judge_block_mask


def _flex(kinds):
    """FlexAttention's four arrays for a (B, H, n_q, n_k) kinds map."""
    out = {}
    for num, idx, kind in (("kv_num_blocks", "kv_indices", PARTIAL),
                           ("full_kv_num_blocks", "full_kv_indices", FULL)):
        hit = kinds == kind
        out[num] = hit.sum(axis=-1).astype(np.int32)
        order = np.argsort(~hit, axis=-1, kind="stable")  # the listed tiles first, in order
        out[idx] = order.astype(np.int32)
    return out


def test_causal_block_kinds_at_a_length_not_a_multiple_of_128():
    """t = s = 300 in 128-blocks: the diagonal tiles partial (the last one 44 × 44), the ones
    below full, above empty."""
    kinds = block_kinds(mods.causal(), 1, 2, 300, 300, 128, 128)
    assert kinds[0, 1].tolist() == [[1, 0, 0], [2, 1, 0], [2, 2, 1]]


def test_a_correct_block_mask_passes_and_wrong_tiles_are_named():
    mm = [mods.document(np.repeat([0, 1, 2], [1, 150, 149])), mods.causal()]
    kinds = block_kinds(mm, 2, 2, 300, 300, 128, 128)
    good = judge_block_mask(mm, 2, 2, 300, 300, _flex(kinds))
    assert good.passed and good.tiles == 2 * 2 * 3 * 3 and good.slower == 0
    wrong = kinds.copy()
    wrong[1, 0, 2, 2] = FULL  # a partial tile (the last diagonal one) declared full
    rep = judge_block_mask(mm, 2, 2, 300, 300, _flex(wrong))
    assert not rep.passed and rep.wrong_count == 1
    assert rep.wrong == ("batch 1, head 0, Q tile 2 (rows 256:300), K/V tile 2 (keys 256:300): "
                         "claimed full but partial: its mask is never applied",)
    missing = kinds.copy()
    missing[0, 1, 1, 0] = 0  # a tile with visible keys left out
    rep = judge_block_mask(mm, 2, 2, 300, 300, {
        {"kv_num_blocks": "mask_block_cnt", "kv_indices": "mask_block_idx",
         "full_kv_num_blocks": "full_block_cnt", "full_kv_indices": "full_block_idx"}[n]: x
        for n, x in _flex(missing).items()})  # FA4's names
    assert rep.wrong == ("batch 0, head 1, Q tile 1 (rows 128:256), K/V tile 0 (keys 0:128): "
                         "left out (empty) but partial: visible keys skipped",)


def test_a_block_mask_of_the_wrong_shape_is_one_error():
    kinds = block_kinds(mods.causal(), 1, 1, 300, 300, 128, 128)
    arrays = _flex(kinds)
    arrays["kv_num_blocks"] = arrays["kv_num_blocks"][..., :2]
    with pytest.raises(InputError, match=r"kv_num_blocks has shape \(1, 1, 2\)"):
        judge_block_mask(mods.causal(), 1, 1, 300, 300, arrays)
