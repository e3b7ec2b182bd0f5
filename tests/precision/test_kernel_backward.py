"""The kernels' own float32 arithmetic beyond the tensor cores (issue 25): CUDA's expf, logf and
1/x as PyTorch's FA2 build runs them (gpu_libm.py), the exact FMA they need, and the backward's
kernel arithmetic (kernel_backward.py) against every captured backward of samples/kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import captured_cases
from osm_cli.errors import InputError
from osm_cli.flash.backward import attention_backward
from osm_cli.flash.options import Hooks, ScoreOptions, split_options
from osm_cli.precision import gpu_libm
from osm_cli.precision import kernel_backward as kernel_backward_module
from osm_cli.precision.backward import flash_backward
from osm_cli.precision.dtypes import DTYPES, ulp
from osm_cli.precision.gpu_ops import fma
from osm_cli.precision.kernel_backward import kernel_backward
from osm_cli.precision.mma import HAVE_NUMBA
from osm_cli.precision.model import model

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32


CASES = [c for c in captured_cases() if c.kernel in ("flash", "fa4") and c.has_grads]


# --- CUDA's expf, logf, 1/x (no fast math) ------------------------------------------------------

@pytest.mark.parametrize("name", ["expf", "logf"])
def test_libm_is_the_h200s_bit_for_bit(name):
    """2048 inputs measured on the H200 (benchmarks/kernel_sass.py libm), half of them where
    CUDA's value is not the correctly rounded one: the model gives the GPU's bits on all."""
    z = np.load(ROOT / "samples" / "gpu_ops" / "libm_h200.npz")
    x, y = z[f"{name}_x"], z[f"{name}_y"]
    got = getattr(gpu_libm, name)(x)
    assert np.array_equal(got.view(np.uint32), y.view(np.uint32))
    exact = (np.exp if name == "expf" else np.log)(x.astype(np.float64)).astype(F32)
    assert np.count_nonzero(exact != y) == 1024  # numpy's correctly rounded values differ


def test_libm_special_values():
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, np.nan], F32)
    lg = gpu_libm.logf(x)
    assert lg[0] == lg[1] == -np.inf and lg[2] == 0 and lg[4] == np.inf
    assert np.isnan(lg[3]) and np.isnan(lg[5])
    ex = gpu_libm.expf(np.array([0.0, -0.0, -np.inf, -1.0], F32))
    assert ex[0] == ex[1] == 1 and ex[2] == 0 and ex[3] == F32(0.36787948)


def test_fma32_rounds_once_where_float64_would_tie():
    # a·b = 32·(1 − 2^-46) lands 2^-41 below the float32 midpoint 2^29 + 96; float64 rounds the
    # sum onto the midpoint itself, and float32's tie to even then goes up to 2^29 + 128
    a, b, c = F32(32 * (1 + 2.0**-23)), F32(1 - 2.0**-23), F32(2.0**29 + 64)
    assert fma(np.array([a]), b, c)[0] == F32(2.0**29 + 128)  # gpu_ops.fma: twice rounded
    assert gpu_libm.fma32(np.array([a]), b, c)[0] == F32(2.0**29 + 64)


def test_recip_is_correctly_rounded():
    x = np.random.default_rng(3).uniform(1, 2, 10_000).astype(F32)
    assert np.array_equal(gpu_libm.recip(x), (np.float64(1) / x.astype(np.float64)).astype(F32))


# --- D = rowsum(dO ∘ O) in the kernels' order ---------------------------------------------------

def _d_by_hand(do, o, threads, width, descending):
    """Thread t adds its columns it·width + 8t + e one at a time; then the butterfly."""
    rows, d = do.shape
    out = np.empty(rows, F32)
    for r in range(rows):
        acc = []
        for t in range(threads):
            cols = [it * width + 8 * t + e for it in range(d // width) for e in range(8)]
            s = F32(do[r, cols[0]] * o[r, cols[0]])
            for c in cols[1:]:
                s = F32(s + F32(do[r, c] * o[r, c]))
            acc.append(s)
        offs = [threads >> i for i in range(1, threads.bit_length())] if descending else \
            [1 << i for i in range(threads.bit_length() - 1)]
        for off in offs:
            acc = [F32(acc[i] + acc[i ^ off]) for i in range(threads)]
        out[r] = acc[0]
    return out


@pytest.mark.parametrize("kernel, d, threads, width", [("fa2", 64, 8, 64), ("fa2", 96, 4, 32),
                                                       ("fa4", 64, 8, 64), ("fa4", 128, 16, 128)])
def test_delta_in_the_kernels_order(kernel, d, threads, width):
    rng = np.random.default_rng(d)
    do, o = (rng.standard_normal((64, d)).astype(np.float16).astype(F32) for _ in range(2))
    got = kernel_backward(kernel, "tensor-core").delta_of(do, o)
    assert np.array_equal(got, _d_by_hand(do, o, threads, width, descending=kernel == "fa2"))
    assert np.count_nonzero(got != np.einsum("rd,rd->r", do, o)) > 0  # the order matters


# --- the backward against the captures -----------------------------------------------------------

def _backward(case, mma):
    a = case.arrays
    q, k, v, do = (a[n].astype(F32) for n in ("q", "k", "v", "do"))
    return flash_backward(model(case.dtype), q, k, v, do, a["out"].astype(F32), a["lse"],
                          opts=split_options(dict(case.opts))[0], trace_at=None,
                          kernel="fa4" if case.kernel == "fa4" else "fa2", mma=mma)


def _off(x, y, dt):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return np.abs(x - y) / ulp(np.maximum(np.abs(x), np.abs(y)), dt)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_backward_is_the_kernels_bit_for_bit_nearly(case):
    """dQ, dK, dV of the kernel arithmetic (mma tensor-core) against the captured gradients:
    bit for bit on ≥ 99.98 % (bf16) / 99.8 % (fp16) of each, and within 2 ulps of the element
    everywhere but at most 4 elements a case (tiny values, a float32 ulp of the row's scale
    seen at their own: benchmarks/results/kernel_bits_h200.txt)."""
    fb = _backward(case, "tensor-core")
    dt = DTYPES[case.dtype]
    floor = 0.9998 if case.dtype == "bfloat16" else 0.998
    over = 0
    for g in ("dq", "dk", "dv"):
        got, want = getattr(fb, g), case.arrays[g].astype(F32)
        assert np.mean(got == want) >= floor, g
        over += int((_off(got, want, dt) > 2).sum())
    assert over <= 4


def test_kernel_arithmetic_beats_osms_blas_model():
    """Over the fp16 FA2 captures: the blas model (osm's own backward arithmetic) agrees on
    ~99 %, the kernel's on ~99.98 %."""
    fp16 = [c for c in CASES if c.kernel == "flash" and c.dtype == "float16"][:6]
    share = {m: np.mean([np.mean(_backward(c, m).dk == c.arrays["dk"].astype(F32))
                         for c in fp16]) for m in ("blas", "tensor-core")}
    assert share["blas"] < 0.997 < 0.999 < share["tensor-core"]


def test_kernel_hook_takes_no_alibi():
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 1, 8, 16)).astype(F32) for _ in range(4))
    opts = ScoreOptions(alibi_slopes=np.array([[0.5]]))
    with pytest.raises(InputError, match="ALiBi"):
        attention_backward(q, k, v, do, opts=opts, trace_at=None,
                           hooks=Hooks(F32, kernel=kernel_backward("fa2", "tensor-core")))
    # flash_backward runs osm's own arithmetic for it instead
    fb = flash_backward(model("bf16"), q, k, v, do, opts=opts, trace_at=None, kernel="fa2",
                        mma="tensor-core")
    assert np.isfinite(fb.dq).all()


