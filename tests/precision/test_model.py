"""precision/'s kernel model: rounding to each dtype, the FA rule, plain attention, FA2's plan.

The real-kernel numbers come from samples/kernel_fp16.npz and kernel_bf16.npz: PyTorch's
FlashAttention-2 kernel on an H200 (benchmarks/real_kernel.py), causal, t = s = 1024, d = 64,
sliced to batch 0, heads 0-1, the first 256 queries and keys (a causal row i < 256 sees only
those keys, so the slice is exactly what the kernel computed for it).
"""

from __future__ import annotations

import importlib
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import qkv
from osm_cli.errors import OsmError, ShapeError
from osm_cli.flash.forward import attention
from osm_cli.precision.dtypes import DTYPES, carrier, has_inf, round_inputs, round_to, rounding, ulp
from osm_cli.precision.kernels import fa2_plan, run_flash
from osm_cli.precision.lowtrace import trace_in
from osm_cli.precision.model import model, plain, run_naive
from osm_cli.precision.rule import fa_rule, lse_errors, lse_rule
from osm_cli.studies.overflow import overflow_demo

att = importlib.import_module("osm_cli.flash.reference")
F16, BF16 = DTYPES["float16"], DTYPES["bfloat16"]
E4M3, E5M2 = DTYPES["float8_e4m3fn"], DTYPES["float8_e5m2"]


# ---------------------------------------------------------------------------------------------
# Rounding


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_round_to_is_ml_dtypes_astype(name):
    """Every dtype rounds exactly as ml_dtypes / numpy astype does, subnormals and ties included."""
    dt = DTYPES[name]
    rng = np.random.default_rng(7)
    fi = ml_dtypes.finfo(dt)
    tiny = float(fi.smallest_subnormal)
    x = np.concatenate([
        rng.standard_normal(2000) * 3,
        rng.uniform(-4, 4, 500) * tiny,  # subnormals and values that underflow
        np.arange(-64, 65) * tiny / 2,  # exact ties between subnormals
    ]).astype(np.float32)
    expected = x.astype(dt).astype(np.float32)
    got = round_to(x, dt)
    assert got.dtype == carrier(dt)
    np.testing.assert_array_equal(got.astype(np.float32), expected)


def test_round_to_worked_values():
    assert round_to(np.array([1 / 3]), BF16).tolist() == [0.333984375]
    # 1 + 2^-11 is the tie between 1 and 1 + 2^-10 in float16: nearest even is 1
    assert round_to(np.array([1 + 2**-11, 1 + 3 * 2**-11]), F16).tolist() == [1.0, 1 + 2**-9]
    # half the smallest float16 subnormal (2^-25) rounds to 0, a bit more to 2^-24
    assert round_to(np.array([2.0**-25, 2.0**-25 * 1.01]), F16).tolist() == [0.0, 2.0**-24]
    over = round_to(np.array([70000.0, 500.0, 60000.0]), F16)
    assert over[0] == np.inf and over[1] == 500 and over[2] == 60000
    assert np.isnan(round_to(np.array([500.0]), E4M3)).all()  # no inf in e4m3fn
    assert round_to(np.array([500.0, 70000.0]), E5M2).tolist() == [512.0, np.inf]


def test_has_inf_and_carrier():
    assert [has_inf(DTYPES[n]) for n in ("float16", "bfloat16", "float8_e4m3fn",
                                             "float8_e5m2")] == [True, True, False, True]
    assert carrier(F16) == np.float32 and carrier(DTYPES["float64"]) == np.float64


def test_ulp():
    assert float(ulp(1.0, F16)) == 2.0**-10
    assert float(ulp(300.0, BF16)) == 2.0
    assert float(ulp(0.75, F16)) == 2.0**-11
    assert float(ulp(0.0, F16)) == 2.0**-24  # below the normals: the subnormal spacing
    assert float(ulp(1.0, E4M3)) == 0.125


def test_rounding_record_counts():
    x = np.array([1.0, 1 / 3, 70000.0, 1e-9, 0.0, -np.inf])
    r = rounding("Q", x, round_to(x, F16))
    assert (r.size, r.changed, r.overflowed, r.underflowed) == (6, 3, 1, 1)
    assert r.max_abs_change == pytest.approx(abs(float(np.float16(1 / 3)) - 1 / 3))


def test_round_inputs_refuses_overflow_and_non_finite():
    with pytest.raises(OsmError) as info:
        round_inputs({"Q": np.ones(3), "K": np.array([1.0, 7e4, 2.0])}, F16)
    assert str(info.value) == ("K: 1 value(s) overflow float16 (largest finite 65504), the first "
                               "70000 at index (1,); scale the inputs or pick a wider `dtype`")
    with pytest.raises(OsmError, match=r"^V holds nan at index \(0, 1\)"):
        round_inputs({"V": np.array([[1.0, np.nan]])}, BF16)


