"""The tiled attention forward: against the float64 one-shot, a hand-built oracle and PyTorch.

Exactness claims are made in float64: the tiled forward and the one-shot reference differ only in
the order of additions, so they agree to ~1e-15 and we ask for 1e-12. The causal patterns are
written out as literal 0/1 matrices (docs/numerics.md#causal-alignment) and checked by an oracle
that knows nothing of osm's Band. The trace is worked by hand for one small row.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import qkv, rand
from osm_cli.core.record import Step
from osm_cli.errors import InputError, OsmError, ShapeError
from osm_cli.flash.forward import Attention, attention
from osm_cli.flash.masks import make_band
from osm_cli.flash.reference import errors, reference
from osm_cli.present.json import attention_summary as summary
from osm_cli.present.json import dumps

E = math.exp
ATOL = 1e-12
FORMS = ("rescale", "merge")
ALIGNS = ("bottom-right", "top-left")


def oracle(q, k, v, keep, scale=None, bias=None):
    """softmax(scale·q·kᵀ + bias) restricted to `keep` (t, s) booleans, row by row, in float64.

    Written from the formula alone: each row keeps its visible scores, subtracts their max,
    exponentiates, normalises. A row with nothing visible gives output 0 and LSE -inf.
    """
    t, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    sc = scale * (q @ k.T) + (0.0 if bias is None else bias)
    out = np.zeros((t, v.shape[1]))
    lse = np.full(t, -np.inf)
    for i in range(t):
        row = sc[i][keep[i]]
        if row.size == 0 or np.isneginf(row).all():
            continue
        m = row.max()
        p = np.exp(row - m)
        out[i] = p @ v[keep[i]] / p.sum()
        lse[i] = m + math.log(p.sum())
    return out, lse


def pattern(*rows: str) -> np.ndarray:
    return np.array([[c == "1" for c in r] for r in rows])


def close(a, b, atol=ATOL):
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)


# ---------------------------------------------------------------------------------------------
# Against the one-shot reference: awkward shapes, tiles that do not divide the lengths

# (t, s, d, dv, block_q, block_k)
SHAPES = [
    (1, 1, 1, 1, 3, 7),
    (1, 239, 59, 17, 4, 50),
    (1, 239, 1, 3, 1, 238),
    (113, 203, 111, 64, 16, 48),
    (113, 203, 64, 59, 37, 64),
    (1023, 1024, 64, 32, 100, 129),
    (1024, 1023, 59, 64, 96, 200),
    (5, 2, 111, 1, 2, 1),
    (5, 2, 1, 7, 3, 3),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("t", "s", "d", "dv", "bq", "bk"), SHAPES)
def test_matches_reference(t, s, d, dv, bq, bk, causal, form):
    q, k, v = qkv(t, s, d, dv, seed=t + s + d)
    res = attention(q, k, v, causal=causal, block_q=bq, block_k=bk, form=form)
    ref_out, ref_lse = reference(q, k, v, causal=causal)
    assert res.out.shape == (t, dv) and res.lse.shape == (t,)
    assert res.out.dtype == np.float64
    assert (res.tiles.block_q, res.tiles.block_k) == (bq, bk)
    assert res.options.softmax_scale == 1 / math.sqrt(d)
    assert res.tiles.total == -(-t // bq) * -(-s // bk)
    assert res.tiles.computed + res.tiles.skipped == res.tiles.total
    close(res.out, ref_out)
    close(res.lse, ref_lse)
    errs = errors(res, ref_out, ref_lse)
    assert errs["max_abs_err"] < ATOL and errs["max_lse_err"] < ATOL
    # bottom-right causal with t > s leaves the first t - s rows without keys
    assert res.counters.masked_rows == (max(0, t - s) if causal else 0)
    assert not np.isnan(res.out).any() and not np.isnan(res.lse).any()


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize(("t", "s", "d", "bq", "bk"),
                         [(113, 203, 59, 17, 31), (203, 113, 111, 64, 10), (5, 2, 1, 2, 1)])
def test_matches_reference_batched_gqa_both_alignments(t, s, d, bq, bk, align):
    q, k, v = qkv(t, s, d, dv=9, heads=(4, 2), b=2, seed=7)
    res = attention(q, k, v, causal=True, causal_align=align, block_q=bq, block_k=bk)
    ref_out, ref_lse = reference(q, k, v, causal=True, causal_align=align)
    assert res.out.shape == (2, 4, t, 9) and res.lse.shape == (2, 4, t)
    close(res.out, ref_out)
    close(res.lse, ref_lse)


def test_default_tiles_follow_fa2():
    """block_q 128; block_k 128 for d ≤ 64 and 64 above (docs/numerics.md#fa2-schedule)."""
    for d, want in ((1, (128, 128)), (64, (128, 128)), (65, (128, 64)), (111, (128, 64))):
        q, k, v = qkv(3, 4, d)
        res = attention(q, k, v)
        assert (res.tiles.block_q, res.tiles.block_k) == want


def test_user_scale_replaces_default():
    q, k, v = qkv(6, 9, 4)
    res = attention(q, k, v, scale=0.3, block_k=4)
    want, want_lse = oracle(q, k, v, np.ones((6, 9), bool), scale=0.3)
    assert res.options.softmax_scale == 0.3
    close(res.out, want)
    close(res.lse, want_lse)


def test_float32_inputs_accumulate_in_float32():
    q, k, v = (x.astype(np.float32) for x in qkv(50, 70, 16, seed=3))
    res = attention(q, k, v, block_q=16, block_k=16)
    assert res.out.dtype == np.float32 and res.lse.dtype == np.float32
    ref_out, ref_lse = reference(q, k, v)
    errs = errors(res, ref_out, ref_lse)
    assert 0 < errs["max_abs_err"] < 1e-6
    assert 0 < errs["max_lse_err"] < 1e-5


# ---------------------------------------------------------------------------------------------
# Causal alignment: literal patterns and an oracle that does not use Band

CAUSAL_PATTERNS = {
    (2, 5, "bottom-right"): ("11110", "11111"),
    (2, 5, "top-left"): ("10000", "11000"),
    (5, 2, "bottom-right"): ("00", "00", "00", "10", "11"),
    (5, 2, "top-left"): ("10", "11", "11", "11", "11"),
}


@pytest.mark.parametrize(("t", "s", "align"), list(CAUSAL_PATTERNS))
def test_band_visible_is_the_literal_pattern(t, s, align):
    band = make_band(t, s, True, align, None)
    keep = pattern(*CAUSAL_PATTERNS[t, s, align])
    assert band.visible(0, t, 0, s).tolist() == keep.tolist()
    # a sub-block of rows and keys is the same sub-matrix
    assert band.visible(1, t, 1, s).tolist() == keep[1:, 1:].tolist()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("bq", "bk"), [(1, 1), (2, 3), (3, 2), (8, 8)])
