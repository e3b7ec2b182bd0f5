"""FlexAttention's score_mod and mask_mod (flash/mods.py) through every loop: the fixed
options equal their mod forms bit for bit, the block mask's kinds (full / partial / skip) are
counted and only partial tiles are masked, the backward differentiates through a score_mod
(exactly for the built-ins and a grad companion, by finite differences otherwise, and says
which), the reference and check take them, and a function written for scalars is refused."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import qkv
from osm_cli.errors import InputError, OsmError
from osm_cli.flash import mods
from osm_cli.flash.backward import attention_backward
from osm_cli.flash.forward import attention
from osm_cli.flash.options import ScoreOptions, alibi_auto
from osm_cli.flash.reference import reference, reference_backward
from osm_cli.precision.check import check
from osm_cli.precision.kernels import run_flash
from osm_cli.precision.model import model

B, H, HK, T, D = 2, 4, 2, 100, 8
DOCS = np.repeat([0, 1, 2, 3], [1, 40, 29, 30])  # uneven packed documents, one of length 1


def _same(a, b):
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)


KEEP = np.random.default_rng(7).random((B, H, T, T)) < 0.8  # an attn_mask, True = attend


def kept(b, h, q_idx, kv_idx):
    """KEEP as a mask_mod."""
    return KEEP[b, h, q_idx, kv_idx]


FIXED = {  # the fixed options and their mod forms (FlexAttention's causal is top-left)
    "causal": ({"causal": True, "causal_align": "top-left"}, {"mask_mod": mods.causal()}),
    "mask": ({"mask": KEEP}, {"mask_mod": kept}),
    "causal, window and mask": (
        {"causal": True, "causal_align": "top-left", "window": (10, 0), "mask": KEEP},
        {"mask_mod": [mods.sliding(10), kept]}),
    "window": ({"causal": True, "causal_align": "top-left", "window": (10, 0)},
               {"mask_mod": mods.sliding(10)}),
    "softcap": ({"softcap": 2.0}, {"score_mod": mods.softcap(2.0)}),
    "alibi": ({"causal": True, "alibi_slopes": alibi_auto(H)},
              {"score_mod": mods.alibi(alibi_auto(H)), "mask_mod": mods.causal()}),
}


@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_options_equal_their_mod_forms(name):
    """Forward (osm's loop and the fused one), backward and reference: the same bits, and the
    same tiles skipped; under the mod form the band's partial tiles are the mask_mod's."""
    q, k, v, do = qkv(T, T, D, heads=(H, HK), b=B, do=True)
    fixed, mod = FIXED[name]
    for fused in (True, False):
        a = attention(q, k, v, block_q=16, block_k=16, fused=fused, **fixed)
        b = attention(q, k, v, block_q=16, block_k=16, fused=fused, **mod)
        _same(a, b)
        assert (a.tiles.computed, a.tiles.skipped) == (b.tiles.computed, b.tiles.skipped)
    ga = attention_backward(q, k, v, do, block_q=16, block_k=16, **fixed)
    gb = attention_backward(q, k, v, do, block_q=16, block_k=16, **mod)
    for x, y in zip((ga.dq, ga.dk, ga.dv), (gb.dq, gb.dk, gb.dv), strict=True):
        assert np.allclose(x, y, rtol=0, atol=1e-13)
    ra, rb = reference(q, k, v, ScoreOptions(**fixed)), reference(q, k, v, ScoreOptions(**mod))
    assert np.array_equal(ra[0], rb[0])
    if name in ("causal", "window", "alibi"):
        assert b.tiles.partial == 7 + (6 if name == "window" else 0)  # the diagonal (+ edge)


def test_document_mask_block_kinds_are_counted_and_only_partial_tiles_masked():
    """Packed documents 1, 40, 29, 30 long and causal, tiles of 16: of the 7 × 7 tiles, those
    past the diagonal or between documents are skipped, those inside one document and below
    the diagonal full, the rest partial; the traced row's steps carry the kind."""
    q, k, v, _ = qkv(T, T, D, heads=(H, HK), b=B, do=True)
    mm = [mods.document(DOCS), mods.causal()]
    res = attention(q, k, v, mask_mod=mm, block_q=16, block_k=16, trace_at=(0, 0, 60))
    seen = DOCS[:, None] == DOCS[None, :]
    seen &= np.tri(T, dtype=bool)
    kinds = {"skip": 0, "full": 0, "partial": 0}
    for i0 in range(0, T, 16):
        for j0 in range(0, T, 16):
            tile = seen[i0:i0 + 16, j0:j0 + 16]
            kinds["full" if tile.all() else "partial" if tile.any() else "skip"] += 1
    assert kinds == {"skip": 33, "full": 1, "partial": 15}
    assert (res.tiles.skipped, res.tiles.computed - res.tiles.partial, res.tiles.partial) == (
        kinds["skip"], kinds["full"], kinds["partial"])
    # row 60 is in the document at 41:70: K/V tiles 2 (keys 41:48 of 32:48) and 3 (causal)
    assert [(st.block, st.kind) for st in res.trace.steps if not st.masked] == [
        (2, "partial"), (3, "partial")]
    ref, lse = reference(q, k, v, ScoreOptions(mask_mod=mm))
    assert np.allclose(res.out, ref, rtol=0, atol=1e-14)


def test_backward_through_a_score_mod_exact_grad_companion_or_differences():
    """softcap as a built-in (exact), as a user function with a grad companion (exact) and
    without one (central differences: within 1e-9 of the exact gradients); the record says
    which; the tiled backward agrees with the reference's to 1e-13."""
    q, k, v, do = qkv(T, T, D, heads=(H, HK), b=B, seed=1, do=True)
    mm = [mods.document(DOCS), mods.causal()]

    def capped(score, b, h, q_idx, kv_idx):
        return 2.0 * np.tanh(score / 2.0)

    def with_grad(score, b, h, q_idx, kv_idx):
        return 2.0 * np.tanh(score / 2.0)

    with_grad.grad = lambda score, b, h, q_idx, kv_idx: 1.0 - np.tanh(score / 2.0) ** 2
    exact = reference_backward(q, k, v, do, ScoreOptions(score_mod=mods.softcap(2.0),
                                                          mask_mod=mm))
    for fn, how, tol in ((with_grad, "exact", 1e-14), (capped, "finite differences", 1e-9)):
        tiled = attention_backward(q, k, v, do, score_mod=fn, mask_mod=mm, block_q=16,
                                   block_k=32)
        assert f"score_mod {fn.__name__} ({how} derivative)" in tiled.options.mods
        ref = reference_backward(q, k, v, do, ScoreOptions(score_mod=fn, mask_mod=mm))
        for x, y, z in zip((tiled.dq, tiled.dk, tiled.dv), ref, exact, strict=True):
            assert np.allclose(x, y, rtol=0, atol=1e-13)
            assert np.allclose(y, z, rtol=0, atol=tol)


def test_relative_bias_prefix_lm_and_chunked_against_a_dense_mask():
    """The built-ins as the dense bias and mask they stand for, through the reference."""
    q, k, v, _ = qkv(T, T, D, heads=(H, HK), b=B, seed=2, do=True)
    rng = np.random.default_rng(5)
    table = rng.standard_normal((H, 2 * T - 1))
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    bias = table[:, i - j + T - 1]  # (H, T, T)
    dense = ((j < 7) | (i >= j)) & (i // 20 == j // 20)
    got = attention(q, k, v, score_mod=mods.relative_bias(table), block_q=32, block_k=16,
                    mask_mod=[mods.prefix_lm(7), mods.chunked(20)])
    want = reference(q, k, v, ScoreOptions(mask=np.where(dense, bias, -np.inf)[None]))
    assert np.allclose(got.out, want[0], rtol=0, atol=1e-13)


@pytest.mark.parametrize("fn, says", [
    (lambda s, b, h, q, kv: s if q > kv else 0 * s, "must take numpy arrays"),
    (lambda s, b, h, q, kv: float(s), "must take numpy arrays"),
    (lambda s, b, h, q, kv: s[..., :1, :1, :2], "returned shape"),
    ("softcap", "must be a function"),
])
def test_a_score_mod_for_scalars_is_refused_with_its_error(fn, says):
    with pytest.raises(InputError, match=says):
        ScoreOptions(score_mod=fn)


def test_a_mask_mod_must_return_booleans():
    with pytest.raises(InputError, match="must return booleans"):
        ScoreOptions(mask_mod=lambda b, h, q, kv: q - kv)
    with pytest.raises(InputError, match=r"raised .*truth value"):
        ScoreOptions(mask_mod=lambda b, h, q, kv: q >= kv and h == 0)


def test_check_passes_a_mods_output_and_fails_a_wrong_mask():
    """check with the score_mod and mask_mod: the bf16-rounded reference PASSes (out, LSE and
    gradients); judged without the document mask it FAILs. fa2 refuses a score_mod (FA2 has none):
    the model beside runs osm's own loop."""
    bf = ml_dtypes.bfloat16
    q, k, v, do = (x.astype(np.float32)
                   for x in qkv(T, T, D, heads=(H, HK), b=B, seed=3, dtype=bf, do=True))
    mm = [mods.document(DOCS), mods.causal()]
    opts = ScoreOptions(score_mod=mods.softcap(2.0), mask_mod=mm)
    out, lse = reference(q, k, v, opts)
    dq, dk, dv = reference_backward(q, k, v, do, opts)
    rep = check(out.astype(bf), q, k, v, "bf16", lse=lse, do=do, dq=dq.astype(bf),
                dk=dk.astype(bf), dv=dv.astype(bf), opts=opts)
    assert rep.verdict.passed and len(rep.grads) == 3 and all(g.rule.passed for g in rep.grads)
    assert rep.kernel == "tiles"
    wrong = check(out.astype(bf), q, k, v, "bf16", lse=lse,
                  opts=ScoreOptions(score_mod=mods.softcap(2.0), mask_mod=mods.causal()))
    assert not wrong.verdict.passed
    with pytest.raises(OsmError, match="score_mod runs in osm's own loop"):
        run_flash(model("bf16"), q, k, v, kernel="fa2", opts=opts)


def test_the_tile_map_and_the_plot_show_the_three_kinds():
    """kind_map asks the forward's own walk: the document mask's 33 skipped, 15 partial and 1
    full tiles; the plotted head's probabilities apply the score_mod and mask_mod (rows sum to
    1, hidden keys 0) and its partial tiles are the walk's."""
    from osm_cli.studies.tilemap import head_probabilities, kind_map

    q, k, v, _ = qkv(T, T, D, heads=(H, HK), b=B, do=True)
    mm = [mods.document(DOCS), mods.causal()]
    kinds = kind_map(q, k, block_q=16, block_k=16, mask_mod=mm)
    assert {n: int((kinds == n).sum()) for n in ("skip", "partial", "full")} == {
        "skip": 33, "partial": 15, "full": 1}
    hm = head_probabilities(q, k, batch=1, head=3, block_q=16, block_k=16,
                            score_mod=mods.softcap(2.0), mask_mod=mm)
    assert np.array_equal(hm.partial, kinds == "partial") and np.array_equal(hm.skip,
                                                                             kinds == "skip")
    seen = (DOCS[:, None] == DOCS[None, :]) & np.tri(T, dtype=bool)
    assert np.array_equal(hm.masked, ~seen) and np.allclose(hm.p.sum(-1), 1, rtol=0, atol=1e-12)
    ref, _ = reference(q, k, v, ScoreOptions(score_mod=mods.softcap(2.0), mask_mod=mm))
    assert np.allclose(hm.p @ v[1, 1], ref[1, 3], rtol=0, atol=1e-12)  # head 3 reads kv head 1


@pytest.mark.parametrize("kernel", ["fa2", "fa4", "fa4-sm100"])
def test_presets_run_a_mask_mod(kernel):
    """A kernel preset's emulation under mask_mod causal against its own causal band (top-left):
    the same tiles skipped and masked, outputs within float32 rounding (the kernel's schedule,
    FA2's split-KV and tile width, knows a causal band but not a mask_mod), the traced steps
    marked full or partial."""
    bf = ml_dtypes.bfloat16
    q, k, v, _ = (x.astype(np.float32)
                  for x in qkv(300, 300, D, heads=(H, HK), b=B, seed=4, dtype=bf, do=True))
    kw = dict(kernel=kernel, trace_at=(1, 2, 200), block_k=64)
    band = run_flash(model("bf16"), q, k, v, causal=True, causal_align="top-left", **kw)
    mod = run_flash(model("bf16"), q, k, v, mask_mod=mods.causal(), **kw)
    assert np.allclose(band.out, mod.out, rtol=0, atol=1e-6)
    assert np.allclose(band.lse, mod.lse, rtol=0, atol=1e-5)
    assert (band.tiles.computed, band.tiles.skipped) == (mod.tiles.computed, mod.tiles.skipped)
    assert mod.tiles.partial == band.tiles.partial > 0
    kinds = [s.kind for s in mod.trace.steps if not s.masked and not s.sink]
    assert "partial" in kinds and set(kinds) <= {"full", "partial"}  # FA visits them last first


def _bf16_inputs(seed: int, t: int = 300):
    bf = ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal((B, h, t, 64)) * sd).astype(bf).astype(np.float32)
                 for h, sd in ((H, 2.0), (HK, 2.0), (HK, 1.0)))


