"""Split-KV merge (docs/numerics.md#split-kv-merge) and merges of online states: by hand, then
against the unsplit one-shot softmax in float64, then `osm merge` from files (exit codes and
messages).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import osm
from osm_cli.core import merge_partials
from osm_cli.core.merge import fold_merge, merge_detail, partials, tree_merge
from osm_cli.core.reference import logsumexp, stable_softmax
from osm_cli.core.state import block_state, finalize
from osm_cli.errors import InputError, ShapeError
from osm_cli.reports.merge import merge_report, split_stats
from osm_cli.studies.order import block_order, order_check

LN2 = math.log(2)


# ---------------------------------------------------------------------------------------------
# By hand


def test_two_splits_by_hand():
    """O_0 = [1, 0] with LSE ln 3, O_1 = [0, 1] with LSE ln 1 = 0.

    L = ln(3 + 1) = ln 4; weights exp(ln 3 − ln 4) = 3/4 and exp(0 − ln 4) = 1/4,
    so out = 3/4·[1, 0] + 1/4·[0, 1] = [0.75, 0.25].
    """
    out, lse = merge_partials([[1.0, 0.0], [0.0, 1.0]], [math.log(3), 0.0])
    assert out.tolist() == [0.75, 0.25]
    assert lse == pytest.approx(math.log(4), abs=1e-15)


def test_equal_lse_averages():
    """Equal LSEs weigh 1/2 each: [1] and [3] average to 2, and L = LSE + ln 2."""
    m = merge_detail([[1.0], [3.0]], [5.0, 5.0])
    assert m.out.tolist() == [2.0]
    assert m.lse == pytest.approx(5 + math.log(2), abs=1e-15)
    assert m.weights.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("marker", [-math.inf, math.inf])
def test_empty_split_has_weight_zero(marker):
    """An empty split (LSE -inf, or +inf as FA2 writes it) adds nothing, even a garbage O."""
    m = merge_detail([[0.2, 0.8], [math.nan, 1e300]], [1.5, marker])
    assert m.out.tolist() == [0.2, 0.8]
    assert float(m.lse) == 1.5
    assert m.weights.tolist() == [1.0, 0.0]
    assert m.empty.tolist() == [False, True]


def test_all_empty_gives_zero_and_neg_inf():
    """Every split empty: O = 0, LSE = -inf, weights 0; no NaN and no warning."""
    outs = np.zeros((3, 2, 4))
    lses = np.array([[-np.inf, np.inf], [np.inf, -np.inf], [-np.inf, -np.inf]])
    m = merge_detail(outs, lses)
    assert m.out.tolist() == np.zeros((2, 4)).tolist()
    assert m.lse.tolist() == [-math.inf, -math.inf]
    assert not np.isnan(m.weights).any() and m.weights.sum() == 0


def test_rows_mix_empty_and_full():
    """Row 0 sees both splits, row 1 only split 1; row 1's O is split 1's O exactly."""
    outs = np.array([[[1.0], [7.0]], [[3.0], [2.0]]])  # (S=2, rows=2, dv=1)
    lses = np.array([[0.0, -np.inf], [0.0, 4.0]])
    out, lse = merge_partials(outs, lses)
    assert out[:, 0].tolist() == [2.0, 2.0]
    assert lse[0] == pytest.approx(math.log(2), abs=1e-15) and lse[1] == 4.0


def test_base_two():
    """FlashInfer's log2 LSE: 2^1 + 2^1 = 2^2, so L = 2 (base 2), weights 1/2 each."""
    out, lse = merge_partials([[1.0], [3.0]], [1.0, 1.0], lse_base="2")
    assert out.tolist() == [2.0] and float(lse) == 2.0
    rng = np.random.default_rng(3)
    o, l2 = rng.normal(size=(5, 7, 4)), rng.normal(size=(5, 7)) * 10
    out2, lse2 = merge_partials(o, l2, "2")
    oute, lsee = merge_partials(o, l2 * LN2, "e")
    np.testing.assert_allclose(out2, oute, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lse2 * LN2, lsee, rtol=1e-14)