@pytest.mark.parametrize(("t", "s", "align"), list(CAUSAL_PATTERNS))
def test_causal_against_hand_oracle(t, s, align, bq, bk, form):
    q, k, v = qkv(t, s, 3, dv=4, seed=11)
    keep = pattern(*CAUSAL_PATTERNS[t, s, align])
    want, want_lse = oracle(q, k, v, keep)
    res = attention(q, k, v, causal=True, causal_align=align, block_q=bq, block_k=bk, form=form)
    close(res.out, want)
    close(res.lse, want_lse)
    empty = ~keep.any(axis=1)
    assert res.counters.masked_rows == int(empty.sum())
    assert (res.out[empty] == 0).all()
    assert np.isneginf(res.lse[empty]).all()


def test_t5_s2_bottom_right_first_three_rows_are_empty():
    """t = 5, s = 2 bottom-right keeps 00/00/00/10/11: rows 0-2 see no key at all.

    Row 3 sees key 0 only, so its output is exactly V[0] and its LSE is exactly its score.
    """
    q, k, v = qkv(5, 2, 2, dv=3, seed=5)
    res = attention(q, k, v, causal=True, block_q=2, block_k=1)
    assert res.counters.masked_rows == 3
    assert res.out[:3].tolist() == [[0.0] * 3] * 3
    assert np.isneginf(res.lse[:3]).all()
    close(res.out[3], v[0], atol=1e-15)
    assert res.lse[3] == pytest.approx(q[3] @ k[0] / math.sqrt(2), abs=1e-15)


# ---------------------------------------------------------------------------------------------
# Sliding windows


def window_keep(t, s, left, right, offset):
    """i + offset - left ≤ j ≤ i + offset + right, a negative bound meaning unbounded."""
    i, j = np.arange(t)[:, None], np.arange(s)[None, :]
    keep = np.ones((t, s), bool)
    if left >= 0:
        keep &= j >= i + offset - left
    if right >= 0:
        keep &= j <= i + offset + right
    return keep


def test_window_literal_pattern():
    """t = s = 5, window (1, 0): each query sees itself and the key before it."""
    band = make_band(5, 5, False, "bottom-right", (1, 0))
    assert band.visible(0, 5, 0, 5).tolist() == pattern(
        "10000", "11000", "01100", "00110", "00011").tolist()
    band = make_band(2, 5, False, "bottom-right", (0, 1))  # offset 3: row 0 sees 3, 4
    assert band.visible(0, 2, 0, 5).tolist() == pattern("00011", "00001").tolist()


@pytest.mark.parametrize("window", [(1, 0), (2, 1), (0, 0), (-1, 0), (3, -1), (-1, -1), (0, 4)])
@pytest.mark.parametrize(("t", "s"), [(9, 9), (4, 11), (11, 4)])
@pytest.mark.parametrize("align", ALIGNS)
def test_window_against_hand_oracle(window, t, s, align):
    q, k, v = qkv(t, s, 5, dv=3, seed=13)
    keep = window_keep(t, s, *window, s - t if align == "bottom-right" else 0)
    want, want_lse = oracle(q, k, v, keep)
    res = attention(q, k, v, window=window, causal_align=align, block_q=3, block_k=2)
    close(res.out, want)
    close(res.lse, want_lse)
    assert res.counters.masked_rows == int((~keep.any(axis=1)).sum())
    ref_out, _ = reference(q, k, v, window=window, causal_align=align)
    close(res.out, ref_out)