@pytest.mark.parametrize("kernel", ["fa4", "fa4-sm100"])
def test_fa4_runs_a_score_mod_against_the_float64_reference(kernel):
    """FA4 applies a score_mod to S·scale in float32, then its mask (flash_attn/cute's
    apply_score_mod_inner); its preset does the same: a relative bias with a document and a
    causal mask_mod at N = 300 (not a multiple of 128) is within twice the error of osm's
    float64 reference rounded to bf16 (FlashAttention's test rule), LSE within 2e-4, and so is
    softcap; a reference with the opposite bias is far off. fa2 has no score_mod and refuses
    one."""
    q, k, v = _bf16_inputs(5)
    docs = np.repeat([0, 1, 2], [1, 150, 149])
    table = np.linspace(-1.0, 1.0, H * (2 * 300 - 1)).reshape(H, -1)
    for score_mod in (mods.relative_bias(table), mods.softcap(3.0)):
        opts = ScoreOptions(score_mod=score_mod, mask_mod=[mods.document(docs), mods.causal()])
        got = run_flash(model("bf16"), q, k, v, kernel=kernel, opts=opts, trace_at=(1, 3, 200))
        ref, lse = reference(q, k, v, opts)
        rounded = np.abs(ref.astype(ml_dtypes.bfloat16).astype(np.float64) - ref).max()
        assert np.abs(got.out - ref).max() <= 2 * rounded  # FlashAttention's own rule
        assert np.abs(got.lse - lse).max() < 2e-4
        assert got.options.kernel == kernel
        assert got.options.mods.startswith(f"score_mod {score_mod.name}")
        assert got.tiles.partial > 0 and got.tiles.skipped > 0
        assert any(s.kind == "partial" for s in got.trace.steps)
    other = reference(q, k, v, ScoreOptions(score_mod=mods.relative_bias(-table),
                                            mask_mod=[mods.document(docs), mods.causal()]))[0]
    assert np.abs(got.out - other).max() > 0.1
    with pytest.raises(OsmError, match="score_mod runs in osm's own loop"):
        run_flash(model("bf16"), q, k, v, kernel="fa2", score_mod=mods.softcap(3.0))
    with pytest.raises(OsmError, match="a softcap or a score_mod, not both"):
        run_flash(model("bf16"), q, k, v, kernel=kernel, softcap=3.0,
                  score_mod=mods.softcap(3.0))