# ---------------------------------------------------------------------------------------------
# Models


def test_model_defaults_and_errors():
    m = model("bf16")
    assert (m.name, m.precision, m.accum) == ("bfloat16", "flash", np.dtype(np.float32))
    assert m.p_round is not None
    assert model("fp32").p_round is None and model("fp64").accum == np.float64
    assert model("fp16", accum="float64").accum == np.float64
    with pytest.raises(OsmError, match="accumulation must be float32 or float64"):
        model("fp16", accum="bf16")
    with pytest.raises(OsmError, match="precision must be one of flash, naive"):
        model("fp16", "fast")
    assert "P rounded to bfloat16 before P·V" in m.describe()


def test_flash_model_rounds_p_and_output():
    """P is rounded before P·V: with one key of V = 1 the output is round(p)/l, then rounded."""
    q = np.zeros((1, 4))
    k = np.zeros((3, 4))
    v = np.array([[1.0], [0.0], [0.0]])
    res = run_flash(model("bf16"), q, k, v, trace_at=None)
    assert res.out.dtype == np.float32 and res.lse.dtype == np.float32
    assert res.out.tolist() == [[0.333984375]]  # 1/3 in bfloat16
    assert float(res.lse[0]) == pytest.approx(math.log(3), abs=1e-7)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 9), s=st.integers(1, 9), d=st.integers(1, 5), causal=st.booleans(),
       bq=st.integers(1, 4), bk=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_float64_model_is_the_plain_float64_path(t, s, d, causal, bq, bk, seed):
    """--dtype float64 is attention() itself, bit for bit; naive float64 is the reference."""
    q, k, v = qkv(t, s, d, dv=2, seed=seed, stream=True)
    kw = dict(causal=causal, block_q=bq, block_k=bk, trace_at=None)
    tiled = attention(q, k, v, **kw)
    flash = run_flash(model("float64"), q, k, v, **kw)
    np.testing.assert_array_equal(flash.out, tiled.out)
    np.testing.assert_array_equal(flash.lse, tiled.lse)
    ref, ref_lse = att.reference(q, k, v, causal=causal)
    pt, pt_lse = plain(q, k, v, DTYPES["float64"], causal=causal)
    np.testing.assert_allclose(pt, ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(pt_lse[np.isfinite(ref_lse)], ref_lse[np.isfinite(ref_lse)],
                               atol=1e-13)


def test_plain_rounds_each_op_like_pytorch():
    """plain(fp16) = round(round(round(q·scale)·Kᵀ) softmax, round(P·V)), float32 inside."""
    q, k, v = (x.astype(np.float32) for x in qkv(5, 5, 8, dtype=np.float16, seed=3, stream=True))

    def r(x):
        return x.astype(np.float16).astype(np.float32)

    s = r(r(q * np.float32(1 / math.sqrt(8))) @ k.T)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    expected = r(r(e / e.sum(axis=1, keepdims=True)) @ v)
    out, lse = plain(q, k, v, F16)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_allclose(lse, np.log(np.exp(s.astype(np.float64)).sum(axis=1)), rtol=1e-6)


def test_plain_takes_the_references_edge_cases():
    """plain is the reference with each op rounded: no keys gives O 0 and LSE -inf, and a mask
    that does not broadcast is a ShapeError naming it, as for the float64 reference."""
    q, k, v = np.ones((3, 4)), np.ones((0, 4)), np.ones((0, 2))
    out, lse = plain(q, k, v, F16)
    ref, ref_lse = att.reference(q, k, v)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(lse, ref_lse)
    assert lse.tolist() == [-np.inf] * 3 and out.dtype == np.float32
    q, k, v = np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2))
    bad = np.ones((2, 5), dtype=bool)
    with pytest.raises(ShapeError, match=r"^mask of shape \(2, 5\) does not broadcast"):
        plain(q, k, v, BF16, mask=bad)


def test_naive_model_is_plain_attention_with_the_run_record():
    q, k, v = qkv(6, 6, 4, heads=(2, 2), seed=4, stream=True)
    m = model("fp16", "naive")
    res = run_naive(m, q, k, v, causal=True, trace_at=(0, 1, 2))
    out, _ = plain(q, k, v, F16, causal=True)
    np.testing.assert_array_equal(res.out, out)
    np.testing.assert_array_equal(res.trace.out, out[1, 2])
    assert (res.tiles.computed, res.options.one_shot) == (0, True)


# ---------------------------------------------------------------------------------------------
# The verdict: FlashAttention's rule


REF = np.array([[1.0, 0.5], [0.25, -2.0]])
PT = REF + np.array([[2.0**-10, 0], [0, 0]])  # plain attention one float16 ulp off at 1.0