def test_causal_window_is_window_with_right_zero():
    q, k, v = qkv(12, 12, 4, seed=2)
    a = attention(q, k, v, causal=True, window=(3, 5), block_q=4, block_k=4)
    b = attention(q, k, v, window=(3, 0), block_q=4, block_k=4)
    close(a.out, b.out, atol=0)
    want, _ = oracle(q, k, v, window_keep(12, 12, 3, 0, 0))
    close(a.out, want)


def test_window_skips_tiles_outside_the_band():
    """t = s = 256, window (64, 0), tiles of 64: Q tile r sees keys 64r-64 … 64r+63 -> K tiles
    r-1 and r: 1 + 2 + 2 + 2 = 7 computed, 9 skipped."""
    q, k, v = qkv(256, 256, 4)
    res = attention(q, k, v, window=(64, 0), block_q=64, block_k=64)
    assert (res.tiles.computed, res.tiles.skipped) == (7, 9)


# ---------------------------------------------------------------------------------------------
# Fully masked rows and LSE conventions


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("masked_lse", "want"),
                         [("neg-inf", -math.inf), ("pos-inf", math.inf), ("zero", 0.0)])
def test_fully_masked_rows_every_lse_mode(masked_lse, want, form):
    q, k, v = qkv(6, 7, 4, seed=17)
    keep = np.ones((6, 7), bool)
    keep[[1, 4]] = False
    res = attention(q, k, v, mask=keep, masked_lse=masked_lse, block_q=4, block_k=3, form=form)
    assert res.counters.masked_rows == 2 and res.options.masked_lse == masked_lse
    assert (res.out[[1, 4]] == 0).all()
    assert res.lse[1] == want and res.lse[4] == want
    assert not np.isnan(res.out).any() and not np.isnan(res.lse).any()
    other = [0, 2, 3, 5]
    want_out, want_lse = oracle(q, k, v, keep)
    close(res.out[other], want_out[other])
    close(res.lse[other], want_lse[other])
    # the reference's -inf is read in the run's convention: equal infinities are no error
    errs = errors(res, *reference(q, k, v, mask=keep))
    assert errs["max_lse_err"] < ATOL and errs["max_abs_err"] < ATOL


@pytest.mark.parametrize("masked_lse", ["neg-inf", "pos-inf", "zero"])
def test_float_minus_inf_mask_rows_are_fully_masked(masked_lse):
    q, k, v = qkv(4, 5, 3, seed=19)
    bias = np.zeros((4, 5))
    bias[2] = -np.inf
    res = attention(q, k, v, mask=bias, masked_lse=masked_lse, block_k=2)
    assert res.counters.masked_rows == 1
    assert (res.out[2] == 0).all()
    assert res.lse[2] == {"neg-inf": -np.inf, "pos-inf": np.inf, "zero": 0.0}[masked_lse]
    assert not np.isnan(res.out).any()


def test_large_finite_mask_is_not_a_mask():
    """finfo.min added to every score leaves a row whose scores are all equal-ish: the row
    averages V evenly (PyTorch math backend's pitfall), it is not reported as masked."""
    q, k, v = qkv(2, 4, 3, seed=23)
    bias = np.zeros((2, 4))
    bias[0] = np.finfo(np.float32).min
    res = attention(q, k, v, mask=bias, block_k=2)
    assert res.counters.masked_rows == 0
    close(res.out[0], v.mean(axis=0))


# ---------------------------------------------------------------------------------------------
# User masks: bool and float, broadcast shapes, skipped tiles


@pytest.mark.parametrize("mask_shape", [(7, 9), (1, 3, 1, 9), (2, 1, 7, 9), (3, 7, 9), (9,)])
def test_bool_mask_broadcasts(mask_shape):
    q, k, v = qkv(7, 9, 4, dv=5, heads=(3, 3), b=2, seed=29)
    keep = np.random.default_rng(1).random(mask_shape) > 0.4
    res = attention(q, k, v, mask=keep, block_q=3, block_k=4)
    full = np.broadcast_to(keep, (2, 3, 7, 9))
    for b in range(2):
        for h in range(3):
            want, want_lse = oracle(q[b, h], k[b, h], v[b, h], full[b, h])
            close(res.out[b, h], want)
            close(res.lse[b, h], want_lse)
    close(res.out, reference(q, k, v, mask=keep)[0])


@pytest.mark.parametrize("mask_shape", [(7, 9), (1, 3, 1, 9), (2, 1, 7, 9)])
def test_float_mask_is_added(mask_shape):
    q, k, v = qkv(7, 9, 4, dv=5, heads=(3, 3), b=2, seed=31)
    bias = rand(*mask_shape, seed=3)
    res = attention(q, k, v, mask=bias, block_q=4, block_k=2)
    full = np.broadcast_to(bias, (2, 3, 7, 9))
    for b in range(2):
        for h in range(3):
            want, want_lse = oracle(q[b, h], k[b, h], v[b, h], np.ones((7, 9), bool),
                                    bias=full[b, h])
            close(res.out[b, h], want)
            close(res.lse[b, h], want_lse)


