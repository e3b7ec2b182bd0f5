"""The kernel presets' numerics (docs/numerics.md#kernel-presets, #tensor-cores, #fp8): the GPU's
float32 operations as gpu_ops.py models them, each on a case crafted so that the modelled
rounding gives other bits than the obvious one; the presets' refusals; masked rows and sinks per
kernel; the captured H200 kernels reproduced bit for bit; FA4's FP8 saturation bug."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conftest import captured_cases, qkv
from osm_cli.errors import OsmError
from osm_cli.flash.reference import reference
from osm_cli.precision.emulate import Descale
from osm_cli.precision.gpu_ops import EXP2_EMU, exp2_emulated, fma, lane_sums, matmul, quad_sum
from osm_cli.precision.kernels import run_flash
from osm_cli.precision.model import model

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32


CASES = captured_cases()


def _as(x, dtype):
    return np.asarray(x, F32).astype(dtype).astype(F32)


def _bf16(xs):
    return tuple(_as(x, ml_dtypes.bfloat16) for x in xs)


# --- the GPU's float32 operations (gpu_ops.py) ------------------------------------------------

def test_fma_rounds_once():
    # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: rounding the product first loses the 2^-24 (a tie to
    # even), so fl(fl(a·b) + c) is 0 where the fused a·b + c keeps it.
    a = F32(1 + 2.0**-12)
    c = F32(-(1 + 2.0**-11))
    twice = F32(F32(a * a) + c)
    once = fma(np.array([a]), a, c)[0]
    assert twice == 0.0
    assert once == F32(2.0**-24)


def test_exp2_emulated_against_exp2_on_a_grid():
    x = np.linspace(-60, 60, 240_001).astype(F32)
    got = exp2_emulated(x).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got - want) / want
    # The degree-3 polynomial is accurate to ~8.8e-5 relative (about 1400 float32 ulps, a 64th
    # of a bf16 ulp): far from float32's own exp2, well inside what a 16-bit P keeps.
    assert rel.max() < 1e-4
    assert rel.max() > 5e-5  # it is the polynomial, not a correctly rounded exp2
    assert np.array_equal(exp2_emulated(np.arange(-20, 21, dtype=F32)),
                          np.exp2(np.arange(-20, 21, dtype=F32)))  # p(0) = 1: exact powers


def test_exp2_emulated_is_zero_at_and_below_minus_127():
    x = np.array([-127.0, -127.5, -128.0, -1000.0, -np.inf], dtype=F32)
    got = exp2_emulated(x)
    assert np.array_equal(got, np.zeros(5, F32))
    assert not np.signbit(got).any()  # +0, as the integer bits give
    assert 0 < exp2_emulated(np.array([-126.5], F32))[0] < 2.0**-126  # subnormal just above


def test_exp2_emulated_at_one_half_by_hand():
    # floor(0.5) = 0, f = 0.5; Horner in float32 FMAs (each product by 0.5 exact, one rounding
    # per step): c3/2 + c2 = 0.26612393930554… -> 0.2661239504814148 (4464819 / 2^24);
    # /2 + c1 = 0.82820811868… -> 0.8282080888748169; /2 + c0 = 1.41410404443740… ->
    # 1.4141039848327637 (0x3FB5015C), 7.7e-5 below √2.
    c0, c1, c2, c3 = (Fraction(c) for c in EXP2_EMU)
    f = Fraction(1, 2)

    def rn(x):  # exact here: each sum of float32 values is exact in float64
        return Fraction(float(F32(float(x))))

    p = rn(rn(rn(c3 * f + c2) * f + c1) * f + c0)
    assert rn(c3 * f + c2) == Fraction(4464819, 2**24)
    got = exp2_emulated(np.array([0.5], F32))[0]
    assert got == F32(float(p)) == F32(1.4141039848327637)
    assert int(got.view(np.uint32)) == 0x3FB5015C
    assert abs(float(got) - math.sqrt(2)) / math.sqrt(2) == pytest.approx(7.75e-5, rel=1e-3)


def test_tensor_core_matmul_truncates_toward_zero():
    # 1 + 0.75·2^-23: round to nearest (BLAS) goes up to 1 + 2^-23, the tensor cores' result
    # is truncated toward zero to 1.
    a = np.array([[1.0, 0.75 * 2.0**-23]], F32)
    b = np.ones((2, 1), F32)
    assert matmul(a, b, "blas")[0, 0] == F32(1 + 2.0**-23)
    assert matmul(a, b, "tensor-core")[0, 0] == F32(1.0)


def test_tensor_core_matmul_drops_bits_below_the_largest_term():
    # 1 − 1 + 14·2^-26 in one 16-term MMA: aligned to the largest term (2^0, quantum 2^-25),
    # each 2^-26 is truncated to 0, so the tensor cores give 0 where BLAS (and exact) give
    # 14·2^-26 = 7·2^-25.
    a = np.array([[1.0, -1.0] + [2.0**-26] * 14], F32)
    b = np.ones((16, 1), F32)
    assert matmul(a, b, "blas")[0, 0] == F32(7 * 2.0**-25)
    assert matmul(a, b, "tensor-core")[0, 0] == 0.0
    # in the next 16-term step the small terms stand alone and are kept
    a2 = np.concatenate([np.array([[1.0, -1.0] + [0.0] * 14], F32), a[:, 2:4]], axis=1)
    b2 = np.ones((18, 1), F32)
    assert matmul(a2, b2, "tensor-core")[0, 0] == F32(2 * 2.0**-26)


def test_quad_lane_order_differs_from_numpy_sum():
    # Lane i of a quad holds columns 8j + 2i + {0, 1}; FA2 combines (l0 + l2) + (l1 + l3).
    # p = [1, 0, 2^-24, 0, 0, 0, 2^-24, 0]: the lanes add the two 2^-24 together first
    # (l1 + l3 = 2^-23) and keep it; any left-to-right or pairwise sum adds each to 1 alone,
    # a tie that rounds back to 1.
    p = np.array([[1.0, 0, 2.0**-24, 0, 0, 0, 2.0**-24, 0]], F32)
    lanes = lane_sums(np.zeros((1, 4), F32), p)
    assert np.array_equal(lanes[0], np.array([1.0, 2.0**-24, 0.0, 2.0**-24], F32))
    lane_sum = quad_sum(lanes)[0]
    assert lane_sum == F32(1 + 2.0**-23)
    assert np.sum(p, dtype=F32) == F32(1.0) != lane_sum


# --- the presets' refusals ---------------------------------------------------------------------

def test_fp8_on_fa2_names_both():
    q, k, v = (_as(x, ml_dtypes.float8_e4m3fn)
               for x in _bf16(qkv(8, 64, 64, b=1, dtype=F32, stream=True)))
    with pytest.raises(OsmError) as exc:
        run_flash(model("e4m3"), q, k, v, kernel="fa2")
    assert str(exc.value) == ("kernel fa2 takes float16, bfloat16 inputs, not float8_e4m3fn "
                              "(FP8: `kernel` fa4-sm100); `kernel` tiles runs any dtype in osm's "
                              "own loop")


def test_alibi_on_fa4_is_refused():
    q, k, v = _bf16(qkv(8, 64, 64, b=1, dtype=F32, stream=True))
    with pytest.raises(OsmError) as exc:
        run_flash(model("bf16"), q, k, v, kernel="fa4", alibi_slopes=np.array([0.5], F32))
    assert str(exc.value) == ("kernel fa4 (FlashAttention-4 SM90 forward (flash_attn.cute, "
                              "Hopper)) takes no `alibi_slopes` (ALiBi slopes); `kernel` tiles "
                              "runs it in osm's own loop")


def test_float_mask_on_a_preset_is_refused():
    q, k, v = _bf16(qkv(8, 64, 64, b=1, dtype=F32, stream=True))
    with pytest.raises(OsmError) as exc:
        run_flash(model("bf16"), q, k, v, kernel="fa2", mask=np.zeros((8, 64), F32))
    assert str(exc.value) == ("kernel fa2 (FlashAttention-2 forward (PyTorch's flash SDPA "
                              "backend)) takes no float mask (an added bias); `kernel` tiles "
                              "runs it in osm's own loop")


def test_unknown_kernel_lists_the_presets():
    q, k, v = _bf16(qkv(8, 64, 64, b=1, dtype=F32, stream=True))
    with pytest.raises(OsmError) as exc:
        run_flash(model("bf16"), q, k, v, kernel="fa3")
    assert str(exc.value) == "unknown kernel 'fa3'; the presets are fa2, fa4, fa4-sm100, tiles"


# --- masked rows, sinks, trace order ---------------------------------------------------------

@pytest.mark.parametrize("kernel,lse", [("fa2", np.inf), ("fa4", -np.inf),
                                        ("fa4-sm100", -np.inf)])
def test_fully_masked_rows_lse_per_kernel(kernel, lse):
    # causal, bottom-right, t = 8 > s = 4: rows 0–3 see no key
    q, k, v = _bf16(qkv(8, 4, 64, b=1, dtype=F32, stream=True))
    res = run_flash(model("bf16"), q, k, v, kernel=kernel, causal=True)
    assert np.array_equal(res.lse[0, 0, :4], np.full(4, lse, F32))
    assert np.isfinite(res.lse[0, 0, 4:]).all()
    assert np.array_equal(res.out[0, 0, :4], np.zeros((4, 64), F32))


@pytest.mark.parametrize("kernel", ["fa4", "fa4-sm100"])
def test_sink_on_a_fully_masked_row(kernel):
    q, k, v = _bf16(qkv(8, 4, 64, b=1, dtype=F32, stream=True))
    res = run_flash(model("bf16"), q, k, v, kernel=kernel, causal=True,
                    sinks=np.array([0.7], F32))
    assert np.allclose(res.lse[0, 0, :4], 0.7, rtol=0, atol=1e-6)
    assert np.array_equal(res.out[0, 0, :4], np.zeros((4, 64), F32))
    _, ref_lse = reference(q, k, v, causal=True, sinks=np.array([0.7]))
    assert np.abs(res.lse - ref_lse).max() < 1e-5


def test_trace_order_last_to_first():
    # B·H·⌈t/64⌉ = 212 ≥ 0.8·2·132 query blocks fill the GPU: FA2's standard kernel, no split,
    # block_k 128 for d ≤ 64
    q, k, v = _bf16(qkv(64, 512, 16, heads=(212, 212), b=1, dtype=F32, seed=1, stream=True))
    fa2 = run_flash(model("bf16"), q, k, v, kernel="fa2")
    assert fa2.options.splits == 1
    assert [(st.block, st.start, st.stop) for st in fa2.trace.steps] == [
        (3, 384, 512), (2, 256, 384), (1, 128, 256), (0, 0, 128)]
    q, k, v = _bf16(qkv(4, 512, 64, b=1, dtype=F32, stream=True))
    fa4 = run_flash(model("bf16"), q, k, v, kernel="fa4")
    assert [st.block for st in fa4.trace.steps] == [3, 2, 1, 0]
    tiles = run_flash(model("bf16"), q, k, v, kernel="tiles", block_k=128)
    assert [st.block for st in tiles.trace.steps] == [0, 1, 2, 3]


# --- the captured kernels (samples/kernels, one H200) ------------------------------------------

def _identical(case, kernel):
    a = case.arrays
    q, k, v = (a[n].astype(F32) for n in "qkv")
    res = run_flash(model(case.dtype), q, k, v, kernel=kernel, mma="tensor-core", trace_at=None,
                    **case.opts)
    return float(np.mean(res.out == a["out"]))


@pytest.mark.parametrize("case", [c for c in CASES if c.kernel == "flash"],
                         ids=lambda c: c.label)
def test_fa2_preset_bit_identical_to_pytorch_flash(case):
    goal = 0.999 if case.dtype == "bfloat16" else 0.995
    assert _identical(case, "fa2") >= goal


@pytest.mark.parametrize("case", [c for c in CASES if c.kernel == "fa4" and c.dtype == "bfloat16"
                                  and c.name in ("plain", "causal", "gqa", "sink")],
                         ids=lambda c: c.label)
def test_fa4_preset_bit_identical_to_flash_attn_4(case):
    assert _identical(case, "fa4") >= 0.999


def test_all_captured_cases_are_here():
    flash = {c.label for c in CASES if c.kernel == "flash"}
    # 16 cases × fp16, bf16: the 7 of the first captures (new_causal_d96, new_rect_gqa_d80 fresh
    # then), the 6 split-KV ones of issue 25 and its 3 held-out fresh_* shapes
    assert len(flash) == 32
    assert sum(c.name.startswith("splitkv_") for c in CASES if c.kernel == "flash") == 12
    assert {"fa4/bfloat16/plain", "fa4/bfloat16/causal", "fa4/bfloat16/gqa",
            "fa4/bfloat16/sink"} <= {c.label for c in CASES}


# --- FP8: FA4's saturation bug (flash-attention #2716 / #2577) ---------------------------------

def _fp8_sample():
    a = {n: np.load(ROOT / "samples" / "fp8" / f"{n}.npy")
         for n in ("q", "k", "v", "q_descale", "k_descale", "v_descale")}
    true = [a[n].astype(np.float64) * float(a[f"{n}_descale"][0, 0]) for n in "qkv"]
    ref, ref_lse = reference(*true)
    desc = Descale(a["q_descale"], a["k_descale"], a["v_descale"])
    return a, desc, ref, ref_lse


@pytest.mark.parametrize("tau", [0.0, 8.0])
def test_fp8_saturation(tau):
    a, desc, ref, ref_lse = _fp8_sample()
    res = run_flash(model("e4m3"), a["q"], a["k"], a["v"], kernel="fa4-sm100", threshold=tau,
                    descale=desc)
    err_o = float(np.abs(res.out - ref).max())
    assert float(np.abs(res.lse - ref_lse).max()) < 1e-5  # the LSE is exact either way
    steps = [st for st in res.trace.steps if not st.sink]
    if tau == 0.0:  # offset + τ = 8 < log2 448: m moves with every tile, P ≤ 256
        assert err_o < 0.02
        assert all(st.m == st.block_max for st in steps)
    else:  # 8 + 8 ≥ log2 448: m kept at the first tile's max, P up to 2^14 saturates to 448
        assert err_o > 0.5
        assert all(st.m == steps[0].block_max for st in steps)
        top = max((st.block_max - st.m) * math.log2(math.e) + 8 for st in steps)
        assert 2.0**top > 448


def test_fa4_backward_sums_a_groups_dk_dv_in_float32():
    """FA4's GQA capture (4 query heads on 1 kv head): with --kernel fa4 the backward model sums
    the group's dK, dV in float32 (FA3/FA4's accumulator) and is the kernel bit for bit on
    ≥ 99.5 % of dK and dV; FA2's per-head rounding before the sum matches only about 60 %."""
    from osm_cli.flash.options import split_options
    from osm_cli.precision.backward import flash_backward

    case = next(c for c in CASES if c.kernel == "fa4" and c.name == "gqa")
    a = case.arrays
    q, k, v, do = (np.asarray(a[n], F32) for n in ("q", "k", "v", "do"))
    opts = split_options(dict(case.opts))[0]
    share = {}
    for kernel in ("fa4", "fa2"):
        fb = flash_backward(model(case.dtype), q, k, v, do, np.asarray(a["out"], F32),
                            np.asarray(a["lse"], F32), opts=opts, trace_at=None, kernel=kernel)
        share[kernel] = [float(np.mean(getattr(fb, g) == np.asarray(a[g], F32)))
                         for g in ("dk", "dv")]
    assert min(share["fa4"]) >= 0.995
    assert max(share["fa2"]) < 0.7