def test_list_and_stacked_agree():
    rng = np.random.default_rng(0)
    o, l = rng.normal(size=(4, 3, 2)), rng.normal(size=(4, 3))
    a = merge_partials(list(o), list(l))
    b = merge_partials(o, l)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_bad_inputs_raise():
    with pytest.raises(ShapeError, match="leading shape"):
        merge_partials(np.zeros((2, 3, 4)), np.zeros((2, 4)))
    with pytest.raises(ShapeError, match="different shapes"):
        merge_partials([np.zeros((3, 4)), np.zeros((2, 4))], [np.zeros(3), np.zeros(2)])
    with pytest.raises(InputError, match="NaN"):
        merge_partials([[1.0], [2.0]], [0.0, math.nan])
    with pytest.raises(InputError, match="lse_base"):
        merge_partials([[1.0]], [0.0], lse_base="10")


# ---------------------------------------------------------------------------------------------
# Against the unsplit softmax, S = 1 … 97


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(2024)
    s = rng.normal(size=(6, 64)) * 4
    s[1, 10:40] = -np.inf  # a masked run: some splits of row 1 are empty
    s[2, :] = -np.inf  # a fully masked row
    v = rng.normal(size=(64, 5))
    return s, v, stable_softmax(s) @ v, logsumexp(s)


@pytest.mark.parametrize("splits", range(1, 98))
def test_split_counts_match_unsplit(problem, splits):
    """1 to 97 splits of 64 keys (so from 65 on some splits have no key at all)."""
    s, v, ref_out, ref_lse = problem
    outs, lses = partials(s, v, splits)
    assert outs.shape == (splits, 6, 5)
    out, lse = merge_partials(outs, lses)
    assert np.abs(out - ref_out).max() <= 2e-15
    live = np.isfinite(ref_lse)
    assert np.abs(lse[live] - ref_lse[live]).max() <= 4e-15
    assert out[2].tolist() == [0.0] * 5 and lse[2] == -math.inf  # the masked row
    if splits > 64:
        assert np.isneginf(lses).any()  # empty chunks were really there


def test_partials_more_splits_than_keys():
    outs, lses = partials(np.array([[1.0, 2.0]]), np.eye(2), 4)
    assert np.isneginf(lses).sum() == 2  # two of the four chunks have no key
    out, lse = merge_partials(outs, lses)
    e1, e2 = math.exp(1), math.exp(2)
    np.testing.assert_allclose(out[0], [e1 / (e1 + e2), e2 / (e1 + e2)], rtol=1e-15)
    assert lse[0] == pytest.approx(math.log(e1 + e2), rel=1e-15)


def test_split_stats_counts():
    lses = np.array([[0.0, -np.inf, np.inf], [0.0, 1.0, -np.inf]])
    m = merge_detail(np.zeros((2, 3, 1)), lses)
    a, b = split_stats(m, lses)
    assert (a.rows, a.empty, a.pos_inf) == (3, 2, 1)
    assert (b.rows, b.empty, b.pos_inf) == (3, 1, 0)
    assert (a.lse_min, a.lse_max) == (0.0, 0.0) and (b.lse_min, b.lse_max) == (0.0, 1.0)
    # row 0: weights 1/2, 1/2; row 1: 0 and 1; row 2 is empty everywhere (left out of ranges)
    assert (a.weight_min, a.weight_max, a.weight_mean) == (0.0, 0.5, 0.25)
    assert (b.weight_min, b.weight_max, b.weight_mean) == (0.5, 1.0, 0.75)


# ---------------------------------------------------------------------------------------------
# Merges of online states: order and grouping


def _states(s, block, v=None):
    return [block_state(s[:, a:a + block], None if v is None else v[a:a + block])
            for a in range(0, s.shape[1], block)]


def test_tree_and_fold_by_hand():
    """Blocks [2, 4] and [1, 3] (seed example): both merges give m = 4, l = 1.5530018."""
    s = np.array([[2.0, 4.0, 1.0, 3.0]])
    for st_ in (tree_merge(_states(s, 2)), fold_merge(_states(s, 2))):
        assert st_.m[0] == 4
        assert st_.l[0] == pytest.approx(math.exp(-2) + 1 + math.exp(-3) + math.exp(-1), rel=1e-15)