def test_float_zero_minus_inf_mask_equals_bool_mask():
    q, k, v = qkv(8, 10, 4, seed=37)
    keep = np.random.default_rng(2).random((8, 10)) > 0.5
    keep[:, 0] = True
    bias = np.where(keep, 0.0, -np.inf)
    a = attention(q, k, v, mask=keep, block_q=3, block_k=3)
    b = attention(q, k, v, mask=bias, block_q=3, block_k=3)
    close(a.out, b.out, atol=0)
    close(a.lse, b.lse, atol=0)


@pytest.mark.parametrize("as_float", [False, True])
def test_mask_hiding_whole_tiles_skips_them(as_float):
    """t = s = 128, tiles of 32: hiding keys 0:64 hides K tiles 0 and 1 for all 4 Q tiles."""
    q, k, v = qkv(128, 128, 4, seed=41)
    keep = np.ones((128, 128), bool)
    keep[:, :64] = False
    mask = np.where(keep, 0.0, -np.inf) if as_float else keep
    plain = attention(q, k, v, block_q=32, block_k=32)
    res = attention(q, k, v, mask=mask, block_q=32, block_k=32)
    assert (plain.tiles.computed, plain.tiles.skipped) == (16, 0)
    assert (res.tiles.computed, res.tiles.skipped) == (8, 8)
    close(res.out, oracle(q, k, v, keep)[0])


def test_mask_hides_a_tile_only_if_every_head_hides_it():
    q, k, v = qkv(8, 8, 4, heads=(2, 2), seed=43)
    keep = np.ones((2, 8, 8), bool)
    keep[0, :, :4] = False  # head 0 hides K tile 0, head 1 does not
    res = attention(q, k, v, mask=keep, block_q=8, block_k=4)
    assert (res.tiles.computed, res.tiles.skipped) == (2, 0)
    keep[1, :, :4] = False
    res = attention(q, k, v, mask=keep, block_q=8, block_k=4)
    assert (res.tiles.computed, res.tiles.skipped) == (1, 1)


def test_mask_with_causal_and_window_combine():
    q, k, v = qkv(10, 10, 4, seed=47)
    keep = np.random.default_rng(4).random((10, 10)) > 0.3
    res = attention(q, k, v, mask=keep, causal=True, window=(4, 0), block_q=3, block_k=3)
    want, want_lse = oracle(q, k, v, keep & window_keep(10, 10, 4, 0, 0))
    close(res.out, want)
    close(res.lse, want_lse)


# ---------------------------------------------------------------------------------------------
# Causal tile counts


@pytest.mark.parametrize(("t", "s", "align", "counts"), [
    (256, 256, "bottom-right", (10, 6)),  # 4 + 3 + 2 + 1 lower-triangle tiles
    (256, 256, "top-left", (10, 6)),
    # offset 128: Q tile 0 (rows 0-63) sees keys ≤ 191 (K tiles 0-2), Q tile 1 all 4
    (128, 256, "bottom-right", (7, 1)),
    # top-left: Q tile 0 sees keys ≤ 63 (1 tile), Q tile 1 keys ≤ 127 (2 tiles)
    (128, 256, "top-left", (3, 5)),
    # offset -128: Q tiles 0, 1 see nothing; Q tile 2 sees K tile 0, Q tile 3 K tiles 0-1
    (256, 128, "bottom-right", (3, 5)),
])
def test_causal_tile_counts(t, s, align, counts):
    q, k, v = qkv(t, s, 8, seed=53)
    res = attention(q, k, v, causal=True, causal_align=align, block_q=64, block_k=64)
    assert (res.tiles.computed, res.tiles.skipped) == counts
    assert res.tiles.total == sum(counts)
    close(res.out, reference(q, k, v, causal=True, causal_align=align)[0])


# ---------------------------------------------------------------------------------------------
# GQA / MQA, layouts and input ranks


def test_gqa_heads_read_their_kv_head():
    """6 query heads, 2 kv heads: heads 0-2 read kv head 0, heads 3-5 read kv head 1."""
    q, k, v = qkv(5, 7, 4, dv=3, heads=(6, 2), seed=59)
    res = attention(q, k, v, block_q=2, block_k=3)
    assert res.out.shape == (6, 5, 3)
    keep = np.ones((5, 7), bool)
    for h in range(6):
        kv = (0, 0, 0, 1, 1, 1)[h]
        want, want_lse = oracle(q[h], k[kv], v[kv], keep)
        close(res.out[h], want)
        close(res.lse[h], want_lse)
        # and not the other kv head (so the check above can tell the two apart)
        other, _ = oracle(q[h], k[1 - kv], v[1 - kv], keep)
        assert np.abs(res.out[h] - other).max() > 1e-3


