"""The fast tensor-core accumulation (precision/mma.py, docs/numerics.md#tensor-cores) against
the implementation it replaced, kept here as the reference: bit for bit on random inputs of
every dtype and their extremes, on both paths (numba, numpy), and on every capture's forward
and backward."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import osm_cli.precision.gpu_ops as gpu_ops
import osm_cli.precision.mma as mma
from osm_cli.errors import OsmError
from osm_cli.flash.options import split_options
from osm_cli.precision.backward import flash_backward
from osm_cli.precision.kernels import run_flash
from osm_cli.precision.model import model

F32 = np.float32
ROOT = Path(__file__).resolve().parents[2]


def reference(a, b, c=None):
    """gpu_ops.matmul(how="tensor-core") as it was before the compiled kernel (osm 0.2.0)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((*a.shape[:-1], b.shape[-1])) if c is None else c.astype(np.float64)
    for k0 in range(0, a.shape[-1], 16):
        terms = a64[..., :, None, k0:k0 + 16] * np.swapaxes(b64[..., k0:k0 + 16, :],
                                                            -1, -2)[..., None, :, :]
        terms = np.concatenate([acc[..., None], terms], axis=-1)
        top = np.abs(terms).max(axis=-1, keepdims=True)
        _, e = np.frexp(np.where(top == 0, 1.0, top))
        quantum = np.ldexp(1.0, e - 1 - 23 - 2)
        x = np.trunc(terms / quantum).sum(axis=-1) * quantum[..., 0]
        f = x.astype(F32)
        over = np.abs(f.astype(np.float64)) > np.abs(x)
        acc = np.where(over, np.nextafter(f, F32(0)), f).astype(np.float64)
    return acc.astype(F32)


def same_bits(x, y) -> bool:
    """Equal bit for bit (every NaN counts as one)."""
    x, y = np.asarray(x, F32), np.asarray(y, F32)
    nan = np.isnan(x)
    return bool(np.array_equal(nan, np.isnan(y))
                and np.array_equal(x[~nan].view(np.int32), y[~nan].view(np.int32)))


DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "e4m3": ml_dtypes.float8_e4m3fn,
          "e5m2": ml_dtypes.float8_e5m2, "fp32": F32}


def _values(rng, shape, dt, scale):
    x = (rng.standard_normal(shape) * scale).astype(np.float64)
    with np.errstate(over="ignore"):
        return x.astype(dt).astype(F32) if dt is not F32 else x.astype(F32)


