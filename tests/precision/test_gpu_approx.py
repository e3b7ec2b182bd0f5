"""The H200's approximate instructions as osm models them (osm_cli/precision/gpu_approx.py):
the model against values measured on the GPU (samples/gpu_ops: the inputs osm's presets fed
ex2, tanh and rcp on the captured kernels, measured on an H200 in an earlier session, before
the model existed), the special values, the structure the measurements found, and what the
default Ops buys on a real kernel's capture.

The model was checked on the H200 against the hardware over every float32 input of ex2, tanh
and rcp and every positive input of lg2 (benchmarks/measure_gpu_approx.py verify, 0
mismatches, lg2 from 1 up; benchmarks/results/gpu_approx_h200.txt); a CPU cannot rerun that.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from osm_cli.precision import gpu_approx as ga
from osm_cli.precision.gpu_ops import Ops

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32


def f32(*v):
    return np.array(v, dtype=F32)


@pytest.mark.parametrize("op, count", [("ex2", 286434), ("tanh", 85116), ("rcp", 2099)])
def test_model_reproduces_every_measured_sample(op, count):
    z = np.load(ROOT / "samples" / "gpu_ops" / f"{op}.npz")
    x, y = z["x"].view(F32), z["y"]
    assert x.size == count
    m = getattr(ga, op)(x)
    assert int(np.sum(m.view(np.int32) != y.view(np.int32))) == 0
    # and the samples are not the correctly rounded values (the model is not trivially right)
    cr = getattr(Ops.rounded(), {"ex2": "exp2", "tanh": "tanh_", "rcp": "recip"}[op])(x)
    assert int(np.sum(cr.view(np.int32) != y.view(np.int32))) > count // 100


def test_ex2_values_and_special_cases():
    y = ga.ex2(f32(0, 1, 3, -2, -1.5, 0.5, -126, -127, 128, np.inf, -np.inf, np.nan, -0.0))
    assert y[:4].tolist() == [1.0, 2.0, 8.0, 0.25]
    assert y[4] == F32(0.35355335) and y[4] != F32(2 ** -1.5)  # 1 ulp below 2^-1.5
    assert y[5] == F32(1.4142135)
    assert y[6] == F32(2.0 ** -126) and y[7] == 0  # ftz: 2^-127 is subnormal, flushed
    assert y[8] == np.inf and y[9] == np.inf and y[10] == 0 and np.isnan(y[11])
    assert y[12] == 1.0


def test_ex2_is_a_fixed_point_split_of_the_input():
    # inputs that agree in |x| truncated to 2^-23 give the same fraction, scaled by 2^i
    x = f32(0.3, 0.3 + 2 ** -25)
    assert ga.ex2(x)[0] == ga.ex2(x)[1]
    x = f32(5.3)
    assert ga.ex2(x)[0] == ga.ex2(x - F32(5))[0] * 32  # x − 5 is exact in float32
    # negative inputs: their own table, 2^-f for the fraction of |x|, not 2^(1 − f) / 2
    n = f32(-0.25)
    assert ga.ex2(f32(-5.25))[0] == ga.ex2(n)[0] / 32


def _whole_tables(monkeypatch, x):
    """ex2 from the whole measured tables (gpu_approx.table), the form the H200 verified."""
    with monkeypatch.context() as m:
        m.setattr(ga, "ex2_compact", lambda path=None: None)
        with np.errstate(invalid="ignore"):
            return ga.ex2_numpy(x)


def test_ex2_compact_tables_hold_every_measured_entry(monkeypatch):
    """ex2 compiled (where numba is installed) and in numpy, both from the compact tables,
    against the whole tables: every one of the 2^23 fractions of each sign (x = ±f·2^-23,
    exact), every sign and exponent with 2049 mantissas each (the extremes included), the
    range's edges and the special values, in shapes and orders other than flat and
    contiguous."""
    assert ga.ex2_compact() is not None and ga.ex2_compact()[2].nbytes == 2**22
    frac = np.arange(2**23) * 2.0**-23
    rng = np.random.default_rng(7)
    mant = np.concatenate([[0, 1, 2**22, 2**23 - 1], rng.integers(0, 2**23, 2045)])
    sweep = ((np.arange(512, dtype=np.uint32)[:, None] << 23) | mant.astype(np.uint32))
    edges = f32(0, -0.0, 255.99998, -255.99998, 256, -256, 126.5, -126.5, 127.99999,
                -127.99999, 128, -149.5, np.inf, -np.inf, np.nan, -np.nan, 2**-23, -(2**-24))
    for x in [*((s * frac[i:i + 2**21]).astype(F32) for s in (-1, 1)
                for i in range(0, 2**23, 2**21)),
              np.concatenate([sweep.reshape(-1).view(F32), edges])]:
        want = _whole_tables(monkeypatch, x).view(np.int32)
        assert np.array_equal(ga.ex2(x).view(np.int32), want)
        with np.errstate(invalid="ignore"):
            assert np.array_equal(ga.ex2_numpy(x).view(np.int32), want)
    square = x[:1024 * 1024].reshape(1024, 1024)
    assert np.array_equal(ga.ex2(square.T).view(np.int32),
                          want[:1024 * 1024].reshape(1024, 1024).T)
    assert ga.ex2(f32()).shape == (0,) and ga.ex2(F32(-1.5)).shape == ()


def test_lg2_values_and_rounding_toward_zero():
    y = ga.lg2(f32(1, 2, 1024, 2.0 ** 20, 0, -1, np.inf, np.nan, 1e-40))
    assert y[:4].tolist() == [0.0, 1.0, 10.0, 20.0]
    assert y[4] == -np.inf and np.isnan(y[5]) and y[6] == np.inf and np.isnan(y[7])
    assert y[8] == -np.inf  # a subnormal input is flushed to zero
    # x ≥ 1: e + lg2(m), rounded toward zero (|result| never above the float64 sum)
    x = np.linspace(1, 2 ** 20, 10001, dtype=F32)
    e = np.floor(np.log2(x)).astype(np.float64)
    v = e + ga.lg2(x / F32(2) ** e.astype(F32)).astype(np.float64)
    got = ga.lg2(x).astype(np.float64)
    assert np.all(np.abs(got) <= np.abs(v)) and np.all(np.abs(v - got) < 2.0 ** -18)


def test_tanh_structure():
    x = np.linspace(-9, 9, 20001, dtype=F32)
    y = ga.tanh(x)
    assert np.array_equal(ga.tanh(-x), -y)  # odd
    small = f32(1e-3, -2 ** -9, 3e-30)
    assert np.array_equal(ga.tanh(small), small)  # x itself below 2^-8
    assert ga.tanh(f32(8, 100, np.inf)).tolist() == [1.0, 1.0, 1.0]
    err = np.abs(y.astype(np.float64) - np.tanh(x.astype(np.float64)))
    assert err.max() < 2 ** -14 and 0 < np.mean(y != np.tanh(x.astype(np.float64)).astype(F32))
    # the input's low mantissa bits are ignored: 3 of them for x in [1, 2)
    b = f32(1.2345).view(np.int32)
    assert ga.tanh((b & ~7).view(F32)) == ga.tanh((b | 7).view(F32))


def test_rcp_values():
    y = ga.rcp(f32(1, 2, -4, 3, 0, -0.0, np.inf, 1e-40))
    assert y[:3].tolist() == [1.0, 0.5, -0.25]
    assert y[3] == F32(1 / 3) or abs(int(y[3:4].view(np.int32)[0])
                                     - int(f32(1 / 3).view(np.int32)[0])) == 1
    assert y[4] == np.inf and y[5] == -np.inf and y[6] == 0 and y[7] == np.inf


def test_tables_are_small_package_data():
    assert ga.DATA.exists() and ga.DATA.stat().st_size < 2_000_000
    text = (ROOT / "pyproject.toml").read_text()
    assert '"osm_cli.precision" = ["data/*.npz"]' in text


def test_ops_default_to_the_h200_and_rounded_is_the_cpu():
    x = f32(-1.5, 0.7)
    assert np.array_equal(Ops().exp2(x), ga.ex2(x))
    assert np.array_equal(Ops.rounded().exp2(x), np.exp2(x))
    assert Ops().tanh_(f32(0.75))[0] == ga.tanh(f32(0.75))[0]
    assert Ops.rounded().recip(f32(3))[0] == F32(1) / F32(3)


def test_fa4_softcap_capture_reaches_99_percent_by_default():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from captures import load_cases

    from osm_cli.precision.emulate import run_kernel
    from osm_cli.precision.model import model
    from osm_cli.precision.presets import PRESETS

    case = next(c for c in load_cases(ROOT / "samples" / "kernels")
                if c.label == "fa4/bfloat16/softcap")
    a = case.arrays
    q, k, v = (np.asarray(a[n], F32) for n in "qkv")
    out = np.asarray(a["out"], F32)
    shares = {}
    for name, ops in (("default", None), ("rounded", Ops.rounded())):
        r = run_kernel(PRESETS["fa4"], model(case.dtype), q, k, v, trace_at=None, ops=ops,
                       **dict(case.opts))
        shares[name] = float(np.mean(r.out == out))
    assert shares["default"] >= 0.99
    assert shares["rounded"] < 0.98  # 97.7 % before the H200's tanh was modelled