def test_mqa_and_batched_gqa():
    q, k, v = qkv(4, 6, 3, heads=(5, 1), b=2, seed=61)
    res = attention(q, k, v, causal=True, block_k=4)
    keep = pattern("111000", "111100", "111110", "111111")
    for b in range(2):
        for h in range(5):
            close(res.out[b, h], oracle(q[b, h], k[b, 0], v[b, 0], keep)[0])


@pytest.mark.parametrize("causal", [False, True])
def test_layout_bnhd_is_the_transpose(causal):
    q, k, v = qkv(9, 11, 4, dv=3, heads=(4, 2), b=2, seed=67)
    a = attention(q, k, v, causal=causal, block_q=4, block_k=3, trace_at=(1, 3, 5))
    tq, tk, tv = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    b = attention(tq, tk, tv, causal=causal, block_q=4, block_k=3, layout="bnhd",
                  trace_at=(1, 3, 5))
    assert b.out.shape == (2, 9, 4, 3) and b.lse.shape == (2, 4, 9)  # LSE: FA's (B, H, N)
    close(b.out, a.out.transpose(0, 2, 1, 3), atol=1e-15)
    close(b.lse, a.lse, atol=1e-15)
    assert [s.m for s in a.trace.steps] == pytest.approx([s.m for s in b.trace.steps], abs=1e-15)
    ref_out, ref_lse = reference(tq, tk, tv, causal=causal, layout="bnhd")
    close(b.out, ref_out)
    close(b.lse, ref_lse)


def test_layout_bnhd_three_dims():
    q, k, v = qkv(6, 8, 4, heads=(2, 2), seed=71)  # (H, N, d)
    a = attention(q, k, v, block_k=3)
    tq, tk, tv = (x.transpose(1, 0, 2) for x in (q, k, v))  # (N, H, d)
    b = attention(tq, tk, tv, block_k=3, layout="bnhd")
    assert b.out.shape == (6, 2, 4) and b.lse.shape == (2, 6)  # LSE: FA's (H, N)
    close(b.out, a.out.transpose(1, 0, 2), atol=1e-15)
    close(b.lse, a.lse, atol=1e-15)


def test_input_ranks_two_three_four():
    q, k, v = qkv(6, 8, 4, dv=2, seed=73)
    r2 = attention(q, k, v, block_k=3)
    r3 = attention(q[None], k[None], v[None], block_k=3)
    r4 = attention(q[None, None], k[None, None], v[None, None], block_k=3)
    assert (r2.out.shape, r2.lse.shape) == ((6, 2), (6,))
    assert (r3.out.shape, r3.lse.shape) == ((1, 6, 2), (1, 6))
    assert (r4.out.shape, r4.lse.shape) == ((1, 1, 6, 2), (1, 1, 6))
    assert (r3.out[0] == r2.out).all() and (r4.out[0, 0] == r2.out).all()
    assert (r3.lse[0] == r2.lse).all() and (r4.lse[0, 0] == r2.lse).all()
    assert r2.shapes.q == (6, 4) and r3.shapes.k == (1, 8, 4) and r4.shapes.v == (1, 1, 8, 2)


def test_lists_and_mixed_precision_inputs():
    q, k, v = qkv(3, 4, 2, seed=79)
    res = attention(q.tolist(), k.tolist(), v.tolist())
    close(res.out, reference(q, k, v)[0])
    res = attention(q.astype(np.float32), k, v)  # any float64 input: float64 state
    assert res.out.dtype == np.float64


# ---------------------------------------------------------------------------------------------
# Property: tile sizes, layouts, forms and heads do not change the result


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    t=st.integers(1, 12), s=st.integers(1, 12), d=st.integers(1, 6), dv=st.integers(1, 4),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]), b=st.integers(1, 2),
    bq=st.integers(1, 14), bk=st.integers(1, 14), layout=st.sampled_from(["bhnd", "bnhd"]),
    form=st.sampled_from(FORMS), causal=st.booleans(), align=st.sampled_from(ALIGNS),
    seed=st.integers(0, 2**16), data=st.data(),
)
def test_tiles_and_layouts_do_not_change_the_result(t, s, d, dv, heads, b, bq, bk, layout, form,
                                                   causal, align, seed, data):
    """Any tile sizes, layout, update form and order of the K/V tiles: the one-shot result."""
    q, k, v = qkv(t, s, d, dv, heads=heads, b=b, seed=seed)
    order = data.draw(st.permutations(range(-(-s // bk))), label="K/V tile order")
    kw = dict(causal=causal, causal_align=align)
    base = attention(q, k, v, **kw)
    ref_out, ref_lse = reference(q, k, v, **kw)
    if layout == "bnhd":
        args = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    else:
        args = [q, k, v]
    res = attention(*args, block_q=bq, block_k=bk, layout=layout, form=form,
                    order=np.array(order), **kw)
    out, lse = res.out, res.lse
    if layout == "bnhd":
        out = out.transpose(0, 2, 1, 3)  # the LSE is (B, H, N) for either layout
    close(out, ref_out)
    close(lse, ref_lse)
    close(out, base.out)
    close(lse, base.lse)
    assert res.counters.masked_rows == base.counters.masked_rows
    assert not np.isnan(out).any()


# ---------------------------------------------------------------------------------------------
# Trace records, worked by hand

HAND_Q = np.array([[1.0, 0.0]])
HAND_K = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 0.0], [3.0, 0.0]])
HAND_V = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])


