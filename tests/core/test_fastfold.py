"""core/fastfold.py's vectorized fold against the textbook loop (core/fold.py's Folding, one
state.rescale_step a block), bit for bit: every m, α, l of every step, the final state of every
row and the rescale count, compared with exact equality (of the bits: −0.0 is not 0.0 here).

Hand-picked: every block size 1..300 with a partial last block, −inf entries, rows of only
−inf, 1-D and 2-D inputs, huge and tiny magnitudes, ±0, chunks smaller than a block, and sorted
rows (every block moves m). Hypothesis: random matrices of the same kinds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from osm_cli.core.fastfold import EagerFold, eligible
from osm_cli.core.fold import Folding, online_softmax
from osm_cli.core.record import StepColumns

FIELDS = ("block", "start", "stop", "block_max", "m_prev", "m", "alpha", "l_prev", "l")


def bits(x) -> np.ndarray:
    """The bytes of x, so that equality is of the bits (−0.0 differs from 0.0)."""
    return np.ascontiguousarray(x).view(np.uint8)


def assert_same_fold(scores: np.ndarray, block: int, row: int = 0, chunk: int | None = None):
    """EagerFold and the textbook Folding agree exactly on `scores` in blocks of `block`."""
    s2 = np.atleast_2d(scores)
    textbook = Folding(scores, block, row=row)
    steps = list(textbook)
    fast = EagerFold(s2, block, row, **({} if chunk is None else {"chunk": chunk}))
    parts = list(fast)
    assert sum(map(len, parts)) == len(steps) == -(-s2.shape[1] // block)
    if steps:
        got, want = StepColumns.concat(parts), StepColumns.from_steps(steps)
        for name in FIELDS:
            a = getattr(got, name)
            b = getattr(want, name).astype(a.dtype)  # from_steps holds float64
            assert bits(a).tobytes() == bits(b).tobytes(), name
    assert bits(fast.state.m).tobytes() == bits(textbook.state.m).tobytes()
    assert bits(fast.state.l).tobytes() == bits(textbook.state.l).tobytes()
    assert fast.rescales == textbook.rescales


def _kinds(rng, shape, kind):
    if kind == "normal":
        return rng.standard_normal(shape) * 4
    if kind == "huge":
        return rng.standard_normal(shape) * 1e300
    if kind == "tiny":
        return rng.standard_normal(shape) * 1e-300
    if kind == "wide":  # exponents that underflow exp(s − m) to 0 next to ones that do not
        return rng.standard_normal(shape) * 800
    if kind == "zeros":
        return rng.choice([0.0, -0.0, 1.0, -np.inf], size=shape)
    if kind == "sorted":  # every block moves the running max
        return np.sort(rng.standard_normal(shape), axis=-1)
    raise ValueError(kind)


KINDS = ("normal", "huge", "tiny", "wide", "zeros", "sorted")


@pytest.mark.parametrize("block", range(1, 301))
def test_every_block_size_1_to_300(block):
    """Per block size: a vector with a partial last block and a matrix with a row of only
    −inf and −inf entries, in one chunk and in chunks of a few blocks."""
    rng = np.random.default_rng(block)
    kind = KINDS[block % len(KINDS)]
    vec = _kinds(rng, (3 * block + block // 2 + 1,), kind)
    vec[rng.random(vec.shape) < 0.1] = -np.inf
    assert_same_fold(vec, block)
    mat = _kinds(rng, (3, 4 * block + 1), kind)
    mat[1] = -np.inf
    mat[2, rng.random(mat.shape[1]) < 0.3] = -np.inf
    assert_same_fold(mat, block, row=2)
    assert_same_fold(mat, block, row=1, chunk=2 * block)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("block", [1, 2, 3, 7, 8, 9, 64, 128, 129])
def test_kinds_dtypes_and_rows(kind, dtype, block):
    rng = np.random.default_rng(block)
    s = _kinds(rng, (17, 9 * block + 5), kind)
    big = float(np.finfo(dtype).max) / 10  # osm refuses +inf, so no finite score may become it
    s = np.where(np.isneginf(s), s, np.clip(s, -big, big)).astype(dtype)
    s[3] = -np.inf
    s[5, : 4 * block] = -np.inf  # a row whose first blocks are fully masked
    for row in (0, 3, 5, 16):
        assert_same_fold(s, block, row=row)
    assert_same_fold(s, block, row=5, chunk=1)  # a chunk smaller than a block: one at a time


def test_shorter_than_one_block_and_one_score():
    assert_same_fold(np.array([1.0, 2.0, 3.0]), 5)
    assert_same_fold(np.array([-np.inf]), 1)
    assert_same_fold(np.array([[-np.inf, -np.inf], [0.0, -0.0]]), 4, row=1)


def test_the_block_max_of_minus_and_plus_zero_is_plus_zero():
    """The flake of issue 20: scores [−1]·15 + [−0.0, 0.0] + [−1]·3 in blocks of 5. numpy's max
    returns whichever zero its loop meets first (the textbook fold said −0.0, the eager one 0.0
    on some runs). osm decides +0.0, as IEEE 754-2019's maximum (−0 < +0), in state.block_max,
    which every fold calls: the textbook and eager folds, the merge form, the fused attention
    step. Every order of the two zeros, both float dtypes, short and long blocks."""
    from osm_cli.core.state import block_max, initial_state, merge_step, rescale_step
    from osm_cli.flash.fast import _Tile

    s = np.array([-1.0] * 15 + [-0.0, 0.0] + [-1.0] * 3)
    for offset in range(8):  # numpy's SIMD loops split a row by where it lies in memory
        buf = np.empty(len(s) + 8)
        at = buf[offset:offset + len(s)]
        at[:] = s
        assert_same_fold(at, 5)
        last = online_softmax(at, 5).steps[-1]
        assert (last.block_max, last.m) == (0.0, 0.0)
        assert not np.signbit(last.block_max) and not np.signbit(last.m)
    for dtype in (np.float64, np.float32):
        for zeros in ([-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0], [-0.0] * 9 + [0.0] + [-0.0] * 7):
            row = np.array([[-np.inf, *zeros]], dtype=dtype)
            assert not np.signbit(block_max(row)).any()
            start = initial_state(1, dtype=dtype)
            for step in (rescale_step, merge_step):
                up = step(start, row)
                assert not np.signbit(up.block_max).any() and not np.signbit(up.state.m).any()
            tile = _Tile((1, 1), 1, np.dtype(dtype))
            tile.step(slice(None), row[None].copy(), np.ones((1, row.shape[1], 1), dtype),
                      0.0, None)
            assert not np.signbit(tile.block_max).any() and not np.signbit(tile.m_new).any()
            assert_same_fold(np.tile(row, (2, 3)), row.shape[1])


def test_long_vector_over_several_chunks():
    """A vector of 10⁶ scores in blocks of 2 (the JSON benchmark's block) and of 128, over the
    default chunk of 2^20 scores and past it."""
    s = np.random.default_rng(0).standard_normal(1_000_003)
    assert_same_fold(s, 2, chunk=1 << 16)
    assert_same_fold(s, 128)


matrices = hnp.arrays(
    np.float64,
    hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=40),
    elements=st.one_of(
        st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
        st.sampled_from([-np.inf, 0.0, -0.0, 1e-300, -1e-300, 709.0, -745.0]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(s=matrices, data=st.data())
def test_any_input_any_block(s, data):
    s2 = np.atleast_2d(s)
    block = data.draw(st.integers(1, s2.shape[1] + 3), label="block")
    row = data.draw(st.integers(0, s2.shape[0] - 1), label="row")
    chunk = data.draw(st.sampled_from([1, block, 3 * block, 1 << 20]), label="chunk")
    assert_same_fold(s, block, row=row, chunk=chunk)


def test_online_softmax_keeps_the_first_and_last_steps():
    """keep=K through the columns: the same first and last K Step records (values included)
    as the whole trace, and the same final state."""
    s = np.random.default_rng(1).standard_normal(1000)
    whole = online_softmax(s, 3)
    ends = online_softmax(s, 3, keep=5, with_probabilities=False)
    assert ends.step_count == whole.step_count == 334
    assert len(ends.steps) == 10
    for a, b in zip(ends.steps, whole.steps[:5] + whole.steps[-5:], strict=True):
        assert a.values.tolist() == b.values.tolist()
        assert {k: v for k, v in vars(a).items() if k != "values"} == \
            {k: v for k, v in vars(b).items() if k != "values"}
    assert ends.l == whole.l and ends.rescales == whole.rescales


def test_what_runs_the_textbook_loop():
    s = np.zeros((1, 4))
    assert eligible(s, "rescale", None, 0.0)
    assert not eligible(s, "merge", None, 0.0)
    assert not eligible(s, "rescale", np.arange(2), 0.0)
    assert not eligible(s, "rescale", None, 2.0)
    assert not eligible(s.astype(np.float16), "rescale", None, 0.0)