@pytest.mark.parametrize("kernel", ["fa4", "fa4-sm100"])
def test_fa4s_softcap_is_its_softcap_score_mod(kernel):
    """FA4 builds `softcap` as a score_mod, so the built-in softcap:C on its preset is its
    softcap bit for bit (the GPU's tanh included), reported as the score_mod; a user's own
    C·tanh(s / C) runs numpy's tanh: most outputs identical, none off by more than bf16's ulp at
    the largest output."""
    q, k, v = _bf16_inputs(6)
    fixed = run_flash(model("bf16"), q, k, v, kernel=kernel, softcap=3.0, causal=True)
    builtin = run_flash(model("bf16"), q, k, v, kernel=kernel, causal=True,
                        score_mod=mods.softcap(3.0))
    assert np.array_equal(fixed.out, builtin.out) and np.array_equal(fixed.lse, builtin.lse)
    assert (builtin.options.softcap, fixed.options.softcap) == (None, 3.0)
    assert builtin.options.mods.startswith("score_mod softcap:3")

    def cap(score, b, h, q_idx, kv_idx):
        return 3.0 * np.tanh(score / 3.0)

    user = run_flash(model("bf16"), q, k, v, kernel=kernel, causal=True, score_mod=cap)
    assert (user.out == fixed.out).mean() > 0.9  # the GPU's tanh and numpy's differ in a few
    assert np.abs(user.out - fixed.out).max() <= 2.0**-7 * np.abs(fixed.out).max()


