"""The oracles: stabilized vs naive softmax, the guard for all -inf rows, logsumexp."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

from osm_cli.core.reference import logsumexp, max_abs_diff, naive_softmax, stable_softmax

X = [100.0, 102.0, 99.0]
# softmax([100, 102, 99]) = softmax([1, 3, 0]) = e^(x - 102) / (e^-2 + 1 + e^-3)
_Z = math.exp(-2) + 1 + math.exp(-3)
EXPECTED = [math.exp(-2) / _Z, 1 / _Z, math.exp(-3) / _Z]


def test_expected_values_by_hand():
    """Only differences matter: [100, 102, 99] - 102 = [-2, 0, -3], Z = 1.1851228."""
    np.testing.assert_allclose(EXPECTED, [0.1141952, 0.8437947, 0.0420101], atol=5e-8)


def test_stable_vs_naive_float64():
    """In float64 exp(102) = 1.99e44 fits (limit e^709.78), so naive softmax is fine too."""
    x = np.array(X)
    np.testing.assert_allclose(stable_softmax(x), EXPECTED, rtol=1e-15)
    np.testing.assert_allclose(naive_softmax(x), EXPECTED, rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_naive_overflows_in_small_dtypes(dtype):
    """exp(100) ≈ 2.69e43 > 3.4e38: inf / inf = nan. The stabilized form is unharmed."""
    x = np.array(X, dtype=dtype)
    assert np.isnan(naive_softmax(x).astype(np.float64)).all()
    p = stable_softmax(x).astype(np.float64)
    assert np.isfinite(p).all()
    tol = {np.float32: 1e-6, np.float16: 2e-3, ml_dtypes.bfloat16: 1e-2}[dtype]
    np.testing.assert_allclose(p, EXPECTED, rtol=tol)


def test_naive_overflows_in_float64_from_710():
    x = np.array([710.0, 700.0])
    assert np.isnan(naive_softmax(x)[0])
    np.testing.assert_allclose(stable_softmax(x), [1 / (1 + math.exp(-10)),
                                                   math.exp(-10) / (1 + math.exp(-10))])


def test_guard_on_all_masked_rows():
    """guard=True (osm's default): a row of only -inf gives 0; guard=False the textbook nan."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]])
    guarded = stable_softmax(x)
    np.testing.assert_array_equal(guarded, [[0, 0, 0], [0.5, 0, 0.5]])
    textbook = stable_softmax(x, guard=False)
    assert np.isnan(textbook[0]).all()
    np.testing.assert_array_equal(textbook[1], [0.5, 0, 0.5])
    assert np.isnan(naive_softmax(x[0])).all()  # 0 / 0


def test_guard_is_silent():
    """No RuntimeWarning either way (warnings are errors in this suite, and none is recorded
    here), whatever the row of only −inf gives: 0 guarded, nan unguarded, LSE −inf."""
    x = np.full(4, -np.inf)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        guarded, textbook = stable_softmax(x), stable_softmax(x, guard=False)
        naive, lse = naive_softmax(x), logsumexp(x)
    assert seen == []
    np.testing.assert_array_equal(guarded, np.zeros(4))
    assert np.isnan(textbook).all() and np.isnan(naive).all()
    assert lse == -np.inf


def test_logsumexp_values():
    np.testing.assert_allclose(logsumexp(np.array([2.0, 4.0, 1.0, 3.0])), 4.440189699, atol=5e-10)
    np.testing.assert_allclose(logsumexp(np.array([1.0, 2.0, 5.0, 3.0])), 5.185182453, atol=5e-10)
    # ln(e^0 + e^0) = ln 2; shifting the input shifts the LSE
    assert logsumexp(np.array([0.0, 0.0])) == pytest.approx(math.log(2), rel=1e-15)
    assert logsumexp(np.array([1000.0, 1000.0])) == pytest.approx(1000 + math.log(2), rel=1e-15)
    assert logsumexp(np.array([-1000.0, -np.inf])) == -1000.0
    assert logsumexp(np.array([-np.inf, -np.inf])) == -np.inf
    np.testing.assert_allclose(
        logsumexp(np.array([[0.0, 0.0], [-np.inf, -np.inf], [5.0, -np.inf]])),
        [math.log(2), -np.inf, 5.0],
    )


def test_rows_are_independent():
    x = np.array([[1.0, 2.0, 5.0, 3.0], [2.0, 4.0, 1.0, 3.0]])
    p = stable_softmax(x)
    np.testing.assert_allclose(p.sum(axis=-1), [1, 1], rtol=1e-15)
    np.testing.assert_array_equal(p[1], stable_softmax(x[1]))


def test_max_abs_diff_counts_equal_infinities_as_equal():
    assert max_abs_diff([-np.inf, 1.0, np.inf], [-np.inf, 1.5, np.inf]) == 0.5
    assert max_abs_diff([np.nan], [np.nan]) == 0.0
    assert max_abs_diff([-np.inf], [0.0]) == np.inf
    assert max_abs_diff(np.zeros((0, 3)), np.zeros((0, 3))) == 0.0