def test_rule_numbers_on_a_constructed_case():
    """bound = 2·2^-10 (pt) + 2·2^-12 ((0.25 + 0.3 − 0.3) in float16 is 2^-12 off) = 0.00244."""
    r = fa_rule(REF, REF, PT, F16)
    assert (r.err, r.pt_err, r.rounding) == (0.0, 2.0**-10, 2.0**-12)
    assert r.bound == 2 * 2.0**-10 + 2 * 2.0**-12 == 0.00244140625
    assert r.passed


@pytest.mark.parametrize("off, passed", [(2.0**-9, True), (2.0**-8, False), (2.0**-5, False)])
def test_rule_passes_within_the_bound_and_fails_beyond(off, passed):
    out = REF.copy()
    out[1, 1] += off
    r = fa_rule(out, REF, PT, F16)
    assert r.err == off and r.passed is passed


def test_rule_fails_nan_and_inf_outputs():
    for bad in (np.nan, np.inf):
        out = REF.copy()
        out[0, 1] = bad
        assert not fa_rule(out, REF, PT, F16).passed


def test_rule_when_plain_attention_overflowed():
    pt = PT.copy()
    pt[0, 0] = np.nan
    r = fa_rule(REF, REF, pt, F16)
    # the bound stays finite (issue 19): without a model, the dtype's rounding stands in
    assert r.passed and math.isfinite(r.bound) and "overflowed" in r.note
    assert r.stand_in == "rounding" and r.bound == 4 * r.rounding
    out = REF.copy()
    out[0, 0] += 1.0
    assert not fa_rule(out, REF, pt, F16).passed  # an inf bound passed this


def test_rule_in_float64_uses_a_tolerance():
    f64 = DTYPES["float64"]
    assert fa_rule(REF + 1e-13, REF, REF, f64).passed
    r = fa_rule(REF + 1e-9, REF, REF, f64)
    assert not r.passed and r.bound == pytest.approx(2e-12) and r.note.startswith("float64")


def test_lse_errors_accept_every_masked_convention():
    ref = np.array([-np.inf, -np.inf, -np.inf, -np.inf, 1.0])
    lse = np.array([-np.inf, np.inf, 0.0, 5.0, 1.5])
    assert lse_errors(lse, ref).tolist() == [0.0, 0.0, 0.0, np.inf, 0.5]


def test_lse_rule():
    ref = np.array([1.0, 2.0])
    r = lse_rule(ref + [1e-6, 0], ref, ref + [0, 1e-3])
    assert r.passed and r.pt_err == pytest.approx(1e-3) and r.err == pytest.approx(1e-6)
    assert not lse_rule(ref + [0.01, 0], ref, ref + [0, 1e-3]).passed


# ---------------------------------------------------------------------------------------------
# FA2's schedule, and the real kernel


@pytest.mark.parametrize("shape, plan", [
    ((1, 8, 1024, 1024, 64), (64, 256, 2)),
    ((2, 4, 512, 2048, 128), (64, 128, 4)),
    ((1, 8, 2048, 2048, 32), (128, 128, 1)),
    ((1, 4, 4096, 4096, 96), (128, 64, 1)),
    ((1, 1, 1, 8192, 128), (64, 128, 64)),  # decoding: one query row, many key blocks
])
def test_fa2_plan(shape, plan):
    assert fa2_plan(*shape) == plan


@pytest.mark.parametrize("causal", [False, True])
def test_fa2_schedule_with_splits_is_still_attention(causal):
    """The fa2 preset's split-KV run (three key ranges, merged in float32) against its unsplit
    run (sms=1: one wave fills the GPU, no split) and the reference, in bf16 (presets take
    16-bit inputs): both within ~1 bf16 ulp of the row's largest |O| of the reference, the two
    runs within 1 ulp of each other (the merge's extra rounding), their LSEs within 1e-6.
    Causal top-left rows see only the first range's keys: split and unsplit are identical."""
    m = model("bf16")
    drawn = qkv(40, 700, 8, heads=(2, 2), b=1, seed=5, stream=True)
    (q, k, v), _ = round_inputs(dict(zip("QKV", drawn, strict=True)), m.dtype)
    assert fa2_plan(1, 2, 40, 700, 8)[2] == 3
    kw = dict(kernel="fa2", trace_at=None, causal=causal, causal_align="top-left")
    split = run_flash(m, q, k, v, **kw)
    whole = run_flash(m, q, k, v, sms=1, **kw)
    assert (split.options.splits, whole.options.splits) == (3, 1)
    ref, ref_lse = att.reference(q, k, v, causal=causal, causal_align="top-left")
    u = ulp(np.abs(ref).max(axis=-1, keepdims=True), BF16)
    assert np.abs(split.out - ref).max() <= 1.1 * u.max()
    assert (np.abs(split.out - ref) / u).max() <= 1.1
    assert (np.abs(whole.out - ref) / u).max() <= 1.1
    assert (np.abs(split.out - whole.out) / u).max() <= 1.0
    if causal:
        np.testing.assert_array_equal(split.out, whole.out)
    np.testing.assert_allclose(split.lse, ref_lse, atol=1e-6)
    np.testing.assert_allclose(whole.lse, ref_lse, atol=1e-6)


