"""The fused forward's row operations (flash/rows.py): numba's compiled ones give numpy's bits
on tiles of every width, zeros of both signs, rows of −inf and spread exponents, in float32 and
float64; which runs use them. tests/flash/test_fast.py runs the whole fused loop with them
against the textbook loop."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from osm_cli.core.state import block_max
from osm_cli.flash import rows
from osm_cli.flash.fast import plan_ops
from osm_cli.flash.options import Hooks, ScoreOptions, Tiling
from osm_cli.flash.plan import make_plan

needs_numba = pytest.mark.skipif(not rows.HAVE_NUMBA, reason="numba is not installed")


def bits(a: np.ndarray) -> bytes:
    return a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes()


def tile(rng, shape, dtype) -> np.ndarray:
    """Scores over 60 binades, with zeros of both signs, −inf entries and a row of −inf."""
    s = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, (*shape[:-1], 1)))
    s = s.astype(dtype)
    s[..., 0, :] = -np.inf
    s[..., 1, ::2] = -0.0
    s[..., 1, 1::2] = 0.0
    s[..., 2, ::3] = -np.inf
    return s


@needs_numba
def test_compiled_rows_are_proven_here():
    assert rows.compiled() is True


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 100, 127, 128, 129, 256])
def test_compiled_rows_give_numpys_bits(width, dtype):
    rng = np.random.default_rng(width)
    fast, slow = rows.RowOps(True), rows.NUMPY
    s = tile(rng, (3, 2, 50, width), dtype)
    got, want = np.empty(s.shape[:-1], dtype), np.empty(s.shape[:-1], dtype)
    fast.block_max(s, got)
    slow.block_max(s, want)
    assert bits(got) == bits(want) == bits(block_max(s, nan_free=True))
    assert not np.signbit(got[..., 1]).any()  # the row of ±0: +0.0, as state.block_max
    ref = np.where(np.isneginf(want), 0, want).astype(dtype)
    a, b = s.copy(), s.copy()
    fast.subtract(a, ref)
    slow.subtract(b, ref)
    assert bits(a) == bits(b)
    p = np.exp(a)
    fast.row_sums(p, got)
    slow.row_sums(p, want)
    assert bits(got) == bits(want) == bits(np.add.reduce(p, axis=-1))
    alpha = np.exp(-np.abs(ref)).astype(dtype)
    pv = rng.standard_normal(s.shape).astype(dtype)
    want = rng.standard_normal(s.shape).astype(dtype)
    o, o2 = want.copy(), want.copy()
    fast.rescale_add(o, alpha, pv)
    slow.rescale_add(o2, alpha, pv)
    assert bits(o) == bits(o2) == bits(want * alpha[..., None] + pv)


@needs_numba
def test_a_wrong_compiled_kernel_is_not_trusted(monkeypatch):
    """compiled() runs the kernels against numpy first: one that rounds differently (here a
    sum in the other order) makes every run take numpy's operations."""
    from osm_cli.flash import _rows_numba

    def reversed_sum(s, out):
        out[:] = np.add.reduce(s[:, ::-1], axis=-1)

    monkeypatch.setattr(_rows_numba, "row_sum", reversed_sum)
    monkeypatch.setattr(rows, "_PROVEN", {})
    assert rows.compiled() is False
    assert rows.row_ops(1 << 40) is rows.NUMPY
    monkeypatch.setattr(rows, "_PROVEN", {})


def plan(h: int, n: int, **opts):
    q = np.zeros((1, h, n, 4), np.float32)
    return make_plan(q, q, q, ScoreOptions(**opts), Tiling(), Hooks(), None)


@needs_numba
def test_which_runs_take_the_compiled_rows(monkeypatch):
    monkeypatch.setattr(rows, "COMPILED_FROM", 1 << 27)
    monkeypatch.setattr(rows, "LOADED_FROM", 1 << 20)
    assert plan_ops(plan(8, 4096)).compiled  # 2^27 scores
    assert plan_ops(plan(1, 512)) is rows.NUMPY  # 2^18 scores: numpy, numba loaded or not
    monkeypatch.delitem(sys.modules, "numba", raising=False)
    assert plan_ops(plan(2, 1024)) is rows.NUMPY  # numba's import would cost more than it saves
    import numba  # noqa: F401

    assert plan_ops(plan(2, 1024)).compiled  # its import paid already
    assert plan_ops(plan(8, 4096, score_mod=lambda s, b, h, q, k: s)) is rows.NUMPY


def test_without_numba_every_run_takes_numpy(monkeypatch):
    monkeypatch.setattr(rows, "HAVE_NUMBA", False)
    monkeypatch.setattr(rows, "_PROVEN", {})
    assert rows.compiled() is False
    assert plan_ops(plan(8, 4096)) is rows.NUMPY
    monkeypatch.setattr(rows, "_PROVEN", {})