@pytest.mark.parametrize("kernel, causal, window", [("fa2", True, None), ("fa4", False, None),
                                                    ("fa4-sm100", True, (40, 8))])
def test_stacked_q_tiles_change_nothing_a_user_sees(monkeypatch, kernel, causal, window):
    """Q tiles stacked into one step (plan.q_groups, ragged) against one tile at a time,
    tensor-core mode: the same bits, the same traced steps (tiles the kernel skips for the
    traced row's own Q tile still show as skipped) and the same counters."""
    import osm_cli.flash.plan as plan_module

    q, k, v = (x.astype(F32) for x in qkv(300, 420, 64, heads=(2, 2), b=1,
                                          dtype=ml_dtypes.bfloat16, seed=11, stream=True))
    kw = dict(kernel=kernel, mma="tensor-core", causal=causal, window=window,
              trace_at=(0, 1, 150), sms=1)
    stacked = run_flash(model("bf16"), q, k, v, **kw)
    monkeypatch.setattr(plan_module, "STACK_ROWS", 0)
    single = run_flash(model("bf16"), q, k, v, **kw)
    assert np.array_equal(stacked.out, single.out) and np.array_equal(stacked.lse, single.lse)
    assert [repr(s) for s in stacked.trace.steps] == [repr(s) for s in single.trace.steps]
    assert (stacked.tiles, stacked.counters) == (single.tiles, single.counters)
    assert any(s.masked for s in single.trace.steps) == bool(causal or window)