def _kernel_sample(tag):
    z = np.load(f"samples/kernel_{tag}.npz")
    return tuple(z[n] for n in ("q", "k", "v", "out", "lse"))


@pytest.mark.parametrize("tag, name, kernel_err", [
    ("fp16", "float16", 0.0008381565434376625), ("bf16", "bfloat16", 0.007129179513856609)])
def test_model_tracks_the_real_kernel(tag, name, kernel_err):
    """The flash model errs as much as FA2 did (ratio 1.0) and sits within 1 ulp of its output.

    The kernel ran these 256 keys as one 256-wide tile (its split-KV kernel for d = 64), so the
    model runs block_k = 256: then fewer than 1 % of the elements differ at all.
    """
    q, k, v, o, lse = _kernel_sample(tag)
    m = model(name)
    qr, kr, vr = (x.astype(np.float32) for x in (q, k, v))
    ref, _ = att.reference(qr, kr, vr, causal=True)
    res = run_flash(m, qr, kr, vr, causal=True, trace_at=None, block_k=256)
    o64 = o.astype(np.float64)
    assert float(np.abs(o64 - ref).max()) == kernel_err
    ratio = float(np.abs(res.out - ref).max()) / kernel_err
    assert 0.8 <= ratio <= 1.25
    assert ratio == 1.0
    diff = np.abs(res.out - o64)
    row_ulps = diff / ulp(np.abs(o64).max(axis=-1, keepdims=True), m.dtype)
    assert float(row_ulps.max()) <= 1.0
    assert float(np.mean(diff > 0)) < 0.01
    assert float(np.abs(res.lse - lse).max()) < 2e-6


# ---------------------------------------------------------------------------------------------
# trace and overflow-demo in a dtype


def test_trace_in_bfloat16_naive_holds_everything_in_bfloat16():
    """[2, 4] then [1, 3] in bfloat16: l = e^-2 + 1 = 1.1328125 there (1.1353353 exactly)."""
    lt = trace_in(np.array([2.0, 4.0, 1.0, 3.0]), model("bf16", "naive"), 2)
    assert [s.l for s in lt.trace.steps] == [1.1328125, 1.546875]
    assert lt.probabilities.tolist() == [0.087890625, 0.64453125, 0.0322265625, 0.2373046875]
    assert float(lt.max_diff[0]) == pytest.approx(0.000746, abs=1e-6)


def test_trace_in_flash_rounds_only_p():
    lt = trace_in(np.array([2.0, 4.0, 1.0, 3.0]), model("bf16"), 2)
    assert lt.trace.steps[1].l == pytest.approx(1.5530018, abs=1e-6)  # float32 state
    assert lt.probabilities.tolist() == [0.0869140625, 0.64453125, 0.031982421875, 0.2373046875]


def test_trace_in_marks_overflow_and_underflow():
    lt = trace_in(np.array([4.0, 30.0, 70000.0]), model("fp16", "naive"), 1)
    assert lt.rounding.overflowed == 1
    assert np.isnan(lt.probabilities).all()  # +inf in a softmax
    lt = trace_in(np.array([4.0, 30.0]), model("fp16", "naive"), 1)
    assert lt.alpha_underflowed == (1,)  # exp(4 − 30) = 5e-12 is 0 in float16
    assert lt.p_underflowed == 1
    with pytest.raises(OsmError, match="float8_e4m3fn has no -inf"):
        trace_in(np.array([1.0]), model("e4m3", "naive"))


def test_overflow_demo_in_float8():
    demo = overflow_demo(dtypes=("float8_e4m3fn", "float8_e5m2"))
    e4m3, e5m2 = demo.rows
    assert e4m3.held.tolist() == [96, 104, 96] and e5m2.held.tolist() == [96, 96, 96]
    assert np.isnan(e4m3.exp).all() and np.isinf(e5m2.exp).all()
    assert e4m3.online.tolist() == [0, 1, 0]  # exp(-8) underflows e4m3fn
    assert e5m2.stable.tolist() == [0.3125] * 3  # 1/3 in e5m2
    assert "float8_e4m3fn above 6.10 (to nan: it has no inf)" in demo.overflow_note