@pytest.mark.parametrize("form", FORMS)
def test_trace_by_hand(form):
    """Q = [1, 0], keys along the first axis at 1, 2, 0, 3, scale 1: scores [1, 2, 0, 3].

    V rows [1, 0], [0, 1], [1, 1], [2, 0]; block_k = 2 gives two tiles. Start m = -inf, l = 0.
    Tile 0, keys 0:2, scores [1, 2]: tile max 2, m -inf -> 2, α = exp(-inf - 2) = 0,
      l = 0 + e^-1 + e^0 = 1.3678794, O = e^-1·[1, 0] + 1·[0, 1] = [0.3678794, 1].
    Tile 1, keys 2:4, scores [0, 3]: tile max 3 > 2, m 2 -> 3, α = e^(2-3) = 0.3678794,
      l = 1.3678794·e^-1 + e^-3 + e^0 = e^-2 + e^-1 + e^-3 + 1 = 1.5530018,
      O = [0.3678794, 1]·e^-1 + e^-3·[1, 1] + 1·[2, 0] = [e^-2 + e^-3 + 2, e^-1 + e^-3]
        = [2.1851224, 0.4176665].
    Final: out = O / l = [1.4070314, 0.2689414], LSE = 3 + ln 1.5530018 = 3.4401897.
    One rescale: tile 1 moved a finite m (the first tile's move from -inf does not count).
    """
    res = attention(HAND_Q, HAND_K, HAND_V, scale=1.0, block_k=2, form=form)
    assert isinstance(res, Attention) and res.trace.at == (0, 0, 0)
    first, second = res.trace.steps
    assert isinstance(first, Step)
    assert (first.block, first.start, first.stop, first.masked) == (0, 0, 2, False)
    assert (second.block, second.start, second.stop, second.masked) == (1, 2, 4, False)

    assert first.block_max == 2.0 and second.block_max == 3.0
    assert first.m_prev == -math.inf and first.m == 2.0
    assert first.alpha == 0.0
    assert first.l_prev == 0.0
    assert first.l == pytest.approx(E(-1) + 1, rel=1e-15)
    assert first.l == pytest.approx(1.3678794, abs=5e-8)
    close(first.o, [E(-1), 1.0], atol=1e-15)
    assert first.o_norm == pytest.approx(math.hypot(E(-1), 1.0), rel=1e-15)

    assert second.m_prev == 2.0 and second.m == 3.0
    assert second.alpha == pytest.approx(E(-1), rel=1e-15)
    assert second.alpha == pytest.approx(0.3678794, abs=5e-8)
    assert second.l_prev == first.l
    l_final = E(-2) + E(-1) + E(-3) + 1
    assert second.l == pytest.approx(l_final, rel=1e-15)
    assert second.l == pytest.approx(1.5530018, abs=5e-8)
    o_final = np.array([E(-2) + E(-3) + 2, E(-1) + E(-3)])
    close(second.o, o_final, atol=1e-15)
    close(second.o, [2.1851224, 0.4176665], atol=5e-8)

    close(res.out[0], o_final / l_final, atol=1e-15)
    close(res.out[0], [1.4070314, 0.2689414], atol=5e-8)
    close(res.trace.out, res.out[0], atol=0)
    assert res.lse[0] == pytest.approx(3 + math.log(l_final), rel=1e-15)
    assert res.lse[0] == pytest.approx(3.4401897, abs=5e-8)
    assert res.counters.rescales == 1
    assert (res.tiles.computed, res.tiles.skipped) == (2, 0)


def test_trace_keeps_first_three_components_of_o():
    q, k, v = qkv(3, 5, 4, dv=6, seed=83)
    res = attention(q, k, v, block_k=5, trace_at=(0, 0, 2))
    (step,) = res.trace.steps
    assert step.o.shape == (3,)
    # one tile: O is the unnormalised sum, out = O / l
    close(step.o / step.l, res.out[2, :3], atol=1e-15)
    assert step.o_norm == pytest.approx(np.linalg.norm(res.out[2]) * step.l, rel=1e-14)
    assert step.m == pytest.approx(np.max(q[2] @ k.T) / 2, rel=1e-15)