def test_a_mask_mod_joins_a_float_attn_mask_in_every_loop():
    """masks.with_mask_mod is where an attn_mask meets a mask_mod: a float mask (an added
    bias) with a document mask_mod is, in the fused and textbook forward, the backward and
    the reference, the float mask with −inf where the mask_mod hides a key, bit for bit; a
    boolean one is and-ed (the fixed forms above)."""
    from osm_cli.flash.masks import with_mask_mod

    q, k, v, do = qkv(T, T, D, heads=(H, HK), b=B, seed=8, do=True, stream=True)
    bias = np.random.default_rng(9).standard_normal((T, T))
    seen = DOCS[:, None] == DOCS[None, :]
    joined = np.where(seen, bias, -np.inf)
    assert np.array_equal(with_mask_mod(bias, seen), joined)
    assert np.array_equal(with_mask_mod(KEEP, seen), KEEP & seen)
    assert with_mask_mod(None, seen) is seen and with_mask_mod(bias, None) is bias
    mod, fixed = {"mask": bias, "mask_mod": mods.document(DOCS)}, {"mask": joined}
    for fused in (True, False):
        _same(attention(q, k, v, block_q=16, block_k=16, fused=fused, **mod),
              attention(q, k, v, block_q=16, block_k=16, fused=fused, **fixed))
    ga = attention_backward(q, k, v, do, block_q=16, block_k=16, **mod)
    gb = attention_backward(q, k, v, do, block_q=16, block_k=16, **fixed)
    for x, y in zip((ga.dq, ga.dk, ga.dv), (gb.dq, gb.dk, gb.dv), strict=True):
        assert np.array_equal(x, y)
    ra, rb = reference(q, k, v, ScoreOptions(**mod)), reference(q, k, v, ScoreOptions(**fixed))
    assert np.array_equal(ra[0], rb[0]) and np.array_equal(ra[1], rb[1])


@pytest.mark.parametrize("kernel", ["fa2", "fa4"])
def test_presets_take_an_attn_mask_and_its_mask_mod_alike(kernel):
    """A kernel preset's loop masks through the same join: an attn_mask with a window, and the
    mask_mod holding both, give the same bits (the walk's kinds differ: the mask_mod's partial
    tiles are where a key is hidden, the attn_mask's tiles count as full)."""
    bf = ml_dtypes.bfloat16
    drawn = qkv(T, T, D, heads=(H, HK), b=B, seed=10, do=True, stream=True)
    q, k, v, _ = (x.astype(bf).astype(np.float32) for x in drawn)

    def window(b, h, q_idx, kv_idx):
        return np.abs(q_idx - kv_idx) <= 20

    kw = dict(kernel=kernel, block_k=32, trace_at=None)
    a = run_flash(model("bf16"), q, k, v, mask=KEEP, window=(20, 20), **kw)
    b = run_flash(model("bf16"), q, k, v, mask_mod=[kept, window], **kw)
    assert np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
    assert (a.tiles.computed, a.tiles.skipped) == (b.tiles.computed, b.tiles.skipped)
