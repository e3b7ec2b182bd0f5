"""Dtypes, their exp limits (docs/numerics.md#dtype-limits), and the overflow demo's numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from osm_cli.errors import OsmError
from osm_cli.precision.dtypes import DTYPES, limits, resolve_dtype
from osm_cli.studies.overflow import overflow_demo

# docs/numerics.md#dtype-limits: largest finite (3 digits, as text: 1.80e308 itself is beyond
# float64), exp overflows above, exp underflows to 0 below
TABLE = {
    "float64": ("1.80e+308", 709.78, -745.13),
    "float32": ("3.40e+38", 88.72, -103.97),
    "bfloat16": ("3.39e+38", 88.72, -92.88),
    "float16": ("6.55e+04", 11.09, -17.33),
    "float8_e4m3fn": ("4.48e+02", 6.10, -6.93),
    "float8_e5m2": ("5.73e+04", 10.96, -11.78),
}


def test_every_dtype_is_in_the_table():
    assert set(DTYPES) == set(TABLE)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_limits_match_numerics_table(name):
    biggest, over, under = TABLE[name]
    lim = limits(DTYPES[name])
    assert f"{lim.max_finite:.2e}" == biggest
    assert round(lim.overflow_at, 2) == over
    assert round(lim.underflow_at, 2) == under
    if name in ("float16", "float8_e4m3fn", "float8_e5m2"):
        assert lim.max_finite == {"float16": 65504, "float8_e4m3fn": 448,
                                  "float8_e5m2": 57344}[name]


@pytest.mark.parametrize("name", ["float64", "float32", "float16"])
def test_limits_are_where_exp_really_breaks(name):
    """Just below the overflow limit exp is finite, just above it is inf; likewise for 0."""
    dt = DTYPES[name]
    lim = limits(dt)
    with np.errstate(over="ignore", under="ignore"):
        for x, finite in ((lim.overflow_at * (1 - 1e-3), True), (lim.overflow_at * (1 + 1e-3),
                                                                  False)):
            assert bool(np.isfinite(np.exp(np.array(x, dtype=np.float64)).astype(dt))) == finite
        assert np.exp(np.array(lim.underflow_at * (1 + 1e-3)).astype(dt)) == 0
        assert np.exp(np.array(lim.underflow_at * (1 - 1e-3)).astype(dt)) > 0


@pytest.mark.parametrize(
    "alias, name",
    [
        ("fp64", "float64"), ("double", "float64"), ("f64", "float64"),
        ("fp32", "float32"), ("single", "float32"), ("f32", "float32"),
        ("fp16", "float16"), ("half", "float16"), ("f16", "float16"),
        ("bf16", "bfloat16"), ("BF16", "bfloat16"), ("bfloat16", "bfloat16"),
        ("e4m3", "float8_e4m3fn"), ("fp8_e4m3", "float8_e4m3fn"),
        ("float8_e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2"), ("fp8_e5m2", "float8_e5m2"),
        ("Float32", "float32"),
    ],
)
def test_resolve_dtype_aliases(alias, name):
    canonical, dtype = resolve_dtype(alias)
    assert canonical == name
    assert dtype == DTYPES[name]


def test_resolve_dtype_unknown():
    with pytest.raises(OsmError) as info:
        resolve_dtype("float7")
    msg = str(info.value)
    assert msg.startswith("unknown dtype 'float7'; known: ")
    assert "bfloat16" in msg and "bf16" in msg


# ---------------------------------------------------------------------------------------------
# overflow_demo

_Z = math.exp(-2) + 1 + math.exp(-3)
SOFTMAX = [math.exp(-2) / _Z, 1 / _Z, math.exp(-3) / _Z]  # softmax([100, 102, 99])


def test_overflow_demo_default():
    demo = overflow_demo()
    assert demo.values.tolist() == [100, 102, 99]
    rows = {r.dtype: r for r in demo.rows}
    assert list(rows) == ["float16", "bfloat16", "float32", "float64"]
    for name in ("float16", "bfloat16", "float32"):
        r = rows[name]
        assert np.isinf(r.exp).all()  # exp(99) already overflows these
        assert np.isnan(r.naive).all()  # inf / inf
        assert np.isfinite(r.stable).all() and np.isfinite(r.online).all()
        assert r.stable.sum() == pytest.approx(1, abs=1e-2)
    f64 = rows["float64"]
    np.testing.assert_allclose(f64.exp, [math.exp(100), math.exp(102), math.exp(99)], rtol=1e-15)
    np.testing.assert_allclose(f64.naive, SOFTMAX, rtol=1e-14)
    np.testing.assert_allclose(f64.stable, [0.1141952, 0.8437947, 0.0420101], atol=5e-8)
    np.testing.assert_allclose(f64.stable, SOFTMAX, rtol=1e-15)
    np.testing.assert_allclose(f64.online, SOFTMAX, rtol=1e-15)
    np.testing.assert_allclose(rows["float32"].online, SOFTMAX, rtol=1e-6)
    np.testing.assert_allclose(rows["float16"].online, SOFTMAX, rtol=2e-3)
    np.testing.assert_allclose(rows["bfloat16"].online, SOFTMAX, rtol=1e-2)
    assert f64.overflow_at == pytest.approx(709.78, abs=5e-3)
    assert rows["float16"].overflow_at == pytest.approx(11.09, abs=5e-3)


def test_overflow_demo_note():
    note = overflow_demo().overflow_note
    assert "float16 above 11.09, bfloat16 above 88.72, float32 above 88.72" in note
    assert "exp(102) does not fit" in note
    assert "float64 (fails above 709.78)" in note


def test_overflow_demo_masked_row():
    """All -inf: naive 0/0 = nan, the textbook stabilized (-inf)-(-inf) = nan, osm 0."""
    masked = {name: (p, why) for name, p, why in overflow_demo().masked}
    assert list(masked) == ["naive", "stabilized (textbook)", "online (osm)"]
    assert np.isnan(masked["naive"][0]).all()
    assert np.isnan(masked["stabilized (textbook)"][0]).all()
    np.testing.assert_array_equal(masked["online (osm)"][0], [0, 0, 0])
    assert "0 / 0" in masked["naive"][1]


def test_overflow_demo_small_values_fit_everywhere():
    """[1, 2, 3]: exp fits in every dtype, so naive works in all four."""
    demo = overflow_demo([1.0, 2.0, 3.0])
    for r in demo.rows:
        assert np.isfinite(r.naive).all()
        np.testing.assert_allclose(r.naive, r.stable, rtol=1e-2)
    assert "Naive softmax computes exp(x) first" not in demo.overflow_note


def test_overflow_demo_float16_only_breaks_above_11():
    """[10, 12, 9]: exp(12) = 162755 > 65504 breaks float16 alone."""
    demo = overflow_demo([10.0, 12.0, 9.0])
    broken = [r.dtype for r in demo.rows if np.isnan(r.naive).any()]
    assert broken == ["float16"]
    assert "exp(12) does not fit" in demo.overflow_note


def test_overflow_demo_value_beyond_float16_range():
    demo = overflow_demo([70000.0, 1.0])  # warnings are errors in this suite
    if not all(np.isfinite(r.online).all() for r in demo.rows):
        assert "every dtype gives a finite answer" not in demo.overflow_note


def test_overflow_demo_all_masked_values_note():
    note = overflow_demo([-math.inf, -math.inf]).overflow_note
    assert "does not fit" not in note
