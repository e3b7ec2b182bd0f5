"""A realistic layer's check holds each full-size tensor about once (benchmarks/bench_check.py
measures it): the reductions, roundings, table lookups and probes that now work a piece at a
time give exactly the numbers of the whole-array forms they replace."""

from __future__ import annotations

import numpy as np
import pytest

from osm_cli.precision import gpu_approx as ga
from osm_cli.precision.dtypes import DTYPES, PIECE, blocks, round_inputs, round_to
from osm_cli.precision.probe import Float64Heads
from osm_cli.precision.rule import max_abs, max_abs_diff

BF16 = DTYPES["bfloat16"]


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 2, 1100, 1000), (5000, 300), (2**21,), ()])
def test_blocks_cover_every_element_once(shape):
    seen = np.zeros(shape, dtype=np.int32)
    n = 0
    for ix in blocks(shape, limit=PIECE // 4):
        seen[ix] += 1
        n += 1
        assert seen[ix].size <= max(PIECE // 4, shape[-1] if shape else 1)
    assert (seen == 1).all()
    assert n >= (seen.size // (PIECE // 4))


def test_max_abs_diff_is_max_abs_of_the_difference():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 900, 700)).astype(np.float32)
    ref = rng.standard_normal(x.shape)
    assert max_abs_diff(x, ref) == max_abs(x.astype(np.float64) - ref)
    t = x.swapaxes(1, 2)  # a transposed view: the same pieces of both
    assert max_abs_diff(t, ref.swapaxes(1, 2)) == max_abs(x.astype(np.float64) - ref)
    x[1, 2, 899, 3] = np.nan  # a NaN anywhere, in the last piece: NaN, as the rule needs
    assert np.isnan(max_abs_diff(x, ref))
    assert max_abs_diff(np.zeros((0, 4)), np.zeros((0, 4))) == 0.0
    assert max_abs_diff(np.float32([1.5, -2.0]), 0.0) == 2.0


def test_round_to_by_pieces_is_one_astype():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, PIECE // 2 + 7)) * 1e3
    for dt, like in ((BF16, np.float64), (DTYPES["float16"], np.float32),
                     (DTYPES["float8_e4m3fn"], np.float32)):
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(dt).astype(like)
        got = round_to(x, dt, like)
        assert got.dtype == like
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    t = x.T  # a transposed input keeps its layout
    assert round_to(t, BF16, np.float64).strides[0] < round_to(t, BF16, np.float64).strides[1]


def test_round_inputs_hands_back_unchanged_inputs_read_only():
    q = np.float32([[1.5, -0.25], [3.0, 0.0]])
    k = np.float32([[1.0 / 3, 2.0], [1.0, 1.0]])
    (rq, rk), notes = round_inputs({"Q": q, "K": k}, BF16)
    assert np.shares_memory(rq, q) and not rq.flags.writeable
    assert [n.changed for n in notes] == [0, 1]
    assert not np.shares_memory(rk, k) and rk[0, 0] == np.float32(0.333984375)
    with pytest.raises(ValueError):
        rq[0, 0] = 2.0  # nothing downstream may write into the caller's array
    assert q[0, 0] == 1.5


@pytest.mark.parametrize("name", ["lg2", "rcp"])
def test_entries_are_the_table(name):
    j = np.arange(2**23)
    assert np.array_equal(ga.entries(name, j).view(np.int32), ga.table(name).view(np.int32))
    some = np.array([[0, 5], [2**23 - 1, 4096]])
    assert ga.entries(name, some).shape == (2, 2)


def test_predictions_by_rows_are_the_one_pass_grid():
    hi, lo = ga._exp2_factors(-1.0)
    one_pass = ga.bits(np.multiply.outer(hi, lo).reshape(-1).astype(np.float32))
    assert np.array_equal(ga.predicted("ex2_neg"), one_pass)
    e, d = 0, ga.tanh_drop()[0]
    whole = ga.bits(ga._tanh_grid(e, d).astype(np.float32))
    assert np.array_equal(ga.predicted(f"tanh_{e}"), whole)


def test_float64_heads_converts_what_it_picks():
    a = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    f = Float64Heads(a)
    assert f.shape == a.shape
    head = f[0, 1]
    assert head.dtype == np.float64 and np.array_equal(head, a[0, 1])
    assert np.asarray(f).dtype == np.float64 and np.array_equal(np.asarray(f), a)
    assert f.swapaxes(1, 2).shape == (1, 3, 2, 4)


def test_plain_head_by_head_is_all_heads_at_once(monkeypatch, qkv):
    """_one_shot without modifiers runs each head of a chunk on its own; with all heads at once
    (the path modifiers take) plain attention's bits are the same."""
    from osm_cli.flash import reference as R
    from osm_cli.precision.model import plain

    q, k, v = qkv(70, 90, 16, heads=(4, 2), b=2, seed=11, dtype=BF16)
    mask = np.random.default_rng(5).random((2, 4, 70, 90)) > 0.2
    for opts in ({"causal": True}, {"mask": mask}, {}):
        each = plain(q, k, v, BF16, **opts)
        monkeypatch.setattr(R.Mods, "active", property(lambda self: True))
        whole = plain(q, k, v, BF16, **opts)
        monkeypatch.undo()
        for a, b in zip(each, whole, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
