"""The online-softmax core: the worked examples (docs/numerics.md#update-forms) by hand, then
properties.

Exact claims are made in float64 against the one-shot oracles of core/reference.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from osm_cli.core.fold import online_softmax
from osm_cli.core.reference import logsumexp, stable_softmax
from osm_cli.core.state import (
    State,
    block_state,
    combine,
    finalize,
    initial_state,
    merge_step,
    rescale_step,
)
from osm_cli.errors import ShapeError

E = math.exp
FORMS = ("rescale", "merge")
NEG_INF = -math.inf


# ---------------------------------------------------------------------------------------------
# Worked example 1 (docs/numerics.md#update-forms): blocks [2, 4] then [1, 3]


@pytest.mark.parametrize("form", FORMS)
def test_seed_example_max_stays(form):
    """Blocks [2, 4] then [1, 3]: the second block's max is below the running max.

    Start: m = -inf, l = 0.
    Block 0, [2, 4]: m = max(-inf, 4) = 4. The old state is scaled by α = exp(-inf - 4) = 0
      (it is all zero anyway), so l = e^(2-4) + e^(4-4) = e^-2 + 1 = 1.1353353.
    Block 1, [1, 3]: max 3 < 4, so m stays 4 and α = exp(4 - 4) = 1: nothing is rescaled,
      l = 1.1353353 + e^(1-4) + e^(3-4) = e^-2 + e^0 + e^-3 + e^-1 = 1.5530018.
    Final: LSE = 4 + ln 1.5530018 = 4.4401897, p_i = exp(s_i - 4) / 1.5530018.
    """
    t = online_softmax(np.array([2.0, 4.0, 1.0, 3.0]), block=2, form=form)
    first, second = t.steps
    assert (first.block, first.start, first.stop) == (0, 0, 2)
    assert (second.block, second.start, second.stop) == (1, 2, 4)
    assert first.values.tolist() == [2.0, 4.0] and second.values.tolist() == [1.0, 3.0]

    assert first.block_max == 4 and second.block_max == 3
    assert first.m_prev == NEG_INF and first.m == 4
    assert first.alpha == 0
    assert first.l_prev == 0
    assert first.l == pytest.approx(E(-2) + 1, rel=1e-15)
    assert first.l == pytest.approx(1.1353353, abs=5e-8)
    assert not first.rescaled  # m left -inf: there was nothing to scale

    assert second.m_prev == 4 and second.m == 4
    assert second.alpha == 1
    assert not second.rescaled
    assert second.l_prev == first.l
    assert second.l == pytest.approx(E(-2) + E(0) + E(-3) + E(-1), rel=1e-15)
    assert second.l == pytest.approx(1.5530018, abs=5e-8)

    assert t.m == 4
    assert t.l == second.l
    assert t.lse == pytest.approx(4 + math.log(1.5530017927759192), rel=1e-15)
    assert t.lse == pytest.approx(4.440189699, abs=5e-10)
    expected = [E(s - 4) / second.l for s in (2, 4, 1, 3)]
    np.testing.assert_allclose(t.probabilities, expected, rtol=1e-15)
    np.testing.assert_allclose(
        t.probabilities, [0.087144318742, 0.643914259888, 0.0320586032801, 0.23688281809],
        rtol=1e-11,
    )


def test_seed_example_max_stays_merge_statistics():
    """Merge form of [2, 4] | [1, 3]: each block's own m⁽ᵏ⁾, l⁽ᵏ⁾ and the weight w it enters with.

    Block 0: m⁽⁰⁾ = 4, l⁽⁰⁾ = e^-2 + e^0 = 1.1353353; m = max(-inf, 4) = 4, w = e^(4-4) = 1.
    Block 1: m⁽¹⁾ = 3, l⁽¹⁾ = e^(1-3) + e^(3-3) = e^-2 + 1 = 1.1353353 (the same number: both
      blocks are "max and max - 2"); m stays 4, α = 1, w = e^(3-4) = e^-1 = 0.36787944,
      l = 1.1353353·1 + 1.1353353·e^-1 = 1.5530018.
    """
    t = online_softmax(np.array([2.0, 4.0, 1.0, 3.0]), block=2, form="merge")
    first, second = t.steps
    assert first.block_m == 4
    assert first.block_l == pytest.approx(E(-2) + 1, rel=1e-15)
    assert first.block_weight == 1
    assert second.block_m == 3
    assert second.block_l == pytest.approx(E(-2) + 1, rel=1e-15)
    assert second.block_weight == pytest.approx(E(-1), rel=1e-15)
    assert second.block_weight == pytest.approx(0.36787944, abs=5e-9)
    assert second.l == pytest.approx(first.l * second.alpha + second.block_l * E(-1), rel=1e-15)


# ---------------------------------------------------------------------------------------------
# Worked example 2 (docs/numerics.md#update-forms): blocks [1, 2] then [5, 3]


@pytest.mark.parametrize("form", FORMS)
def test_seed_example_max_moves(form):
    """Blocks [1, 2] then [5, 3]: the second block raises the max, so the old sum is rescaled.

    Block 0, [1, 2]: m = 2, l = e^(1-2) + e^(2-2) = e^-1 + 1 = 1.3678794.
    Block 1, [5, 3]: m_new = max(2, 5) = 5, α = exp(2 - 5) = e^-3 = 0.0497871;
      l = 1.3678794·e^-3 + e^(5-5) + e^(3-5) = 0.0681024 + 1 + 0.1353353 = 1.2034380.
    Final: LSE = 5 + ln 1.2034380 = 5.1851825.
    """
    t = online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2, form=form)
    first, second = t.steps
    assert first.block_max == 2 and first.m == 2 and first.m_prev == NEG_INF
    assert first.alpha == 0 and first.l_prev == 0
    assert first.l == pytest.approx(E(-1) + 1, rel=1e-15)
    assert first.l == pytest.approx(1.3678794, abs=5e-8)

    assert second.block_max == 5 and second.m_prev == 2 and second.m == 5
    assert second.alpha == pytest.approx(E(-3), rel=1e-15)
    assert second.alpha == pytest.approx(0.0497871, abs=5e-8)
    assert second.rescaled
    assert second.l_prev == first.l
    assert second.l == pytest.approx((E(-1) + 1) * E(-3) + 1 + E(-2), rel=1e-15)
    assert second.l == pytest.approx(1.2034380, abs=5e-8)

    assert t.m == 5
    assert t.lse == pytest.approx(5.185182453, abs=5e-10)
    np.testing.assert_allclose(
        t.probabilities, [E(s - 5) / second.l for s in (1, 2, 5, 3)], rtol=1e-15
    )


def test_seed_example_max_moves_merge_statistics():
    """Merge form of [1, 2] | [5, 3].

    Block 0: m⁽⁰⁾ = 2, l⁽⁰⁾ = e^-1 + 1 = 1.3678794, w = 1 (it sets the max).
    Block 1: m⁽¹⁾ = 5, l⁽¹⁾ = e^0 + e^-2 = 1.1353353, w = e^(5-5) = 1; the old state gets
      α = e^(2-5) = 0.0497871: l = 1.3678794·0.0497871 + 1.1353353·1 = 1.2034380.
    """
    t = online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2, form="merge")
    first, second = t.steps
    assert first.block_m == 2
    assert first.block_l == pytest.approx(1 + E(-1), rel=1e-15)
    assert first.block_weight == 1
    assert second.block_m == 5
    assert second.block_l == pytest.approx(1 + E(-2), rel=1e-15)
    assert second.block_l == pytest.approx(1.1353353, abs=5e-8)
    assert second.block_weight == 1
    assert second.alpha == pytest.approx(0.049787068367863944, rel=1e-15)
    assert second.l == pytest.approx(1.3678794 * 0.0497871 + 1.1353353, abs=1e-7)


def test_rescale_form_has_no_merge_statistics():
    t = online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2, form="rescale")
    for s in t.steps:
        assert (s.block_m, s.block_l, s.block_weight) == (None, None, None)


def test_uneven_last_block():
    """5 scores in blocks of 2: keys 0:2, 2:4, 4:5; the last block holds one score."""
    t = online_softmax(np.array([1.0, 2.0, 5.0, 3.0, 7.0]), block=2)
    assert [(s.start, s.stop) for s in t.steps] == [(0, 2), (2, 4), (4, 5)]
    assert t.steps[-1].alpha == pytest.approx(E(5 - 7), rel=1e-15)
    assert t.m == 7


def test_steps_are_frozen():
    t = online_softmax(np.array([1.0, 2.0]), block=1)
    with pytest.raises(AttributeError):
        t.steps[0].m = 3.0  # type: ignore[misc]


def test_bad_form_and_block_raise():
    with pytest.raises(ValueError, match="form"):
        online_softmax(np.array([1.0]), 1, "sideways")
    with pytest.raises(ValueError, match="block"):
        online_softmax(np.array([1.0]), 0)


# ---------------------------------------------------------------------------------------------
# The update steps on a batch of rows (what attention reuses)


def test_rescale_and_merge_step_on_a_batch():
    """Two rows at once: row 0 is worked example 1, row 1 worked example 2."""
    first = np.array([[2.0, 4.0], [1.0, 2.0]])
    second = np.array([[1.0, 3.0], [5.0, 3.0]])
    for step in (rescale_step, merge_step):
        up1 = step(initial_state(2), first)
        np.testing.assert_array_equal(up1.block_max, [4, 2])
        np.testing.assert_array_equal(up1.alpha, [0, 0])
        up2 = step(up1.state, second)
        np.testing.assert_array_equal(up2.state.m, [4, 5])
        np.testing.assert_allclose(up2.alpha, [1, E(-3)], rtol=1e-15)
        np.testing.assert_allclose(up2.state.l, [1.5530017927759192, 1.2034379904], rtol=1e-10)
    up = merge_step(initial_state(2), second)
    np.testing.assert_array_equal(up.block_m, [3, 5])
    np.testing.assert_allclose(up.block_l, [1 + E(-2), 1 + E(-2)], rtol=1e-15)


def test_rescale_step_updates_o_like_l():
    """With V, O follows the same α: O / l is softmax(s) · V."""
    s = np.array([[1.0, 2.0, 5.0, 3.0]])
    v = np.arange(8.0).reshape(4, 2)
    state = initial_state(1, dv=2)
    for start in (0, 2):
        state = rescale_step(state, s[:, start : start + 2], v[start : start + 2]).state
    lse, out = finalize(state)
    np.testing.assert_allclose(out, stable_softmax(s) @ v, rtol=1e-14)
    np.testing.assert_allclose(lse, logsumexp(s), rtol=1e-15)


def test_initial_state_is_textbook():
    s = initial_state(3)
    np.testing.assert_array_equal(s.m, [-np.inf] * 3)
    np.testing.assert_array_equal(s.l, [0, 0, 0])
    assert s.o is None
    assert initial_state(2, dv=4).o.shape == (2, 4)


# ---------------------------------------------------------------------------------------------
# Fully masked rows (docs/numerics.md#masked-rows)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("block", [1, 2, 3, 5])
def test_fully_masked_row(form, block):
    """Every score -inf: m stays -inf, l = 0, LSE = -inf, probabilities 0 and never NaN."""
    t = online_softmax(np.full(4, -np.inf), block=block, form=form)
    assert t.m == -np.inf
    assert t.l == 0
    assert t.lse == -np.inf
    np.testing.assert_array_equal(t.probabilities, np.zeros(4))
    for s in t.steps:
        assert s.m == -np.inf and s.l == 0 and s.l_prev == 0
        assert s.alpha in (0.0, 1.0)
        assert not s.rescaled
        if form == "merge":
            assert s.block_m == -np.inf and s.block_l == 0 and s.block_weight in (0.0, 1.0)


@pytest.mark.parametrize("form", FORMS)
def test_masked_row_in_a_matrix(form):
    """samples/matrix.txt: row 2 is fully masked, the others are not disturbed by it."""
    scores = np.array(
        [[2, 4, 1, 3], [1, 2, 5, 3], [-np.inf] * 4, [0.5, -1, -np.inf, 2]], dtype=np.float64
    )
    t = online_softmax(scores, block=2, form=form, row=2)
    assert t.m[2] == -np.inf and t.l[2] == 0 and t.lse[2] == -np.inf
    np.testing.assert_array_equal(t.probabilities[2], 0)
    np.testing.assert_allclose(t.lse[:2], [4.440189699, 5.185182453], atol=5e-10)
    np.testing.assert_allclose(t.probabilities.sum(axis=1), [1, 1, 0, 1], rtol=1e-15)
    assert t.probabilities[3, 2] == 0


@pytest.mark.parametrize("form", FORMS)
def test_masked_prefix_then_scores(form):
    """-inf blocks first: α = exp(-inf - m) = 0 when the first real score arrives, no NaN."""
    s = np.array([-np.inf, -np.inf, -np.inf, 1.5, 0.25])
    t = online_softmax(s, block=2, form=form)
    assert [step.m for step in t.steps] == [-np.inf, 1.5, 1.5]
    assert t.steps[1].alpha == 0 and t.steps[1].l_prev == 0
    assert t.steps[1].l == 1.0  # e^(1.5 - 1.5) alone
    np.testing.assert_allclose(t.probabilities, stable_softmax(s), rtol=1e-15)
    np.testing.assert_array_equal(t.probabilities[:3], 0)


# ---------------------------------------------------------------------------------------------
# Properties


def _finite(lo=-1e300, hi=1e300):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


_entry = st.one_of(
    _finite(),  # anything up to ±1e300
    _finite(-50, 50),  # the range where probabilities are neither 0 nor 1
    _finite(-800, 800),  # around float64's exp limits
    st.just(-np.inf),  # masked
)
vectors = st.one_of(
    st.lists(_entry, min_size=1, max_size=40),
    st.integers(1, 12).map(lambda n: [-np.inf] * n),  # fully masked
).map(lambda xs: np.array(xs, dtype=np.float64))


def _close_lse(got, want):
    """LSE agrees to ~1e-12 of its scale (an absolute floor where the LSE is near 0)."""
    got, want = np.atleast_1d(got), np.atleast_1d(want)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-12, atol=1e-12)


def _check_against_reference(s: np.ndarray, t) -> None:
    p_ref = stable_softmax(s)
    assert not np.isnan(t.probabilities).any()
    assert not np.isnan(np.atleast_1d(t.l)).any() and not np.isnan(np.atleast_1d(t.m)).any()
    np.testing.assert_allclose(t.probabilities, p_ref, rtol=1e-12, atol=1e-300)
    _close_lse(t.lse, logsumexp(s))
    np.testing.assert_array_equal(t.m, s.max(axis=-1))
    masked = np.isneginf(s).all(axis=-1)
    total = np.atleast_1d(t.probabilities.sum(axis=-1))
    np.testing.assert_allclose(total[~np.atleast_1d(masked)], 1.0, rtol=1e-12)
    np.testing.assert_array_equal(total[np.atleast_1d(masked)], 0.0)


@settings(max_examples=300, deadline=None)
@given(s=vectors, data=st.data())
def test_both_forms_match_one_shot(s, data):
    block = data.draw(st.integers(1, len(s) + 2), label="block")
    traces = [online_softmax(s, block, form) for form in FORMS]
    for t in traces:
        _check_against_reference(s, t)
        assert len(t.steps) == -(-len(s) // block)
        for step in t.steps:
            fields = [step.block_max, step.m_prev, step.m, step.alpha, step.l_prev, step.l]
            assert not any(math.isnan(x) for x in fields)
            assert 0 <= step.alpha <= 1
            # after each block the state is the one-shot state of the prefix seen so far
            prefix = s[: step.stop]
            assert step.m == prefix.max()
            ref = 0.0 if prefix.max() == -np.inf else prefix.max()
            assert step.l == pytest.approx(np.exp(prefix - ref).sum(), rel=1e-12, abs=1e-300)
    rescale, merge = traces
    np.testing.assert_allclose(rescale.probabilities, merge.probabilities, rtol=1e-12, atol=1e-300)
    assert rescale.l == pytest.approx(merge.l, rel=1e-12, abs=0)


@settings(max_examples=100, deadline=None)
@given(s=vectors, data=st.data())
def test_any_block_order_gives_the_same_result(s, data):
    """Folding the blocks in any order changes nothing: the merge is commutative
    (docs/numerics.md#order)."""
    block = data.draw(st.integers(1, len(s) + 2), label="block")
    count = -(-len(s) // block)
    order = np.array(data.draw(st.permutations(range(count)), label="order"))
    for form in FORMS:
        t = online_softmax(s, block, form, order=order)
        assert [st_.block for st_ in t.steps] == order.tolist()
        _check_against_reference(s, t)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(vectors, min_size=1, max_size=5).filter(
        lambda vs: len({len(v) for v in vs}) == 1
    ) | st.integers(1, 5).flatmap(
        lambda r: st.integers(1, 12).flatmap(
            lambda n: st.lists(
                st.lists(_entry, min_size=n, max_size=n), min_size=r, max_size=r
            )
        )
    ).map(lambda vs: [np.array(v, dtype=np.float64) for v in vs]),
    data=st.data(),
)
def test_matrix_rows_equal_vector_runs(rows, data):
    """A 2-D input gives each row exactly what that row alone gives (rows are independent)."""
    mat = np.stack(rows)
    block = data.draw(st.integers(1, mat.shape[1] + 2), label="block")
    r = data.draw(st.integers(0, mat.shape[0] - 1), label="row")
    for form in FORMS:
        t = online_softmax(mat, block, form, row=r)
        assert t.m.shape == t.l.shape == t.lse.shape == (mat.shape[0],)
        assert t.probabilities.shape == mat.shape
        _check_against_reference(mat, t)
        for i, row in enumerate(mat):
            one = online_softmax(row, block, form)
            np.testing.assert_array_equal(t.m[i], one.m)
            np.testing.assert_allclose(t.l[i], one.l, rtol=1e-15, atol=0)
            np.testing.assert_allclose(t.probabilities[i], one.probabilities, rtol=1e-15, atol=0)
            if i == r:
                for a, b in zip(t.steps, one.steps, strict=True):
                    np.testing.assert_array_equal(a.values, b.values)
                    assert (a.block_max, a.m_prev, a.m, a.alpha) == (
                        b.block_max, b.m_prev, b.m, b.alpha
                    )
                    assert a.l == pytest.approx(b.l, rel=1e-15, abs=0)


def _state(xs: np.ndarray) -> State:
    return block_state(xs[None, :])


states = vectors.map(_state)


@settings(max_examples=200, deadline=None)
@given(a=states, b=states, c=states)
def test_combine_commutative_associative(a, b, c):
    ab, wa, wb = combine(a, b)
    ba, wb2, wa2 = combine(b, a)
    # commutative exactly: max and a two-term sum do not depend on the order
    np.testing.assert_array_equal(ab.m, ba.m)
    np.testing.assert_array_equal(ab.l, ba.l)
    np.testing.assert_array_equal(wa, wa2)
    np.testing.assert_array_equal(wb, wb2)
    for w in (wa, wb):
        assert ((w >= 0) & (w <= 1)).all()
    # associative up to rounding
    left = combine(combine(a, b)[0], c)[0]
    right = combine(a, combine(b, c)[0])[0]
    np.testing.assert_array_equal(left.m, right.m)
    np.testing.assert_allclose(left.l, right.l, rtol=1e-14, atol=0)
    assert not np.isnan(left.l).any() and not np.isnan(left.m).any()


@settings(max_examples=100, deadline=None)
@given(a=states)
def test_empty_state_is_the_identity_of_combine(a):
    empty = initial_state(1)
    for merged in (combine(empty, a)[0], combine(a, empty)[0]):
        np.testing.assert_array_equal(merged.m, a.m)
        np.testing.assert_array_equal(merged.l, a.l)


def test_lazy_rescale_threshold_keeps_the_result():
    """FA4's lazy rescale (threshold τ): m lags the max by at most τ, the result is unchanged."""
    s = np.array([0.0, 1.0, 2.5, 3.0, 7.0, 7.5, 20.0, 19.0])
    exact = online_softmax(s, 2)
    lazy = online_softmax(s, 2, threshold=3.0)
    assert sum(st_.rescaled for st_ in lazy.steps) < sum(st_.rescaled for st_ in exact.steps)
    np.testing.assert_allclose(lazy.probabilities, exact.probabilities, rtol=1e-13)
    assert lazy.lse == pytest.approx(exact.lse, rel=1e-14)


def test_module_is_pure():
    """The core imports neither rich nor typer (lint-imports enforces it for every layer)."""
    import inspect

    import osm_cli.core.fold as fold
    import osm_cli.core.record as record
    import osm_cli.core.state as state

    for module in (state, record, fold):
        source = inspect.getsource(module)
        assert "import rich" not in source and "from rich" not in source
        assert "typer" not in source


@pytest.mark.parametrize("form", FORMS)
def test_full_float64_range_without_warnings(form):
    t = online_softmax(np.array([1e308, -1e308]), 1, form)  # warnings are errors here
    np.testing.assert_array_equal(t.probabilities, [1, 0])


def test_trace_counts_rescales_over_every_row():
    """Row [1, 2 | 5, 3]: m moves 2 → 5 at block 1 (one rescale; -inf → 2 is none). Row
    [2, 4 | 1, 3]: m stays 4 (none). Row [-inf, -inf | 0, 1]: -inf → 1 is no rescale."""
    s = np.array([[1.0, 2.0, 5.0, 3.0], [2.0, 4.0, 1.0, 3.0], [-np.inf, -np.inf, 0.0, 1.0]])
    assert online_softmax(s, 2).rescales == 1
    assert online_softmax(s, 2, "merge").rescales == 1
    assert online_softmax(s, 1).rescales == 1 + 1 + 1 + 1  # 1→2, 2→5; 2→4; 0→1


@pytest.mark.parametrize("scores", [[[[]]], [[[1.0]]], np.zeros((2, 3, 4))])
def test_scores_of_three_axes_are_refused(scores):
    """online_softmax takes a row or rows: a 3-D input is a ShapeError naming its shape, not
    numpy's unpacking error from the fast fold (found by the hypothesis fuzz test)."""
    with pytest.raises(ShapeError, match=r"scores must be one row \(1-D\) or rows \(2-D\), not "
                                         r"3-D of shape \("):
        online_softmax(scores)