# --- the compiled pass for P and dS (_bwd_numba.py) against numpy's -----------------------------

@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("kernel", ["fa2", "fa4"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("nan", [False, True])
def test_compiled_p_and_ds_are_numpys_bits(kernel, dtype, nan, monkeypatch):
    """One tile pair's P, dS, dQ share and new dK, dV accumulators: the compiled pass (P, dS
    and bfloat16's rounding in one loop) gives numpy's arithmetic's bits, on scores that reach
    every branch: a masked row (LSE +inf), masked keys, P underflowing to 0, P = +inf and
    dS = NaN (an LSE far below its row's scores, dP − D = 0: numpy rounds that tile), a tile
    wider than one pass of rows."""
    rng = np.random.default_rng(5)
    m = model(dtype)
    cast = DTYPES["bfloat16" if dtype == "bf16" else "float16"]
    g, rows, keys, d = 2, 48, 80, 32
    q, do = (rng.standard_normal((1, g * rows, d)).astype(cast).astype(F32) for _ in range(2))
    k, v = ((4 * rng.standard_normal((1, keys, d))).astype(cast).astype(F32) for _ in range(2))
    lse = rng.uniform(0, 30, (1, g * rows)).astype(F32)
    lse[0, 3], lse[0, 7] = np.inf, -200.0  # a masked row; one whose P overflows
    delta = rng.standard_normal((1, g * rows)).astype(F32)
    if nan:
        do[0, 7], delta[0, 7] = 0, 0  # dP − D = 0 where P is +inf: dS NaN
    visible = rng.random((g * rows, keys)) > 0.3
    acc = [rng.standard_normal((1, g, keys, d)).astype(F32) for _ in range(2)]
    kb = kernel_backward(kernel, "tensor-core")

    def run():
        return kb.step(q, k, v, do, lse, delta, scale=d**-0.5, heads=g, dk=acc[0], dv=acc[1],
                       visible=visible, p_round=m.p_round, ds_round=m.p_round)

    assert kb._compiled()
    with np.errstate(invalid="ignore", over="ignore"):
        fast = run()
        monkeypatch.setattr(kernel_backward_module, "HAVE_NUMBA", False)
        assert not kb._compiled()
        slow = run()
    assert np.isinf(slow.p).any() and np.isnan(slow.ds).any() == nan and (slow.p == 0).any()
    for name in ("p", "ds", "dp", "dq", "dk", "dv"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.shape == b.shape and a.tobytes() == b.tobytes(), name


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_compiled_bfloat16_rounding_is_ml_dtypes():
    """The compiled pass's bfloat16 (to nearest even on the bits) against ml_dtypes' cast: every
    tie (low 16 bits 0x8000) of a sweep of exponents, its neighbours, subnormals, the largest
    finite values (rounding up to inf), ±inf, ±0."""
    from numba import njit

    from osm_cli.precision._bwd_numba import _bf16

    high = np.arange(0, 2**16, 7, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    u = (high[:, None] | low[None, :]).reshape(-1)
    x = np.concatenate([u.view(F32), np.float32([np.inf, -np.inf, 3.4e38, -3.4e38, 0, -0.0])])
    x = x[~np.isnan(x)]
    got = njit(lambda a: np.array([_bf16(v) for v in a], np.float32))(x)
    want = x.astype(DTYPES["bfloat16"]).astype(F32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