def test_causal_trace_marks_skipped_tiles():
    """t = s = 8, tiles 2 × 2, causal: query 1 (Q tile 0) sees K tile 0 only; tiles 1-3 are
    skipped and leave m and l as they were (α shown as 1). Query 7 skips none."""
    q, k, v = qkv(8, 8, 4, seed=89)
    res = attention(q, k, v, causal=True, block_q=2, block_k=2, trace_at=(0, 0, 1))
    assert [s.masked for s in res.trace.steps] == [False, True, True, True]
    assert [s.block for s in res.trace.steps] == [0, 1, 2, 3]
    first = res.trace.steps[0]
    assert first.m == pytest.approx(max(q[1] @ k[0], q[1] @ k[1]) / 2, rel=1e-15)
    for s in res.trace.steps[1:]:
        assert s.block_max == -math.inf and s.alpha == 1.0
        assert (s.m_prev, s.m, s.l_prev, s.l) == (first.m, first.m, first.l, first.l)
    assert (res.tiles.computed, res.tiles.skipped) == (10, 6)
    last = attention(q, k, v, causal=True, block_q=2, block_k=2, trace_at=(0, 0, 7))
    assert [s.masked for s in last.trace.steps] == [False] * 4


def test_trace_row_selects_batch_head_query():
    q, k, v = qkv(5, 6, 3, heads=(4, 2), b=2, seed=97)
    res = attention(q, k, v, block_k=6, trace_at=(1, 3, 4))
    assert res.trace.at == (1, 3, 4)
    close(res.trace.out, res.out[1, 3, 4], atol=0)
    (step,) = res.trace.steps
    # head 3 reads kv head 1
    assert step.m == pytest.approx(np.max(q[1, 3, 4] @ k[1, 1].T) / math.sqrt(3), rel=1e-15)
    assert attention(q, k, v, trace_at=None).trace.steps == ()


def test_summary_is_strict_json_with_the_trace():
    q, k, v = qkv(4, 6, 2, seed=101)
    # bottom-right, offset 2: Q tile 0 (rows 0-1) sees keys ≤ 3, so K tile 2 (keys 4-5) is skipped
    res = attention(q, k, v, causal=True, block_q=2, block_k=2, trace_at=(0, 0, 0))
    ref_out, ref_lse = reference(q, k, v, causal=True)
    doc = summary(res, errors(res, ref_out, ref_lse), ref_out[0])
    assert (doc["tiles_computed"], doc["tiles_skipped"], doc["tiles_total"]) == (5, 1, 6)
    assert [s["skipped"] for s in doc["trace"]["steps"]] == [False, False, True]
    assert doc["trace"]["steps"][0]["m_prev"] == -math.inf
    assert doc["trace"]["steps"][0]["scale"] == 0.0
    text = dumps(doc)
    assert "Infinity" not in text and "NaN" not in text and '"-inf"' in text
    assert summary(res, None, None)["reference"] == "skipped"


# ---------------------------------------------------------------------------------------------
# Against PyTorch


def test_matches_torch_sdpa():
    torch = pytest.importorskip(
        "torch", reason="torch is not installed: no PyTorch scaled_dot_product_attention to compare"
    )
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa_out(q, k, v, **kw):
        return sdpa(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)), **kw).numpy()

    # causal with t < s: PyTorch's is_causal is top-left
    q, k, v = qkv(7, 12, 16, dv=8, heads=(3, 3), b=2, seed=103)
    res = attention(q, k, v, causal=True, causal_align="top-left", block_q=3, block_k=5)
    close(res.out, sdpa_out(q, k, v, is_causal=True))
    # GQA: PyTorch's equivalent repeats each kv head for its group of query heads
    q, k, v = qkv(9, 13, 8, dv=5, heads=(6, 2), b=2, seed=107)
    res = attention(q, k, v, block_q=4, block_k=4)
    close(res.out, sdpa_out(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)))
    # a boolean mask (True = attend) and a float mask (added), both PyTorch's conventions
    keep = np.random.default_rng(5).random((9, 13)) > 0.3
    keep[:, 0] = True
    bias = rand(9, 13, seed=6)
    kr, vr = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
    close(attention(q, k, v, mask=keep, block_k=4).out,
          sdpa_out(q, kr, vr, attn_mask=torch.from_numpy(keep)))
    close(attention(q, k, v, mask=bias, block_k=4).out,
          sdpa_out(q, kr, vr, attn_mask=torch.from_numpy(bias)))


# ---------------------------------------------------------------------------------------------
# Errors: one clear OsmError each


@pytest.mark.parametrize(("shapes", "error", "words"), [
    (((4, 8), (5, 7), (5, 3)), ShapeError, "Q and K head dims differ: Q has d = 8, K has d = 7"),
    (((4, 8), (5, 8), (6, 3)), ShapeError,
     "K and V sequence lengths differ: K has 5 keys, V has 6"),
    (((6, 4, 8), (4, 5, 8), (4, 5, 3)), ShapeError, "Q has 6 heads and K/V 4"),
    (((2, 2, 4, 8), (3, 2, 5, 8), (3, 2, 5, 3)), ShapeError, "batch sizes differ: Q 2, K 3, V 3"),
    (((2, 4, 8), (2, 5, 8), (1, 5, 3)), ShapeError, "K and V head counts differ"),
    (((8,), (5, 8), (5, 3)), ShapeError, "Q has shape (8,)"),
    (((1, 1, 1, 4, 8), (5, 8), (5, 3)), ShapeError, "expected (N, d), (H, N, d) or (B, H, N, d)"),
])
def test_shape_errors(shapes, error, words):
    arrays = [rand(*shape) for shape in shapes]
    with pytest.raises(error) as info:
        attention(*arrays)
    assert words in str(info.value)


