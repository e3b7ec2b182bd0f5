"""The fused forward (attention/fast.py) against the textbook loop (core.state.rescale_step),
and the fused float64 reference against the one-shot as written.

The claim is identity, not closeness: the fused loop does the textbook's operations in the same
order and dtype into reused buffers, so out, lse, every traced Step and every counter must be
bit for bit the same, in float64 and in float32, under causal masks, windows, user masks, GQA,
t ≠ s, tiles that do not divide the lengths, rows with no visible key, a lazy-rescale threshold,
P's rounding and a permuted tile order. One step is also compared with rescale_step directly.
The reference's two forms must agree the same way, chunk by chunk.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import qkv
from osm_cli.core.state import State, rescale_step
from osm_cli.flash import reference as reference_module
from osm_cli.flash import rows
from osm_cli.flash.fast import _Tile
from osm_cli.flash.forward import Attention, attention
from osm_cli.flash.options import Hooks, ScoreOptions, Tiling
from osm_cli.flash.plan import make_plan, q_groups
from osm_cli.flash.reference import reference
from osm_cli.precision.model import hooks_for, model, run


def same(a: Attention, b: Attention) -> None:
    """Every field of two runs identical: arrays bit for bit (and of one dtype), the run's
    sub-records equal, each traced row's steps field by field (their o arrays bit for bit)."""
    for name in Attention.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if name == "trace":
            assert (x.at, x.queries, len(x.rows)) == (y.at, y.queries, len(y.rows))
            assert (x.outs is None) == (y.outs is None)
            if x.outs is not None:
                assert x.outs.dtype == y.outs.dtype and np.array_equal(x.outs, y.outs)
            for ra, rb in zip(x.rows, y.rows, strict=True):
                assert len(ra) == len(rb)
                for sa, sb in zip(ra, rb, strict=True):
                    for field in sa.__dataclass_fields__:
                        fa, fb = getattr(sa, field), getattr(sb, field)
                        if isinstance(fa, np.ndarray) or isinstance(fb, np.ndarray):
                            assert np.array_equal(fa, fb), (name, field)
                        else:
                            assert fa == fb or (fa != fa and fb != fb), (field, fa, fb)
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        else:
            assert x == y, (name, x, y)


@pytest.fixture(params=["numpy", "compiled"])
def row_ops(request, monkeypatch):
    """The fused loop's row operations (flash/rows.py) by numpy, then compiled by numba (on
    every run, however small): both must give the textbook's bits."""
    if request.param == "compiled" and not rows.compiled():
        pytest.skip("numba is not installed, or its row operations are not numpy's here")
    bound = 0 if request.param == "compiled" else 1 << 62
    monkeypatch.setattr(rows, "COMPILED_FROM", bound)
    monkeypatch.setattr(rows, "LOADED_FROM", bound)
    return request.param


def both(q, k, v, **kw) -> tuple[Attention, Attention]:
    return attention(q, k, v, fused=True, **kw), attention(q, k, v, fused=False, **kw)


# (b, hq, hk, t, s, d, dv, block_q, block_k)
SHAPES = [
    (1, 8, 8, 300, 300, 64, 64, None, None),  # FA2's default tiles, a partial last tile
    (2, 4, 2, 113, 203, 17, 9, 16, 48),  # GQA, t < s
    (1, 6, 2, 203, 113, 8, 5, 37, 10),  # GQA, t > s: causal rows with no key
    (1, 1, 1, 5, 2, 3, 1, 2, 1),
    (2, 3, 1, 64, 257, 33, 16, 64, 128),
]


@pytest.mark.usefixtures("row_ops")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("masks", ["none", "causal", "causal top-left", "window", "bool",
                                   "float", "window bool"])
