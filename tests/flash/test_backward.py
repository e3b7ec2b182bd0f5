"""The backward pass: a worked example by hand, the closed-form gradients against central finite
differences of the forward, the tiled backward against the closed form, kernels' LSE
conventions for fully masked rows, the traces, and the flash model of FA2's backward."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import qkv, rand
from osm_cli.core.backward import backward_step, delta, lse_for_p
from osm_cli.errors import InputError, ShapeError
from osm_cli.flash.backward import attention_backward
from osm_cli.flash.forward import attention
from osm_cli.flash.options import ScoreOptions
from osm_cli.flash.reference import reference, reference_backward
from osm_cli.precision.backward import fa2_backward_blocks, flash_backward, plain_backward
from osm_cli.precision.dtypes import DTYPES, round_inputs, round_to
from osm_cli.precision.model import model

TINY = {"q": np.array([[1.0, 0.0]]), "k": np.array([[1.0, 0.0], [0.0, 1.0]]),
        "v": np.array([[1.0, 2.0], [3.0, 4.0]]), "do": np.array([[1.0, 1.0]])}


def test_worked_example_by_hand():
    """One query, two keys, scale 1: S = q·kᵀ = [1, 0], so P = [e/(1+e), 1/(1+e)]
    = [0.7310586, 0.2689414] and O = P·V = [1.5378828, 2.5378828]. With dO = [1, 1]:
    D = dO·O = 4.0757656 (the same as rowsum(P ∘ dP), dP = dO·Vᵀ = [3, 7]);
    dS = P ∘ (dP − D) = [0.7310586·(−1.0757656), 0.2689414·2.9242344] = [−0.7864477, 0.7864477]:
    a row of dS sums to 0. dQ = dS·K = [−0.7864477, 0.7864477], dK = dSᵀ·Q = [[−0.7864477, 0],
    [0.7864477, 0]] and dV = Pᵀ·dO = [[0.7310586, 0.7310586], [0.2689414, 0.2689414]]."""
    e = math.e
    p = np.array([e / (1 + e), 1 / (1 + e)])
    ds = p * (np.array([3.0, 7.0]) - (p @ np.array([3.0, 7.0])))
    assert ds == pytest.approx([-0.78644773, 0.78644773])
    res = attention_backward(TINY["q"], TINY["k"], TINY["v"], TINY["do"], scale=1.0)
    assert res.delta == pytest.approx([4.0757656])
    np.testing.assert_allclose(res.dq, [ds], rtol=1e-15)
    np.testing.assert_allclose(res.dk, [[ds[0], 0.0], [ds[1], 0.0]], rtol=1e-15, atol=0)
    np.testing.assert_allclose(res.dv, [[p[0], p[0]], [p[1], p[1]]], rtol=1e-15)
    for got, ref in zip((res.dq, res.dk, res.dv),
                        reference_backward(TINY["q"], TINY["k"], TINY["v"], TINY["do"],
                                           scale=1.0), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-15, atol=1e-16)


def test_delta_and_lse_for_p():
    assert delta(np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]])).tolist() == [11.0]
    assert lse_for_p(np.array([-np.inf, 0.5, np.inf])).tolist() == [np.inf, 0.5, np.inf]


def test_backward_step_fully_masked_row_gives_zero_not_nan():
    s = np.array([[[-np.inf, -np.inf], [0.5, -1.0]]])
    lse = lse_for_p(np.array([[-np.inf, 0.7]]))
    up = backward_step(s, lse, np.zeros((1, 2)), np.ones((1, 2, 3)), np.ones((1, 2, 3)),
                       np.ones((1, 2, 2)), np.ones((1, 2, 2)))
    assert not np.isnan(up.p).any() and (up.p[0, 0] == 0).all() and (up.ds[0, 0] == 0).all()


def _finite_differences(q, k, v, do, h=1e-6, **opts):
    """Central differences of L = Σ out ∘ do, out the float64 reference forward."""
    def loss(*x):
        return float((reference(*x, **opts)[0] * do).sum())

    grads = []
    for which in range(3):
        x = [q.copy(), k.copy(), v.copy()][which]
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q, k, v]
            up, dn = x.copy(), x.copy()
            up[idx] += h
            dn[idx] -= h
            args[which] = up
            f_up = loss(*args)
            args[which] = dn
            g[idx] = (f_up - loss(*args)) / (2 * h)
        grads.append(g)
    return grads


FD_CASES = [  # name, (t, s, (Hq, Hkv)) with d = 4, dv = 3, B = 1, options
    ("plain", (5, 7, (2, 2)), {}),
    ("causal bottom-right, t > s (first rows fully masked)", (6, 3, (2, 2)), {"causal": True}),
    ("causal top-left, t < s", (4, 7, (2, 2)), {"causal": True, "causal_align": "top-left"}),
    ("window", (6, 6, (2, 2)), {"window": (1, 1)}),
    ("GQA 6 query heads on 2 kv heads", (3, 4, (6, 2)), {"causal": True}),
    ("MQA", (4, 5, (3, 1)), {}),
    ("scale", (5, 7, (2, 2)), {"scale": 0.9}),
]


@pytest.mark.parametrize("name, shape, opts", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_reference_gradients_match_finite_differences(name, shape, opts):
    q, k, v, do = qkv(shape[0], shape[1], 4, dv=3, heads=shape[2], b=1, do=True)
    num = _finite_differences(q, k, v, do, **opts)
    for got, fd in zip(reference_backward(q, k, v, do, **opts), num, strict=True):
        np.testing.assert_allclose(got, fd, atol=2e-8, rtol=0)


def test_reference_gradients_with_masks_match_finite_differences():
    q, k, v, do = qkv(4, 5, 4, dv=3, heads=(2, 2), b=1, do=True)
    keep = np.ones((4, 5), bool)
    keep[1] = False  # a fully masked row: no gradient to or from it
    keep[2, :3] = False
    add = np.where(rand(4, 5, seed=9) > 0.5, -np.inf, rand(4, 5, seed=10))
    add[:, 0] = 0.0
    for mask in (keep, add):
        num = _finite_differences(q, k, v, do, mask=mask)
        ref = reference_backward(q, k, v, do, mask=mask)
        for got, fd in zip(ref, num, strict=True):
            np.testing.assert_allclose(got, fd, atol=2e-8, rtol=0)
    assert (reference_backward(q, k, v, do, mask=keep)[0][0, :, 1] == 0).all()


LAYOUT_CASES = [
    ("2-D", (5, 4), (7, 4), (7, 3), (5, 3), {}),
    ("3-D", (2, 5, 4), (2, 7, 4), (2, 7, 3), (2, 5, 3), {}),
    ("bnhd GQA", (2, 5, 4, 4), (2, 7, 2, 4), (2, 7, 2, 3), (2, 5, 4, 3), {"layout": "bnhd"}),
]


@pytest.mark.parametrize("name, sq, sk, sv, sdo, opts", LAYOUT_CASES,
                         ids=[c[0] for c in LAYOUT_CASES])
def test_layouts_give_gradients_shaped_like_the_inputs(name, sq, sk, sv, sdo, opts):
    q, k, v, do = (rand(*s, seed=i) for i, s in enumerate((sq, sk, sv, sdo)))
    res = attention_backward(q, k, v, do, block_q=2, block_k=3, causal=True, **opts)
    ref = reference_backward(q, k, v, do, causal=True, **opts)
    for got, want, like in zip((res.dq, res.dk, res.dv), ref, (q, k, v), strict=True):
        assert got.shape == like.shape
        np.testing.assert_allclose(got, want, atol=1e-13, rtol=0)


@settings(max_examples=40, deadline=None)
@given(hk=st.integers(1, 2), g=st.integers(1, 3), t=st.integers(1, 9), s=st.integers(0, 9),
       bq=st.integers(1, 5), bk=st.integers(1, 5), causal=st.booleans(),
       align=st.sampled_from(["bottom-right", "top-left"]), seed=st.integers(0, 999))
def test_tiled_backward_equals_the_closed_form(hk, g, t, s, bq, bk, causal, align, seed):
    """Any tiles, any GQA grouping, any t and s (no keys at all too), causal either way: the
    tiled backward in float64 equals the closed form to rounding, and never writes NaN."""
    q, k, v, do = qkv(t, s, 4, dv=3, heads=(hk * g, hk), b=1, seed=seed, do=True)
    res = attention_backward(q, k, v, do, block_q=bq, block_k=bk, causal=causal,
                             causal_align=align)
    ref = reference_backward(q, k, v, do, causal=causal, causal_align=align)
    for got, want in zip((res.dq, res.dk, res.dv), ref, strict=True):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)
    fwd = attention(q, k, v, block_q=bq, block_k=bk, causal=causal, causal_align=align)
    assert (res.tiles.computed, res.tiles.skipped) == (fwd.tiles.computed, fwd.tiles.skipped)


@pytest.mark.parametrize("marker", [-np.inf, np.inf, 0.0])
def test_any_masked_row_lse_convention_gives_the_same_gradients(marker):
    """FA2 stores +inf as the LSE of a fully masked row, FA3/FA4 −inf, PyTorch's CPU kernel 0:
    P = 0 on that row in every case."""
    # causal bottom-right: queries 0-2 see no key
    q, k, v, do = qkv(6, 3, 4, dv=3, heads=(2, 2), b=1, do=True)
    fwd = attention(q, k, v, causal=True)
    lse = np.where(np.isneginf(fwd.lse), marker, fwd.lse)
    res = attention_backward(q, k, v, do, out=fwd.out, lse=lse, causal=True)
    assert res.counters.masked_rows == (0 if marker == 0.0 else 6)
    for got, want in zip((res.dq, res.dk, res.dv), reference_backward(q, k, v, do, causal=True),
                         strict=True):
        np.testing.assert_allclose(got, want, atol=1e-13, rtol=0)
    assert (res.dq[0, :, :3] == 0).all()


def test_gqa_gradients_are_the_sums_of_the_query_heads():
    q, k, v, do = qkv(5, 6, 4, dv=3, heads=(4, 2), b=1, do=True)
    res = attention_backward(q, k, v, do, block_q=2, block_k=4)
    for kv in range(2):
        heads = [2 * kv, 2 * kv + 1]
        parts = [attention_backward(q[:, [h]], k[:, [kv]], v[:, [kv]], do[:, [h]]) for h in heads]
        np.testing.assert_allclose(res.dk[:, kv], sum(p.dk[:, 0] for p in parts), atol=1e-13)
        np.testing.assert_allclose(res.dv[:, kv], sum(p.dv[:, 0] for p in parts), atol=1e-13)


def test_traces_end_at_the_written_rows():
    """The key trace walks every Q tile (masked ones marked), the query trace every K/V tile;
    the last norms are those of the rows written; a row of dS sums to 0 over the tiles."""
    q, k, v, do = qkv(7, 9, 4, dv=3, heads=(4, 2), b=1, do=True)
    res = attention_backward(q, k, v, do, block_q=2, block_k=2, causal=True,
                             trace_at=(0, 3, 5), trace_key=4)
    assert res.trace.kv_head == 1 and res.trace.group == 2
    assert [s.block for s in res.trace.key_steps] == [0, 1, 2, 3]
    assert [s.block for s in res.trace.steps] == [0, 1, 2, 3, 4]
    last = res.trace.key_steps[-1]
    assert last.dk_norm == pytest.approx(np.linalg.norm(res.dk[0, 1, 4]), rel=1e-13)
    assert last.dv_norm == pytest.approx(np.linalg.norm(res.dv[0, 1, 4]), rel=1e-13)
    assert res.trace.steps[-1].dq_norm == pytest.approx(np.linalg.norm(res.dq[0, 3, 5]),
                                                        rel=1e-13)
    assert sum(s.ds_sum for s in res.trace.steps) == pytest.approx(0.0, abs=1e-12)
    # bottom-right causal with t = 7, s = 9: query i sees keys j <= i + 2. Key 4's tile (keys
    # 4:6) is hidden from Q tile 0 (queries 0, 1); query 5's Q tile (4, 5) sees no key of 8:9
    assert [s.masked for s in res.trace.key_steps] == [True, False, False, False]
    assert [s.masked for s in res.trace.steps] == [False, False, False, False, True]
    assert res.trace.key_steps[0].p_max == 0 and res.trace.key_steps[0].dk_norm == 0


def test_bad_inputs_name_the_problem():
    q, k, v, do = qkv(5, 7, 4, dv=3, heads=(2, 2), b=1, do=True)
    with pytest.raises(ShapeError, match="dO has shape"):
        attention_backward(q, k, v, do[..., :2])
    fwd = attention(q, k, v)
    with pytest.raises(InputError, match="together"):
        attention_backward(q, k, v, do, out=fwd.out)
    with pytest.raises(ShapeError, match="LSE has shape"):
        attention_backward(q, k, v, do, out=fwd.out, lse=fwd.lse[..., :3])
    with pytest.raises(InputError, match="NaN"):
        attention_backward(q, k, v, do, out=fwd.out, lse=np.full_like(fwd.lse, np.nan))
    with pytest.raises(InputError, match="traced key 7"):
        attention_backward(q, k, v, do, trace_key=7)
    with pytest.raises(InputError, match="dO holds inf"):
        attention_backward(q, k, v, np.where(do > 2, np.inf, do))


def test_fa2_backward_tiles():
    assert [fa2_backward_blocks(d) for d in (32, 64, 96, 128, 256)] == [
        (128, 128), (128, 128), (64, 128), (64, 128), (64, 64)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_flash_backward_model_rounds_like_a_kernel(dtype):
    """The model's gradients hold dtype values; they err less than plain same-dtype attention's
    (what FlashAttention's backward rule compares against) on these inputs."""
    m = model(dtype)
    arrays = {n: rand(1, 4, 96, 64, seed=i).astype(np.float32) for i, n in enumerate("QKVD")}
    (q, k, v, do), _ = round_inputs(arrays, DTYPES[dtype])
    res = flash_backward(m, q, k, v, do, trace_at=None)
    assert res.own_forward and (res.tiles.block_q, res.tiles.block_k) == (128, 128)
    refs = reference_backward(q, k, v, do)
    pts = plain_backward(q, k, v, do, DTYPES[dtype])
    for got, ref, pt in zip((res.dq, res.dk, res.dv), refs, pts, strict=True):
        np.testing.assert_array_equal(round_to(got, DTYPES[dtype], got.dtype), got)
        assert np.abs(got - ref).max() < np.abs(pt - ref).max()
        assert np.abs(pt - ref).max() < 0.05


def test_flash_backward_score_keywords_reach_its_own_forward():
    """causal=True as a keyword holds for the forward flash_backward runs itself (it once ran
    that forward without the mask, so O and the LSE were another attention's)."""
    m = model("bfloat16")
    arrays = {n: rand(1, 2, 160, 32, seed=i).astype(np.float32) for i, n in enumerate("QKVD")}
    (q, k, v, do), _ = round_inputs(arrays, DTYPES["bfloat16"])
    by_keyword = flash_backward(m, q, k, v, do, causal=True, trace_at=None)
    by_record = flash_backward(m, q, k, v, do, opts=ScoreOptions(causal=True), trace_at=None)
    plain = flash_backward(m, q, k, v, do, trace_at=None)
    for g in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(getattr(by_keyword, g), getattr(by_record, g))
    assert not np.array_equal(by_keyword.dk, plain.dk)
    ref = reference_backward(q, k, v, do, causal=True)
    assert np.abs(by_keyword.dq - ref[0]).max() < 0.05