@pytest.mark.parametrize("dtype", [bool, np.complex128, object])
def test_non_float_dtypes_are_refused(dtype):
    q, k, v = qkv(3, 4, 2)
    with pytest.raises(InputError, match="K has dtype"):
        attention(q, k.astype(dtype), v)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_integer_inputs_are_float64(dtype):
    """As numpy takes them (issue 19 item 9): integers are float64 values."""
    q, k, v = qkv(3, 4, 2)
    k = np.abs(np.round(k * 4))  # whole numbers every integer dtype holds
    got = attention(q, k.astype(dtype), v).out
    assert np.array_equal(got, attention(q, k, v).out)


@pytest.mark.parametrize(("bad", "what"), [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "inf")])
@pytest.mark.parametrize("which", ["Q", "K", "V"])
def test_non_finite_inputs_are_refused(bad, what, which):
    arrays = dict(zip("QKV", qkv(3, 4, 2), strict=True))
    arrays[which][1, 1] = bad
    with pytest.raises(InputError) as info:
        attention(*arrays.values())
    assert str(info.value).startswith(f"{which} holds {what} at index (0, 0, 1, 1)")


def test_bad_options_are_refused():
    q, k, v = qkv(3, 4, 2)
    cases = [
        (dict(block_q=-1), "block sizes must be positive"),
        (dict(block_k=-3), "block sizes must be positive"),
        (dict(form="fast"), "form must be one of"),
        (dict(masked_lse="nan"), "masked LSE must be one of"),
        (dict(layout="bshd"), "layout must be one of"),
        (dict(causal=True, causal_align="middle"), "causal alignment must be one of"),
        (dict(trace_at=(0, 0, 3)), "traced row (batch 0, head 0, query 3) is outside"),
        (dict(trace_at=(1, 0, 0)), "is outside Q's (B, H, t) = (1, 1, 3)"),
        (dict(mask=np.ones((3, 4), int)), "mask has dtype int64"),
        (dict(mask=np.full((3, 4), np.nan)), "mask contains NaN"),
    ]
    for kwargs, words in cases:
        with pytest.raises(OsmError) as info:
            attention(q, k, v, **kwargs)
        assert words in str(info.value), kwargs


def test_mask_not_broadcastable():
    q, k, v = qkv(3, 4, 2, heads=(2, 2))
    with pytest.raises(ShapeError, match=r"mask of shape \(3, 5\) does not broadcast to "
                                         r"\(B, H, t, s\) = \(1, 2, 3, 4\)"):
        attention(q, k, v, mask=np.ones((3, 5), bool))


# ---------------------------------------------------------------------------------------------
# Bugs found while writing these tests, now fixed: each test guards its fix


def test_zero_block_size_is_refused():
    q, k, v = qkv(3, 4, 2)
    with pytest.raises(InputError, match="block sizes must be positive"):
        attention(q, k, v, block_q=0)


def test_empty_queries():
    """t = 0 (was: ThreadPoolExecutor(0) raised ValueError)."""
    _, k, v = qkv(3, 4, 2)
    res = attention(np.zeros((0, 2)), k, v, trace_at=None)
    assert res.out.shape == (0, 2) and res.lse.shape == (0,)
    assert (res.tiles.computed, res.tiles.skipped, res.counters.masked_rows) == (0, 0, 0)
    ref_out, ref_lse = reference(np.zeros((0, 2)), k, v)
    assert ref_out.shape == (0, 2) and ref_lse.shape == (0,)


def test_reference_with_no_keys():
    """s = 0: every row fully masked (was: reference() raised ValueError on an empty max)."""
    q, _, _ = qkv(3, 4, 2)
    k, v = np.zeros((0, 2)), np.zeros((0, 5))
    res = attention(q, k, v)
    assert (res.out == 0).all() and np.isneginf(res.lse).all()
    ref_out, ref_lse = reference(q, k, v)
    assert (ref_out == 0).all() and np.isneginf(ref_lse).all()


def test_plus_inf_in_float_mask_is_refused():
    """+inf added to a score made m = inf and inf - inf = NaN (was: NaN output, no error)."""
    q, k, v = qkv(3, 4, 2)
    bias = np.zeros((3, 4))
    bias[0, 1] = np.inf
    with pytest.raises(InputError, match=r"mask contains NaN or \+inf"):
        attention(q, k, v, mask=bias)


def test_zero_head_dim_is_refused():
    """d = 0 (was: attention() ran with scale 1 while reference() divided by sqrt(0))."""
    for f in (attention, reference):
        with pytest.raises(ShapeError, match="head dim d = 0"):
            f(np.zeros((4, 0)), np.zeros((6, 0)), np.zeros((6, 3)))
