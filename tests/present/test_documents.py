"""present/json.py: the --json documents built from the records, keys in their documented order.

The CLI tests check the values end to end; these pin which keys each option adds, and where.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import qkv
from osm_cli.flash.options import ScoreOptions, Tiling
from osm_cli.precision.model import prepare
from osm_cli.present.json import attention_doc, dumps, merge_doc, trace_doc
from osm_cli.reports.attention import attention_report
from osm_cli.reports.merge import merge_report
from osm_cli.reports.trace import trace_report

SCORES = np.array([2.0, 4.0, 1.0, 3.0])
TRACE_KEYS = ["block", "form", "row", "shape", "steps", "m", "l", "lse", "lse_base",
              "probabilities", "reference", "naive", "max_abs_diff"]


def test_trace_doc_worked_example():
    doc = trace_doc(trace_report(SCORES, 2))
    assert list(doc) == TRACE_KEYS
    assert doc["steps"][1]["l"] == pytest.approx(math.exp(-2) + 1 + math.exp(-3) + math.exp(-1))
    assert list(doc["steps"][0]) == ["block", "start", "stop", "block_max", "m_prev", "m",
                                     "scale", "l_prev", "l", "rescaled"]
    assert "Infinity" not in dumps(doc)


def test_trace_doc_option_keys():
    both = trace_doc(trace_report(SCORES, 2, "both"))
    assert list(both)[len(TRACE_KEYS):] == ["merge_steps", "forms_max_abs_diff"]
    assert "block_weight" in both["merge_steps"][0]
    lazy = trace_doc(trace_report(SCORES, 1, threshold=1.0, order="shuffle", seed=3))
    assert list(lazy)[len(TRACE_KEYS):] == [
        "rescale_threshold", "threshold_units", "rescales", "rescales_eager", "rescales_saved",
        "skipped_rescales", "max_excess", "lazy_vs_eager_max_abs_diff", "order", "seed",
        "block_order", "order_check"]
    assert all("skipped" in st for st in lazy["steps"]) and lazy["seed"] == 3
    low = trace_doc(trace_report(SCORES, 2, dtype="bf16"))
    assert list(low)[len(TRACE_KEYS):] == [
        "dtype", "precision", "scores_in_dtype", "reference_note", "ulps", "rounding",
        "p_underflowed", "alpha_underflowed"]


def test_attention_doc_keys():
    q, k, v = qkv(5, 5, 4, seed=3, stream=True)
    mask = dict(causal=False, scale=None, layout="bhnd", causal_align="bottom-right",
                window=None, mask=None)
    m, (q, k, v), notes = prepare("bf16", None, None, q, k, v)
    doc = attention_doc(attention_report(q, k, v, ScoreOptions(**mask), Tiling(),
                                         model=m, notes=notes, splits=2, kernel="tiles"))
    assert list(doc)[-5:] == ["trace", "precision", "splits", "splits_max_abs_diff",
                              "splits_max_lse_diff"]
    assert doc["precision"]["dtype"] == "bfloat16" and doc["precision"]["verdict"]["passed"]
    plain = attention_doc(attention_report(q, k, v, ScoreOptions(**mask), Tiling(),
                                           with_reference=False))
    assert list(plain)[-2:] == ["reference", "trace"] and plain["reference"] == "skipped"
    assert list(plain["trace"]["steps"][0]) == [
        "tile", "start", "stop", "skipped", "tile_max", "m_prev", "m", "scale", "l_prev", "l",
        "o_head", "o_norm"]


def test_merge_doc_row():
    """Two splits with LSE ln 3 and ln 1: weights 3/4 and 1/4, L = ln 4."""
    outs = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])]
    lses = [np.array([math.log(3)]), np.array([0.0])]
    doc = merge_doc(["o0", "l0", "o1", "l1"], merge_report(outs, lses))
    assert doc["row_lse"] == pytest.approx(math.log(4))
    assert [s["row_weight"] for s in doc["splits"]] == pytest.approx([0.75, 0.25])
    assert [s["o"] for s in doc["splits"]] == ["o0", "o1"]