@pytest.mark.parametrize(("b", "hq", "hk", "t", "s", "d", "dv", "bq", "bk"), SHAPES)
def test_fused_is_the_textbook_loop(b, hq, hk, t, s, d, dv, bq, bk, masks, dtype):
    q, k, v = qkv(t, s, d, dv=dv, heads=(hq, hk), b=b, dtype=dtype, seed=t + s)
    rng = np.random.default_rng(1)
    kw: dict = {"block_q": bq, "block_k": bk, "trace_at": (b - 1, hq - 1, t // 2)}
    if masks.startswith("causal"):
        kw.update(causal=True, causal_align="top-left" if "top-left" in masks else "bottom-right")
    if "window" in masks:
        kw["window"] = (7, 3)
    if "bool" in masks:
        kw["mask"] = rng.random((b, hq, t, s)) < 0.7
    if masks == "float":  # the mask's own dtype: float64 on float32 scores runs the textbook
        kw["mask"] = np.where(rng.random((t, s)) < 0.2, -np.inf,
                              rng.standard_normal((t, s))).astype(dtype)
    fused, textbook = both(q, k, v, **kw)
    same(fused, textbook)
    assert fused.tiles.computed + fused.tiles.skipped == fused.tiles.total


@pytest.mark.usefixtures("row_ops")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_lazy_rescale_order_and_key_range(dtype):
    q, k, v = qkv(150, 333, 16, dv=8, heads=(4, 2), b=1, dtype=dtype, seed=3, spread=2.0)
    rng = np.random.default_rng(2)
    for kw in ({"threshold": 1.5}, {"threshold": 8.0, "causal": True},
               {"order": rng.permutation(-(-333 // 32))},
               {"keys": (20, 300), "order": rng.permutation(-(-280 // 32)), "causal": True}):
        kw = {"block_k": 32, **kw}
        same(*both(q, k, v, trace_at=(0, 3, 149), **kw))
        # several rows, in different Q tiles of one stack and out of order: each its own trace
        same(*both(q, k, v, trace_at=(0, 3, [149, 0, 63, 64, 100]), **kw))


@pytest.mark.usefixtures("row_ops")
@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3"])
def test_fused_precision_model_rounds_p_the_same(name):
    """The flash model's float32 state and P rounded to the dtype before P·V (Hooks.p_round)."""
    mod = model(name)
    q, k, v = (x.astype(mod.dtype).astype(np.float32)
               for x in qkv(200, 190, 16, dv=16, heads=(2, 2), b=1))
    assert mod.p_round is not None
    a = run(mod, q, k, v, causal=True, hooks=hooks_for(mod))
    b = run(mod, q, k, v, causal=True, hooks=hooks_for(mod), fused=False)
    same(a, b)


@pytest.mark.usefixtures("row_ops")
def test_fused_untraced_and_masked_rows():
    """No traced row; a user mask that hides whole rows and whole tiles (LSE -inf, O 0)."""
    q, k, v = qkv(40, 50, 4, dv=3, heads=(2, 2), b=2, seed=9)
    mask = np.ones((40, 50), bool)
    mask[5:9] = False  # rows with no key
    mask[:, 16:32] = False  # a K/V tile hidden for every row
    for masked_lse in ("neg-inf", "zero"):
        fused, textbook = both(q, k, v, mask=mask, block_q=8, block_k=16, trace_at=None,
                               masked_lse=masked_lse)
        same(fused, textbook)
        assert fused.counters.masked_rows == 2 * 2 * 4 and fused.tiles.skipped > 0


def test_fused_stacks_unmasked_q_tiles_of_one_head():
    """One head, no mask: Q tiles run stacked (q_groups), the short last one alone; the numbers,
    the traced row inside a stack, the counts and the progress calls are those of one at a time."""
    q, k, v = qkv(1000, 300, 16, dv=8, heads=(1, 1), b=1, dtype=np.float32, seed=11)
    plan = make_plan(q, k, v, ScoreOptions(), Tiling(block_q=64), Hooks(), None)
    groups = q_groups(plan)
    assert groups == [tuple(range(0, 960, 64)), (960,)]
    calls: dict[bool, list] = {True: [], False: []}
    for fused in (True, False):
        calls[fused].append(attention(q, k, v, block_q=64, fused=fused, trace_at=(0, 0, 555),
                                      progress=lambda done, total, f=fused:
                                      calls[f].append((done, total))))
    same(calls[True][-1], calls[False][-1])
    assert calls[True][-2] == (16, 16) and calls[False][-2] == (16, 16)


@pytest.mark.parametrize("shapes", [((0, 2, 5, 4), (0, 2, 6, 4)), ((1, 2, 0, 4), (1, 2, 6, 4)),
                                    ((1, 2, 5, 4), (1, 2, 0, 4))])
def test_fused_empty_batch_queries_or_keys(shapes):
    sq, sk = shapes
    q, k = np.ones(sq), np.ones(sk)
    v = np.ones((*sk[:-1], 3))
    for causal in (False, True):
        same(*both(q, k, v, causal=causal, trace_at=None))


@pytest.mark.usefixtures("row_ops")
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]),
       st.integers(1, 70), st.integers(0, 70), st.integers(1, 9), st.integers(1, 40),
       st.integers(1, 40), st.booleans(), st.sampled_from([None, (0, 0), (5, -1), (-1, 2)]),
       st.booleans(), st.integers(0, 10**6))
def test_fused_is_the_textbook_loop_on_random_inputs(b, heads, t, s, d, bq, bk, causal, window,
                                                     with_mask, seed):
    hq, hk = heads
    q, k, v = qkv(t, s, d, dv=1 + seed % 5, heads=(hq, hk), b=b, seed=seed, spread=1 + seed % 3)
    mask = None
    if with_mask:
        mask = np.random.default_rng(seed).random((b, 1, t, s)) < 0.8
    same(*both(q, k, v, causal=causal, window=window, mask=mask, block_q=bq, block_k=bk,
               trace_at=(b - 1, hq - 1, seed % t)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threshold", [0.0, 0.7])
def test_one_fused_step_is_rescale_step(dtype, threshold):
    """_Tile.step against rescale_step on one state: rows still at -inf, rows whose max moves,
    rows whose max stays, a row of only -inf scores."""
    rng = np.random.default_rng(4)
    rows, width, dv = 6, 11, 3
    m = np.array([-np.inf, -np.inf, 0.5, 2.0, 3.0, -1.0], dtype=dtype)
    l = np.where(np.isneginf(m), 0, rng.random(rows) + 1).astype(dtype)
    o = np.where(np.isneginf(m)[:, None], 0, rng.standard_normal((rows, dv))).astype(dtype)
    s = (2 * rng.standard_normal((rows, width))).astype(dtype)
    s[1] = -np.inf
    s[3, :5] = -np.inf
    v = rng.standard_normal((width, dv)).astype(dtype)
    want = rescale_step(State(m, l, o), s, v, threshold=threshold)
    tile = _Tile((rows,), dv, np.dtype(dtype))
    tile.m[:], tile.l[:], tile.o[:] = m, l, o
    buf = tile.s(width)
    buf[:] = s
    tile.step(slice(None), buf, v, threshold, None)
    for got, exp in ((tile.m_new, want.state.m), (tile.l, want.state.l), (tile.o, want.state.o),
                     (tile.alpha, want.alpha), (tile.block_max, want.block_max)):
        assert got.dtype == exp.dtype and np.array_equal(got, exp)


# ---------------------------------------------------------------------------------------------
# The float64 reference: _one_shot_fused against _one_shot as written


def same_reference(q, k, v, **kw) -> None:
    fused = reference(q, k, v, **kw)
    textbook = reference(q, k, v, fused=False, **kw)
    for a, b in zip(fused, textbook, strict=True):
        assert a.dtype == b.dtype == np.float64 and np.array_equal(a, b)


@pytest.mark.parametrize("step", [256, 1, 4])
@pytest.mark.parametrize("chunk", [None, 1, 3, 7])
@pytest.mark.parametrize("masks", ["none", "causal", "causal top-left", "window", "bool",
                                   "float"])
def test_fused_reference_is_the_one_shot(masks, chunk, step, monkeypatch):
    """Chunks of query rows as _one_shot cuts them (monkeypatched small: a chunk of one row is
    a matrix-vector product in BLAS), GQA, t ≠ s, bnhd, float32 inputs, rows with no key; the
    keys of a chunk's span in steps of 1, 4 or 256 (so all of them here)."""
    monkeypatch.setattr(reference_module, "SPAN_STEP", step)
    if chunk is not None:
        monkeypatch.setattr(reference_module, "_chunk_rows", lambda heads, s: chunk)
    rng = np.random.default_rng(5)
    kw: dict = {}
    if masks.startswith("causal"):
        kw.update(causal=True, causal_align="top-left" if "top-left" in masks else "bottom-right")
    if masks == "window":
        kw["window"] = (3, 0)
    for b, hq, hk, t, s, d, dv in ((2, 4, 2, 23, 17, 5, 3), (1, 3, 3, 9, 40, 8, 8)):
        q, k, v = qkv(t, s, d, dv=dv, heads=(hq, hk), b=b, seed=t * s, spread=3.0)
        if masks == "bool":
            kw["mask"] = rng.random((b, hq, t, s)) < 0.6
        if masks == "float":
            kw["mask"] = np.where(rng.random((t, s)) < 0.3, -np.inf, rng.standard_normal((t, s)))
        same_reference(q, k, v, **kw)
        same_reference(q.astype(np.float32), k.astype(np.float32), v, **kw)
        same_reference(*(x.swapaxes(1, 2) for x in (q, k, v)), layout="bnhd",
                       **{n: x for n, x in kw.items() if n != "mask"})


def test_key_span_is_the_band_of_a_chunk(monkeypatch):
    """The keys a chunk of rows sees: causal bottom-right (offset s − t) and top-left, a
    window's two sides, no side bounded, and rows that see no key (all keys, as before); in
    whole steps of SPAN_STEP keys (1 here; 256 by default)."""
    from osm_cli.flash.masks import make_band
    from osm_cli.flash.reference import key_span

    assert key_span(make_band(4096, 4096, True, "bottom-right", None), 1000, 1032, 4096) == (
        0, 1280)
    assert key_span(make_band(4096, 4096, False, "bottom-right", (100, 0)), 1000, 1032,
                    4096) == (768, 1280)
    monkeypatch.setattr(reference_module, "SPAN_STEP", 1)
    span = key_span
    assert span(make_band(8, 8, True, "bottom-right", None), 0, 3, 8) == (0, 3)
    assert span(make_band(4, 10, True, "bottom-right", None), 0, 2, 10) == (0, 8)
    assert span(make_band(4, 10, True, "top-left", None), 2, 4, 10) == (0, 4)
    assert span(make_band(16, 16, False, "bottom-right", (3, 1)), 8, 12, 16) == (5, 13)
    assert span(make_band(16, 16, True, "bottom-right", (3, -1)), 8, 12, 16) == (5, 12)
    assert span(make_band(16, 16, False, "bottom-right", (-1, 2)), 14, 16, 16) == (0, 16)
    assert span(make_band(10, 4, True, "bottom-right", None), 0, 5, 4) == (0, 4)  # none seen


@pytest.mark.parametrize("ts", [(40, 52), (52, 40)])  # t > s: the first rows see no key
@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, causal_align="top-left"),
                                dict(window=(5, 0)), dict(window=(4, 2), causal=False)])
def test_spanned_reference_is_the_full_one_within_float64(kw, ts, monkeypatch):
    """A chunk's scores over only the keys its rows see: the same softmax and output as over
    every key with the others masked, up to float64's rounding (the sums run over fewer
    zeros), on chunks of several rows; rows that see no key give 0 and LSE -inf as before."""
    monkeypatch.setattr(reference_module, "_chunk_rows", lambda heads, s: 7)
    monkeypatch.setattr(reference_module, "SPAN_STEP", 4)
    q, k, v = qkv(*ts, 8, heads=(2, 1), b=2, seed=11, spread=3.0)
    spanned = reference(q, k, v, **kw)
    monkeypatch.setattr(reference_module, "key_span", lambda band, i0, i1, s: (0, s))
    full = reference(q, k, v, **kw)
    for a, b in zip(spanned, full, strict=True):
        finite = np.isfinite(b)
        assert np.array_equal(np.isfinite(a), finite) and np.array_equal(a[~finite], b[~finite])
        scale = np.abs(b[finite]).max()  # O's entries cancel: an error of the row's size
        assert np.abs(a[finite] - b[finite]).max() <= 8 * np.finfo(np.float64).eps * scale


def test_fused_reference_edges():
    """No keys at all; one key; one query; many heads on one kv head."""
    for b, hq, hk, t, s in ((1, 2, 1, 4, 0), (1, 1, 1, 5, 1), (2, 2, 2, 1, 30), (1, 33, 1, 3, 70)):
        same_reference(*qkv(t, s, 4, dv=2, heads=(hq, hk), b=b, seed=s), causal=s > 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (4, 2)]), st.integers(1, 60),
       st.integers(1, 60), st.integers(1, 9), st.booleans(),
       st.sampled_from([None, (0, 0), (5, -1), (-1, 2)]), st.integers(0, 10**6))
def test_fused_reference_on_random_inputs(b, heads, t, s, d, causal, window, seed):
    hq, hk = heads
    same_reference(*qkv(t, s, d, dv=3, heads=(hq, hk), b=b, seed=seed, spread=1 + seed % 4),
                   causal=causal, window=window)