def test_tree_merge_odd_count_and_empty():
    with pytest.raises(InputError):
        tree_merge([])
    s = np.array([[0.0, 1.0, 2.0, 3.0, 4.0]])
    lse, _ = finalize(tree_merge(_states(s, 1)))
    assert lse[0] == pytest.approx(logsumexp(s)[0], rel=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40), block=st.integers(1, 9), seed=st.integers(0, 2**32 - 1),
    masked=st.floats(0, 0.6),
)
def test_any_order_any_grouping(n, block, seed, masked):
    """Any permutation of the block states, folded or merged pairwise, gives the one-shot
    softmax (and output) to rounding in float64; masked scores never make NaN."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(3, n)) * 5
    s[rng.random(s.shape) < masked] = -np.inf
    v = rng.normal(size=(n, 2))
    states = _states(s, block, v)
    perm = rng.permutation(len(states))
    shuffled = [states[i] for i in perm]
    ref_lse = logsumexp(s)
    ref_out = stable_softmax(s) @ v
    for st_ in (fold_merge(states), fold_merge(shuffled), tree_merge(shuffled)):
        lse, out = finalize(st_)
        assert not np.isnan(out).any()
        live = np.isfinite(ref_lse)
        assert np.array_equal(np.isneginf(lse), ~live)
        np.testing.assert_allclose(lse[live], ref_lse[live], rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-14)


def test_block_order():
    assert block_order(4, "forward").tolist() == [0, 1, 2, 3]
    assert block_order(4, "reverse").tolist() == [3, 2, 1, 0]
    a, b = block_order(10, "shuffle", 7), block_order(10, "shuffle", 7)
    assert a.tolist() == b.tolist() and sorted(a.tolist()) == list(range(10))
    assert block_order(10, "shuffle", 8).tolist() != a.tolist()
    with pytest.raises(InputError, match="order"):
        block_order(3, "sideways")


def test_order_check_rounding_level():
    s = np.random.default_rng(1).normal(size=(5, 50)) * 6
    c = order_check(s, 3, "rescale", "shuffle", 11)
    assert c.p_order <= 1e-15 and c.p_tree <= 1e-15 and c.p_order_tree <= 1e-15
    assert c.lse_order <= 1e-14 and c.lse_tree <= 1e-14
    assert sorted(c.indices.tolist()) == list(range(17))


# ---------------------------------------------------------------------------------------------
# osm merge


def _write(tmp_path, outs, lses, dtype=np.float64):
    files = []
    for n, (o, l) in enumerate(zip(outs, lses, strict=True)):
        np.save(tmp_path / f"o{n}.npy", np.asarray(o, dtype=dtype))
        np.save(tmp_path / f"l{n}.npy", np.asarray(l, dtype=dtype))
        files += [str(tmp_path / f"o{n}.npy"), str(tmp_path / f"l{n}.npy")]
    return files


def test_cli_merge_writes_files(runner, tmp_path):
    """Row 0 is the hand example (3/4, 1/4); row 1 is empty in split 0 (FA2's +inf)."""
    outs = [[[1.0, 0.0], [9.0, 9.0]], [[0.0, 1.0], [0.5, 0.5]]]
    lses = [[math.log(3), math.inf], [0.0, 2.0]]
    files = _write(tmp_path, outs, lses, np.float32)
    r = osm("merge", *files, "--out", tmp_path / "o.npy", "--lse", tmp_path / "lse.npy")
    assert r.exit_code == 0, r.stderr
    o, lse = np.load(tmp_path / "o.npy"), np.load(tmp_path / "lse.npy")
    assert o.dtype == np.float32 and lse.dtype == np.float32  # the inputs' dtype
    assert o.tolist() == [[0.75, 0.25], [0.5, 0.5]]
    assert lse.tolist() == pytest.approx([math.log(4), 2.0], rel=1e-7)
    assert "wrote" in r.stderr
    assert "1/2" in r.stdout  # split 0 is empty on one of its two rows
    assert "0.75" in r.stdout


def test_cli_merge_wrote_lines_stay_whole(runner, tmp_path):
    """Each 'wrote FILE (shape)' line is one line, however long the path (scripts read it)."""
    files = _write(tmp_path, [[[1.0, 0.0]], [[0.0, 1.0]]], [[0.0], [0.0]])
    deep = tmp_path / ("a-folder-with-a-long-name-" * 4)
    deep.mkdir()
    o, lse = deep / "merged-output.npy", deep / "merged-lse.npy"
    r = osm("merge", *files, "--out", o, "--lse", lse)
    assert r.exit_code == 0, r.stderr
    assert r.stderr == f"wrote {o} (1, 2)\nwrote {lse} (1,)\n"


def test_cli_merge_json_base2(runner, tmp_path, strict_json):
    files = _write(tmp_path, [[[1.0]], [[3.0]]], [[1.0], [1.0]])
    r = osm("merge", *files, "--lse-base", "2", "--json")
    assert r.exit_code == 0, r.stderr
    doc = strict_json(r.stdout)
    assert doc["lse_base"] == "2" and doc["row_lse"] == 2.0 and doc["row_out"] == [2.0]
    assert [s["row_weight"] for s in doc["splits"]] == [0.5, 0.5]


def test_cli_merge_all_empty(runner, tmp_path, strict_json):
    files = _write(tmp_path, [[[0.0, 0.0]], [[0.0, 0.0]]], [[-math.inf], [math.inf]])
    r = osm("merge", *files, "--json")
    assert r.exit_code == 0
    doc = strict_json(r.stdout)
    assert doc["row_lse"] == "-inf" and doc["row_out"] == [0.0, 0.0] and doc["empty_rows"] == 1


@pytest.mark.parametrize(
    "case, message",
    [
        ("odd", "merge needs pairs of files"),
        ("shape", "does not fit"),
        ("transposed", "transpose one"),
        ("splits", "differs from"),
        ("nan_lse", "NaN at index 1"),
        ("nan_o", "NaN at index (0, 1)"),
        ("inf_o", "inf at index (1, 0)"),
        ("pickle", "Python objects"),
        ("missing", "no such file"),
        ("same", "same file"),
        ("row", "out of range"),
    ],
)
def test_cli_merge_bad_inputs(runner, tmp_path, case, message):
    good = _write(tmp_path, [np.ones((2, 3)), np.ones((2, 3))], [np.zeros(2), np.zeros(2)])
    args = list(good)
    if case == "odd":
        args = good[:3]
    elif case == "shape":
        np.save(tmp_path / "bad.npy", np.zeros(3))
        args[1] = tmp_path / "bad.npy"
    elif case == "transposed":
        np.save(tmp_path / "o.npy", np.ones((2, 4, 3, 1)))
        np.save(tmp_path / "l.npy", np.zeros((2, 3, 4)))
        args = [tmp_path / "o.npy", tmp_path / "l.npy"]
    elif case == "splits":
        np.save(tmp_path / "o9.npy", np.ones((3, 3)))
        np.save(tmp_path / "l9.npy", np.zeros(3))
        args = [*good, tmp_path / "o9.npy", tmp_path / "l9.npy"]
    elif case == "nan_lse":
        np.save(tmp_path / "l1.npy", np.array([0.0, np.nan]))
    elif case == "nan_o":
        np.save(tmp_path / "o0.npy", np.array([[1.0, np.nan, 1.0], [1.0, 1.0, 1.0]]))
    elif case == "inf_o":
        np.save(tmp_path / "o1.npy", np.array([[1.0, 1.0, 1.0], [np.inf, 1.0, 1.0]]))
    elif case == "pickle":
        with open(tmp_path / "o0.npy", "wb") as fh:  # an object array: a pickle inside
            np.save(fh, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif case == "missing":
        args[2] = tmp_path / "nope.npy"
    elif case == "same":
        args += ["--out", tmp_path / "x.npy", "--lse", tmp_path / "x.npy"]
    elif case == "row":
        args += ["--row", "2"]
    r = osm("merge", *args)
    assert r.exit_code == 1, r.stdout
    assert r.stderr.startswith("Error: ")
    assert message in r.stderr
    assert r.stdout == ""


def test_merge_report_row():
    """merge_detail and split_stats as they are, each split's LSE at the row as given (+inf
    kept), and a row past the end refused."""
    outs = [np.ones((3, 2)), np.zeros((3, 2))]
    lses = [np.array([0.0, 1.0, np.inf]), np.array([LN2, -np.inf, 2.0])]
    rep = merge_report(outs, lses, row=2)
    assert rep.row_lses == (np.inf, 2.0)
    np.testing.assert_array_equal(rep.merged.lse, merge_detail(outs, lses).lse)
    assert rep.stats == split_stats(rep.merged, lses)
    with pytest.raises(InputError, match="`row` 3 is out of range; the partials have 3 row"):
        merge_report(outs, lses, row=3)
