"""reports/: one record per command with the run, its oracles and the checks asked for.

The worked example is [2, 4 | 1, 3] (docs/numerics.md#update-forms); the rest checks that each
option fills in its part of the record (and only that part) with the numbers the core modules
give on their own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import qkv
from osm_cli.errors import OsmError
from osm_cli.flash.forward import attention
from osm_cli.flash.options import ScoreOptions, Tiling
from osm_cli.flash.reference import errors, reference
from osm_cli.precision.model import model, prepare
from osm_cli.reports.attention import attention_report
from osm_cli.reports.trace import trace_report
from osm_cli.studies.lazy import lazy_report

E = math.exp
SCORES = np.array([2.0, 4.0, 1.0, 3.0])


def test_trace_report_worked_example():
    """[2, 4 | 1, 3] in both forms: m = 4, l = e^-2 + 1 + e^-3 + e^-1 = 1.5530018 either way,
    and both agree with the one-shot softmax to the last bit or two."""
    rep = trace_report(SCORES, 2, "both")
    assert [t.form for t in rep.traces] == ["rescale", "merge"] and rep.trace is rep.traces[0]
    for t in rep.traces:
        assert t.m == 4 and t.l == pytest.approx(E(-2) + 1 + E(-3) + E(-1), rel=1e-15)
    assert rep.max_diff.shape == (1,) and rep.max_diff[0] <= 2.3e-16
    assert rep.forms_diff <= 2.3e-16
    np.testing.assert_allclose(rep.reference, np.exp(SCORES - 4) / rep.trace.l, rtol=1e-15)
    assert np.isnan(rep.naive).sum() == 0
    assert (rep.lazy, rep.eager, rep.check, rep.in_dtype) == (None, None, None, ())


def test_trace_report_one_form_has_no_forms_diff():
    assert trace_report(SCORES, 2, "merge").forms_diff is None


def test_trace_report_lazy_and_order():
    """τ = 2.5 on [0, 1, 2, 3] in blocks of 1 saves 2 of 3 rescales (studies/lazy.py's example); the
    reverse order visits block 1 before block 0."""
    s = np.array([0.0, 1.0, 2.0, 3.0])
    rep = trace_report(s, 1, threshold=2.5)
    expected, eager = lazy_report(s, 1, 2.5)
    assert rep.lazy == expected and rep.lazy.rescales_saved == 2
    assert rep.eager.steps == eager.steps and rep.check is None
    rev = trace_report(SCORES, 2, order="reverse")
    assert rev.check.order == "reverse" and rev.check.indices.tolist() == [1, 0]
    assert [st.block for st in rev.trace.steps] == [1, 0] and rev.lazy is None


def test_trace_report_matrix_rows():
    s = np.array([[2.0, 4.0, 1.0, 3.0], [-np.inf, -np.inf, 0.0, 0.0]])
    rep = trace_report(s, 2, row=1)
    assert rep.max_diff.shape == (2,) and rep.trace.row == 1
    assert rep.trace.steps[0].m == -np.inf and rep.trace.steps[1].m == 0


def test_trace_report_in_dtype():
    """bf16, naive: l after [2, 4] is e^-2 + 1 in bfloat16 = 1.1328125 (precision.trace_in)."""
    rep = trace_report(SCORES, 2, "both", dtype="bf16", precision="naive")
    assert len(rep.in_dtype) == 2 and rep.in_dtype[0].model.name == "bfloat16"
    assert rep.trace is rep.in_dtype[0].trace and rep.trace.steps[0].l == 1.1328125
    np.testing.assert_array_equal(rep.reference, rep.in_dtype[0].exact)
    assert rep.max_diff is rep.in_dtype[0].max_diff
    assert rep.forms_diff is not None


MASK = dict(causal=True, scale=None, layout="bhnd", causal_align="bottom-right", window=None,
            mask=None)


def test_attention_report_matches_the_core():
    q, k, v = qkv(6, 7, 4, seed=5)
    rep = attention_report(q, k, v, ScoreOptions(**MASK), Tiling(block_q=2, block_k=3),
                           trace_at=(0, 0, 4))
    res = attention(q, k, v, block_q=2, block_k=3, trace_at=(0, 0, 4), **MASK)
    ref_out, ref_lse = reference(q, k, v, **MASK)
    assert np.array_equal(rep.result.out, res.out)
    steps = [(t.block, t.m, t.l) for t in res.trace.steps]
    assert [(t.block, t.m, t.l) for t in rep.result.trace.steps] == steps
    assert rep.errors == errors(res, ref_out, ref_lse) and rep.errors["max_abs_err"] < 1e-14
    np.testing.assert_array_equal(rep.ref_row, ref_out[4])
    assert (rep.model, rep.verdict, rep.split, rep.notes) == (None, None, None, ())
    assert rep.stored_out is rep.result.out


def test_attention_report_options():
    q, k, v = qkv(6, 7, 4, seed=5)
    bare = attention_report(q, k, v, ScoreOptions(**MASK), Tiling(), with_reference=False)
    assert (bare.errors, bare.ref_row, bare.verdict) == (None, None, None)
    rev = attention_report(q, k, v, ScoreOptions(**MASK), Tiling(block_k=2), order="reverse")
    assert [s.block for s in rev.result.trace.steps] == [3, 2, 1, 0]
    split = attention_report(q, k, v, ScoreOptions(**MASK), Tiling(), splits=3)
    assert len(split.split.splits) == 3 and split.split.max_abs_diff < 1e-14


def test_attention_report_with_a_model():
    q, k, v = qkv(6, 7, 4, seed=5)
    m, (q16, k16, v16), notes = prepare("fp16", None, None, q, k, v)
    rep = attention_report(q16, k16, v16, ScoreOptions(**MASK), Tiling(), model=m, notes=notes)
    assert rep.model is m and rep.notes == notes and rep.verdict.passed
    assert rep.stored_out.dtype == np.float16
    with pytest.raises(OsmError, match="`splits` needs the tiled run"):
        attention_report(q16, k16, v16, ScoreOptions(**MASK), Tiling(),
                         model=model("fp16", "naive"), splits=2)


def test_attention_report_lazy_rescale_against_the_eager_run():
    """One query over keys whose scores rise 0, 1, 2, 3 (q = [1], k = [[0], [1], [2], [3]],
    scale 1), one key per tile. Eager: m moves at tiles 1, 2 and 3 — three rescales. With τ = 2.5
    m stays at 0 after tile 0, since no score exceeds 0 + 2.5 until tile 3 (3 > 2.5): one rescale,
    two saved. Both give the same softmax-weighted V up to rounding."""
    q = np.array([[1.0]])
    k = np.array([[0.0], [1.0], [2.0], [3.0]])
    v = np.array([[1.0], [2.0], [3.0], [4.0]])
    rep = attention_report(q, k, v, ScoreOptions(**{"scale": 1.0}),
                           Tiling(block_k=1, threshold=2.5))
    b = rep.baseline
    assert (b.rescales, b.rescales_eager, b.threshold, b.order) == (1, 3, 2.5, "forward")
    assert b.max_abs_diff < 1e-15 and b.max_lse_diff < 1e-15
    skipped = [s.block for s in rep.result.trace.steps if s.block_max > s.m_prev == s.m]
    assert skipped == [1, 2]
    p = np.exp([0.0, 1.0, 2.0, 3.0]) / np.exp([0.0, 1.0, 2.0, 3.0]).sum()
    assert rep.result.out[0, 0] == pytest.approx(float(p @ [1, 2, 3, 4]), rel=1e-15)


def test_attention_report_reverse_order_matches_forward():
    q, k, v = qkv(9, 23, 5, dv=3, heads=(2, 2), seed=3)
    rep = attention_report(q, k, v, ScoreOptions(**{"causal": True}), Tiling(block_k=4),
                           order="reverse")
    assert rep.baseline.order == "reverse" and rep.baseline.threshold == 0.0
    assert rep.baseline.max_abs_diff < 1e-14 and rep.baseline.max_lse_diff < 1e-14
    assert [s.block for s in rep.result.trace.steps] == [5, 4, 3, 2, 1, 0]
    assert attention_report(q, k, v, ScoreOptions(), Tiling(block_k=4)).baseline is None