def _extremes(x, dt, rng):
    """Zeros of both signs, the dtype's largest and smallest values, its subnormals, at random
    places."""
    info = ml_dtypes.finfo(dt) if dt is not F32 else np.finfo(F32)
    special = [0.0, -0.0, float(info.max), -float(info.max), float(info.smallest_normal),
               float(info.smallest_subnormal), -float(info.smallest_subnormal), 1.0, -1.0]
    flat = x.reshape(-1)
    at = rng.choice(flat.size, size=flat.size // 6, replace=False)
    flat[at] = rng.choice(np.array(special, dtype=np.float64), size=at.size).astype(dt).astype(F32)
    return x


def _has_avx512() -> bool:
    if not mma.HAVE_NUMBA:
        return False
    from osm_cli.precision import _mma_avx512

    return _mma_avx512.available()


@pytest.fixture(params=["avx512", "numba", "numpy"])
def path(request, monkeypatch):
    """Every path of tensor_core: compiled in AVX-512's instructions (where the CPU has them),
    compiled portably (where numba is installed), numpy."""
    if request.param != "numpy" and not mma.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    if request.param == "avx512" and not _has_avx512():
        pytest.skip("this CPU has no AVX-512F and DQ")
    monkeypatch.setattr(mma, "HAVE_NUMBA", request.param != "numpy")
    monkeypatch.setattr(mma, "AVX512", request.param == "avx512")
    return request.param


@pytest.mark.parametrize("dt", list(DTYPES), ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_random_inputs_every_dtype(path, dt, scale):
    # the same inputs on every run: hash() of a str changes with each process (PYTHONHASHSEED)
    rng = np.random.default_rng(zlib.crc32(f"{dt} {scale!r}".encode()))
    d = DTYPES[dt]
    for k in (64, 16, 40, 7):  # whole chunks, and a last chunk of fewer terms
        a = _values(rng, (3, 33, k), d, scale)
        b = _values(rng, (3, k, 24), d, 1.0)
        c = rng.standard_normal((3, 33, 24)).astype(F32)
        assert same_bits(mma.tensor_core(a, b), reference(a, b))
        assert same_bits(mma.tensor_core(a, b, c), reference(a, b, c))


@pytest.mark.parametrize("dt", list(DTYPES), ids=str)
def test_extremes_every_dtype(path, dt):
    rng = np.random.default_rng(7)
    d = DTYPES[dt]
    a = _extremes(_values(rng, (2, 40, 48), d, 1.0), d, rng)
    b = _extremes(_values(rng, (2, 48, 20), d, 1.0), d, rng)
    c = _extremes(rng.standard_normal((2, 40, 20)).astype(F32), F32, rng)
    with np.errstate(invalid="ignore", over="ignore"):
        assert same_bits(mma.tensor_core(a, b, c), reference(a, b, c))
        assert same_bits(mma.tensor_core(a, b), reference(a, b))


@pytest.mark.parametrize("width", [1, 15, 16, 17, 63, 64, 65, 80, 100, 128, 130, 200])
def test_every_output_width(path, width):
    """The compiled kernel copies b into panels of 64 columns, then 16 for the rest of a row:
    every split of a row's width gives the reference's bits, with and without c."""
    rng = np.random.default_rng(width)
    a = _values(rng, (2, 9, 48), np.float16, 1.0)
    b = _values(rng, (2, 48, width), np.float16, 1.0)
    c = rng.standard_normal((2, 9, width)).astype(F32)
    assert same_bits(mma.tensor_core(a, b), reference(a, b))
    assert same_bits(mma.tensor_core(a, b, c), reference(a, b, c))


def _adversarial(seed, m, k, n, dt, ea, eb, ec, zeros, zero):
    """a (2, m, k) and b (2, k, n) of dtype dt scaled by 2^ea and 2^eb, c (2, m, n) float32
    scaled by 2^ec, a share `zeros` of each set to 0 (a's to `zero`: 0.0 or -0.0)."""
    rng = np.random.default_rng(seed)
    d = DTYPES[dt]
    a = _values(rng, (2, m, k), d, 1.0) * F32(2.0**ea)
    b = _values(rng, (2, k, n), d, 1.0) * F32(2.0**eb)
    a[rng.random(a.shape) < zeros] = zero
    b[rng.random(b.shape) < zeros] = 0
    with np.errstate(over="ignore", under="ignore"):
        c = (rng.standard_normal((2, m, n)) * 2.0**ec).astype(F32)
    c[rng.random(c.shape) < zeros] = 0
    return a, b, c


# _adversarial's arguments: products from far below 2^−100 to past 2^120, accumulators from
# below float32's normal range to near its largest
ADVERSARIAL = dict(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 6), k=st.integers(1, 70),
                   n=st.integers(1, 200), dt=st.sampled_from(["bf16", "fp16", "e4m3", "e5m2"]),
                   ea=st.integers(-75, 62), eb=st.integers(-75, 62), ec=st.integers(-140, 127),
                   zeros=st.floats(0, 0.9))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(**ADVERSARIAL)
def test_any_shape_scale_and_zeros(seed, m, k, n, dt, ea, eb, ec, zeros):
    """Adversarial inputs for the compiled kernel: any shape, operands scaled by 2^ea and 2^eb
    (products from far below 2^−100 to past 2^120, so that rows leave the 16-bit path's range),
    an accumulator of any size, and a share of exact zeros (zero chunks, zero rows)."""
    a, b, c = _adversarial(seed, m, k, n, dt, ea, eb, ec, zeros, 0.0)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        assert same_bits(mma.tensor_core(a, b, c), reference(a, b, c))
        assert same_bits(mma.tensor_core(a, b), reference(a, b))


@pytest.mark.skipif(not _has_avx512(), reason="this CPU has no AVX-512F and DQ")
@settings(max_examples=200, deadline=None, derandomize=True)
@given(**ADVERSARIAL)
def test_the_two_compiled_kernels_agree(seed, m, k, n, dt, ea, eb, ec, zeros):
    """_mma_avx512 (VRANGEPS for the largest magnitude, VCVTDQ2PS toward zero) and the portable
    kernel give the same bits on any shape, scale and share of zeros, rows past the 16-bit
    path's range (the float64 rows) included."""
    from osm_cli.precision import _mma_avx512, _mma_numba

    a, b, c = _adversarial(seed, m, k, n, dt, ea, eb, ec, zeros, -0.0)
    wide, portable = np.empty((2, m, n), F32), np.empty((2, m, n), F32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        _mma_avx512.mma(a, b, c, wide)
        _mma_numba.mma(a, b, c, portable)
    assert same_bits(wide, portable)


@pytest.mark.skipif(not _has_avx512(), reason="this CPU has no AVX-512F and DQ")
@pytest.mark.parametrize("env", [{"NUMBA_ENABLE_AVX": "0"}, {"NUMBA_CPU_FEATURES": "-avx512f"},
                                 {"NUMBA_CPU_FEATURES": "+avx512f,+avx512dq,-avx512dq"}])
def test_avx512_only_where_numba_targets_it(tmp_path, env):
    """Where numba is told to compile without AVX-512 (its own settings), the portable kernel
    runs: compiling the AVX-512 one for such a target would abort the process (LLVM)."""
    import os
    import subprocess

    code = ("import numpy as np; from osm_cli.precision import mma; "
            "r = mma.tensor_core(np.ones((2, 16), np.float32), np.ones((16, 3), np.float32)); "
            "print(r[0, 0], mma.AVX512)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120,
                          env={**os.environ, **env, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert (done.returncode, done.stdout, done.stderr) == (0, "16.0 False\n", "")


def test_non_finite_and_cancelling_terms(path):
    a = np.array([[1.0, -1.0] + [2.0**-26] * 14 + [np.inf, 1.0],
                  [np.inf, -np.inf] + [0.0] * 16,
                  [np.nan] + [1.0] * 17,
                  [1.0, -1.0] + [0.0] * 16,
                  [-0.0] * 18,
                  [3.0e38, 3.0e38] + [0.0] * 16,
                  [2.0**-140, 2.0**-149] + [2.0**-149] * 16], F32)
    b = np.ones((18, 2), F32)
    b[:, 1] = -1.0
    c = np.array([[0, 0], [0, 0], [0, 0], [-0.0, -0.0], [-0.0, -0.0], [0, 0], [2.0**-149, 0]], F32)
    with np.errstate(invalid="ignore", over="ignore"):
        got, want = mma.tensor_core(a, b, c), reference(a, b, c)
    assert same_bits(got, want)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()
    assert got[5, 0] == np.finfo(F32).max  # toward zero: the largest float32, not inf
    assert not np.signbit(got[4]).any()  # numpy's sum of zeros is +0, and so is the kernel's


def test_near_float32s_ends(path):
    """Sums of 16-bit products next to float32's largest value (where the sum times q would
    overflow float32; the float64 arithmetic saturates toward zero) and next to its smallest
    normal (where a chunk's quantum falls below 2^-125)."""
    big = np.array([[2.0**59 * 1.9921875] * 16 + [2.0**59] * 16], F32)
    tiny = np.array([[2.0**-60 * 1.5] * 16 + [2.0**-62] * 16], F32)
    b = np.full((32, 3), 2.0**59, F32)
    b[:, 1] = -(2.0**59) * 1.5
    c = np.array([[0.0, 3.0e38, -2.0**124]], F32)
    bt = np.full((32, 3), 2.0**-60, F32)
    ct = np.array([[0.0, 2.0**-126, -(2.0**-149)]], F32)
    with np.errstate(over="ignore"):
        for a, bb, cc in ((big, b, c), (big, b, None), (tiny, bt, ct), (tiny, bt, None)):
            assert same_bits(mma.tensor_core(a, bb, cc), reference(a, bb, cc))
    # 16·2^118·(1.9921875 + 1), exact
    assert mma.tensor_core(big, b)[0, 0] == F32(2.0**123 * 1.49609375)


def test_broadcast_and_empty(path):
    rng = np.random.default_rng(3)
    a = _values(rng, (2, 1, 5, 32), ml_dtypes.bfloat16, 1.0)
    b = _values(rng, (3, 32, 4), ml_dtypes.bfloat16, 1.0)
    assert mma.tensor_core(a, b).shape == (2, 3, 5, 4)
    wide = (np.broadcast_to(a, (2, 3, 5, 32)), np.broadcast_to(b, (2, 3, 32, 4)))
    assert same_bits(mma.tensor_core(a, b), reference(*wide))
    e = mma.tensor_core(np.zeros((2, 0, 16), F32), np.zeros((2, 16, 3), F32))
    assert e.shape == (2, 0, 3)


def test_matmul_dispatches_to_the_kernel():
    a = np.array([[1.0, 0.75 * 2.0**-23]], F32)
    b = np.ones((2, 1), F32)
    assert gpu_ops.matmul(a, b, "tensor-core")[0, 0] == F32(1.0)
    assert gpu_ops.matmul(a, b, "blas")[0, 0] == F32(1 + 2.0**-23)


# --- every capture, forward and backward, against the reference ---------------------------------

def _captures():
    """Each captured input once (SDPA's three backends share theirs), with its preset."""
    name = "osm_benchmarks_captures"  # benchmarks/captures.py, the captures' one loader
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks/captures.py")
    mod = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    seen = {}
    for c in mod.load_cases(ROOT / "samples" / "kernels"):
        seen.setdefault((c.name, c.dtype, c.kernel == "fa4"), c)
    return list(seen.values())


CASES = _captures()


def _with_reference(monkeypatch):
    monkeypatch.setattr(gpu_ops, "tensor_core", reference)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_every_capture_forward_and_backward(case, monkeypatch):
    if not mma.HAVE_NUMBA:
        pytest.skip("numba is not installed: the numpy path is the reference itself")
    a = case.arrays
    q, k, v = (a[n].astype(F32) for n in "qkv")
    kernel = "fa4" if case.kernel == "fa4" else "fa2"  # the preset each capture is judged by
    m = model(case.dtype)
    kw = dict(kernel=kernel, mma="tensor-core", **case.opts)
    fast = run_flash(m, q, k, v, trace_at=None, **kw)
    back = None
    bkw = dict(kernel=kernel, mma="tensor-core", opts=split_options(dict(case.opts))[0],
               trace_at=None)
    if "do" in a and "cu_seqlens_q" not in case.opts and "page_table" not in case.opts:
        back = flash_backward(m, q, k, v, a["do"].astype(F32), **bkw)
    _with_reference(monkeypatch)
    slow = run_flash(m, q, k, v, trace_at=None, **kw)
    assert same_bits(fast.out, slow.out) and same_bits(fast.lse, slow.lse)
    if back is not None:
        ref = flash_backward(m, q, k, v, a["do"].astype(F32), **bkw)
        for g in ("dq", "dk", "dv"):
            assert same_bits(getattr(back, g), getattr(ref, g)), g


@pytest.mark.parametrize("kernel", ["fa2", "fa4", "fa4-sm100"])
@pytest.mark.parametrize("name", ["kernel_bf16", "kernel_fp16"])
def test_sample_captures_every_preset(kernel, name, monkeypatch):
    z = np.load(ROOT / "samples" / f"{name}.npz")
    q, k, v = (z[n][:, :, :96].astype(F32) for n in "qkv")
    m = model("bf16" if "bf16" in name else "fp16")
    fast = run_flash(m, q, k, v, kernel=kernel, mma="tensor-core", causal=True, trace_at=None)
    _with_reference(monkeypatch)
    slow = run_flash(m, q, k, v, kernel=kernel, mma="tensor-core", causal=True, trace_at=None)
    assert same_bits(fast.out, slow.out) and same_bits(fast.lse, slow.lse)


# --- the default arithmetic ---------------------------------------------------------------------

def _digest(*xs) -> str:
    h = hashlib.sha256()
    for x in xs:
        h.update(np.ascontiguousarray(np.asarray(x, F32)).tobytes())
    return h.hexdigest()[:16]


DIGESTS = json.loads((Path(__file__).parent / "capture_digests.json").read_text())["digests"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_default_is_the_tensor_cores_bits_of_81b2524_on_every_capture(case):
    """With no mma a preset runs the tensor cores' arithmetic: forward (out, LSE) and backward
    (dQ, dK, dV) bit for bit what mma="tensor-core" gave before it became the default
    (capture_digests.json, made at 81b2524), on every capture."""
    a = case.arrays
    q, k, v = (a[n].astype(F32) for n in "qkv")
    kernel = "fa4" if case.kernel == "fa4" else "fa2"
    m = model(case.dtype)
    fwd = run_flash(m, q, k, v, trace_at=None, kernel=kernel, **case.opts)
    want = DIGESTS[case.label]
    assert _digest(fwd.out, fwd.lse) == want["forward"]
    if "backward" in want:
        back = flash_backward(m, q, k, v, a["do"].astype(F32), kernel=kernel, trace_at=None,
                              opts=split_options(dict(case.opts))[0])
        assert _digest(back.dq, back.dk, back.dv) == want["backward"]


def test_every_capture_has_its_digest():
    assert sorted(DIGESTS) == sorted(c.label for c in CASES)
    assert sum("backward" in d for d in DIGESTS.values()) == 43


def test_blas_stays_the_quick_approximation():
    """mma="blas" still runs numpy's BLAS (other bits than the default on a capture), and osm's
    own tiles take BLAS by default and refuse the tensor cores."""
    case = next(c for c in CASES if c.label == "flash/float16/causal")
    q, k, v = (case.arrays[n].astype(F32) for n in "qkv")
    m = model(case.dtype)
    tc = run_flash(m, q, k, v, trace_at=None, kernel="fa2", **case.opts)
    blas = run_flash(m, q, k, v, trace_at=None, kernel="fa2", mma="blas", **case.opts)
    assert _digest(tc.out, tc.lse) == DIGESTS[case.label]["forward"]
    assert _digest(blas.out, blas.lse) != DIGESTS[case.label]["forward"]
    same = float(np.mean(blas.out == tc.out))
    assert 0.98 < same < 1.0
    from osm_cli.precision.presets import mma_for
    assert mma_for("tiles", None) == "blas" and mma_for("fa4", None) == "tensor-core"
    with pytest.raises(OsmError, match="tiles is osm's own loop"):
        mma_for("tiles", "tensor-core")
    with pytest.raises(OsmError, match="must be one of tensor-core, blas"):
        mma_for("fa2", "fast")
