"""attention/textbook.py: the loop on one screen (attn_fwd_inner) gives osm's own tiled loop
and the fused one bit for bit, on the same walk of the tiles (plan.py), under every score
option it takes; and the walk itself: one decision of kinds, stacks and the traced row that
every loop reads."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import qkv
from osm_cli.errors import InputError
from osm_cli.flash.forward import attention
from osm_cli.flash.options import Hooks, ScoreOptions, Tiling
from osm_cli.flash.plan import make_plan, q_groups, walk
from osm_cli.flash.textbook import attn_fwd_inner, textbook_attention


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint8).tobytes()


MASK = np.random.default_rng(3).random((2, 4, 70, 90)) > 0.4
MASK[:, :, :20] = False  # rows with no key: out 0, LSE −inf
OPTIONS = {
    "plain": {}, "causal": {"causal": True},
    "top-left": {"causal": True, "causal_align": "top-left"},
    "window": {"window": (12, 3)}, "bool mask": {"mask": MASK},
    "float mask": {"mask": np.where(MASK, 0.5, -np.inf)},
    "softcap": {"softcap": 2.5, "causal": True},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625])},
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_textbook_loop_is_osms_loops_bit_for_bit(name, dtype):
    """GQA (4 query heads on 2 kv heads), t = 70 and s = 90 in tiles of 16 × 24: every loop
    walks the same tiles (short last ones, skipped ones) and folds them the same way."""
    q, k, v = qkv(70, 90, 8, dv=11, heads=(4, 2), b=2, dtype=dtype)
    kw = dict(OPTIONS[name])
    if name == "float mask":
        kw["mask"] = kw["mask"].astype(dtype)
    out, lse = textbook_attention(q, k, v, ScoreOptions(**kw), block_q=16, block_k=24)
    for fused in (True, False):
        ref = attention(q, k, v, block_q=16, block_k=24, fused=fused, trace_at=None, **kw)
        assert out.dtype == ref.out.dtype == dtype
        assert _bits(out) == _bits(ref.out) and _bits(lse) == _bits(ref.lse), fused
    if "mask" in name:
        assert np.isneginf(lse[:, :, :20]).all() and not out[:, :, :20].any()


def test_attn_fwd_inner_starts_from_the_textbook_state():
    """m = −inf, l = 0, acc = 0 going in; a tile of only −inf leaves them so (no NaN: the row
    subtracts 0); then [2, 4] and [1, 3] give m = 4, l = e^−2 + 1 + e^−3 + e^−1 (the worked
    example of docs/numerics.md#state) and acc the same weights on V."""
    m, l, acc = np.full(1, -np.inf), np.zeros(1), np.zeros((1, 1))
    v = np.array([[1.0], [10.0]])
    blocks = [(np.array([[-np.inf, -np.inf]]), v), (np.array([[2.0, 4.0]]), v),
              (np.array([[1.0, 3.0]]), v)]
    m1, l1, acc1 = attn_fwd_inner(m, l, acc, blocks[:1])
    assert np.isneginf(m1).all() and l1[0] == 0 and acc1[0, 0] == 0
    m2, l2, acc2 = attn_fwd_inner(m1, l1, acc1, blocks[1:])
    w = np.exp([-2.0, 0.0, -3.0, -1.0])
    assert m2[0] == 4.0 and np.isclose(l2[0], w.sum(), rtol=1e-15, atol=0)
    assert np.isclose(acc2[0, 0], w @ [1, 10, 1, 10], rtol=1e-15, atol=0)


def test_textbook_refuses_what_it_leaves_out():
    q, k, v = qkv(4, 4, 4, dv=7, heads=(1, 1), b=1)
    with pytest.raises(InputError, match="without sinks"):
        textbook_attention(q, k, v, ScoreOptions(sinks=np.zeros(1)))


def test_the_walk_decides_kinds_stacks_and_the_traced_row():
    """plan.walk: causal t = s = 64 in tiles of 16: the diagonal tiles partial, those above it
    skipped, for every Q tile of a stack; q_groups stacks the whole tiles (up to STACK_ROWS
    rows), the short last one alone unless ragged; locate finds the traced row in a stack."""
    q, k, v = qkv(70, 64, 4, dv=7, heads=(2, 1), b=1)
    plan = make_plan(q, k, v, ScoreOptions(causal=True, causal_align="top-left"),
                     Tiling(block_q=16, block_k=16), Hooks(), (0, 1, 37))
    stack = tuple(plan.q_starts)
    kinds = [t.kinds for t in walk(plan, stack)]
    assert kinds[0] == ("partial", "full", "full", "full", "full")
    assert kinds[2] == ("skip", "skip", "partial", "full", "full")
    tile = list(walk(plan, stack[:2]))[2]
    assert (tile.bounds, tile.seen, tile.kind) == ((2, 32, 48), None, "skip")
    assert list(walk(plan, stack[1:3]))[1].kind == "partial"
    assert q_groups(plan) == [(0, 16, 32, 48), (64,)]
    assert q_groups(plan, ragged=True) == [(0, 16, 32, 48, 64)]
    # row 37 of head 1 (the second of its kv group) in the rows 32:64 stacked per head
    assert plan.rows_in(32, 64) == [(37, (0, 32 + 5))] and plan.rows_in(0, 32) == []
