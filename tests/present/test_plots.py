"""The pictures tell the truth (issue 21, item 9), read off the figures' own artists: errors at
rounding level drawn in ulps inside a band that says so, zero errors drawn, integer ticks on the
attention heatmap, the traced query's outline above the tile grid, titles from the source's
name, and the trace plot's l as its two parts (l_old·α and the block's own sum)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="--plot needs matplotlib")

import osm_cli  # noqa: E402
from osm_cli.io.load import load_scores  # noqa: E402
from osm_cli.present import plot  # noqa: E402
from osm_cli.reports.trace import trace_report  # noqa: E402
from osm_cli.studies import sweep, tilemap  # noqa: E402


def _labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _band(ax):
    """The rounding band: the one patch of the error panel spanning the axes' width."""
    bands = [p for p in ax.patches if p.get_label().startswith("at ")]
    assert len(bands) == 1
    return bands[0]


def test_sweep_at_float64_rounding_is_drawn_in_ulps():
    """samples/matrix.txt: errors 0, 1.1e-16 and 0, which on a log axis were a lone point (the
    zeros vanished); in ulps of the largest p they are 0, 0.6 and 0, all in the band."""
    scores, _ = load_scores("samples/matrix.txt")
    res = sweep.sweep_scores([1, 2, 4], scores)
    errs = [r.measure.max_error for r in res.rows]
    assert errs[0] == 0 and errs[2] == 0 and 0 < errs[1] < 1e-15
    fig = plot.sweep_figure(res, "t")
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear"
    top = max(r.measure.ref_max for r in res.rows)
    u = np.finfo(np.float64).eps * top
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "max |p − reference|")
    assert np.allclose(line.get_ydata(), np.array(errs) / u)
    assert list(line.get_ydata()[[0, 2]]) == [0.0, 0.0]  # zeros drawn, not NaN
    assert "in ulps" in ax.get_ylabel()
    band = _band(ax)
    assert band.get_label() == f"at float64 rounding (≤ {plot.ROUNDING_ULPS} ulps)"
    assert (band.get_y(), band.get_y() + band.get_height()) == (0, plot.ROUNDING_ULPS)
    assert "at float64 rounding (≤ 16 ulps)" in _labels(ax)
    # the rescale counts on integer ticks
    assert all(float(t).is_integer() for t in fig.axes[1].get_yticks())


def _fake_sweep(errors, dtype=None):
    rows = tuple(SimpleNamespace(block=b, measure=SimpleNamespace(
        max_error=e, rescales=1, ref_max=1.0), hbm_flash=100, sparse=False, fits=True)
                 for b, e in zip((16, 32, 64), errors, strict=True))
    return SimpleNamespace(rows=rows, hbm_standard=50, dtype=dtype, kernel="fa2")


def test_large_errors_on_a_log_axis_with_the_band_and_the_zeros():
    fig = plot.sweep_figure(_fake_sweep([1e-3, 0.0, 2e-3]), "t", accum="float32")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    zero = next(ln for ln in ax.get_lines() if ln.get_label().startswith("0: exact"))
    assert list(zero.get_xdata()) == [32.0]
    floor = zero.get_ydata()[0]
    assert 0 < floor < 16 * np.finfo(np.float32).eps and floor >= ax.get_ylim()[0]
    assert _band(ax).get_label() == "at float32 rounding (≤ 16 ulps)"
    errs = next(ln for ln in ax.get_lines() if ln.get_label() == "max |p − reference|")
    assert list(errs.get_ydata()[[0, 2]]) == [1e-3, 2e-3]


def test_a_kernel_models_errors_are_judged_at_its_dtype():
    """A bf16 kernel's output errors of 1e-3 are rounding: under a bf16 ulp (0.0078)."""
    fig = plot.sweep_figure(_fake_sweep([1e-3, 1.2e-3, 9e-4], dtype="bfloat16"), "t")
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear"
    assert _band(ax).get_label() == "at bfloat16 rounding (≤ 16 ulps)"


def _head(t, s, d=4, query=1, **kw):
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(1, 1, t, d)), rng.normal(size=(1, 1, s, d))
    return tilemap.head_probabilities(q, k, batch=0, head=0, rows=64, cols=64, **kw)


def test_heatmap_ticks_are_indices_and_the_traced_row_is_on_top():
    hm = _head(3, 5, block_q=2, block_k=2)
    fig = plot.attention_figure(hm, "title", traced_query=1)
    ax = fig.axes[0]
    ticks = [*ax.get_xticks(), *ax.get_yticks()]
    assert ticks and all(float(t).is_integer() for t in ticks)
    from matplotlib.patches import Rectangle

    outline = next(p for p in ax.patches if isinstance(p, Rectangle))
    assert outline.get_y() == 0.5 and outline.get_height() == 1  # query 1's row
    grid = [ln.get_zorder() for ln in ax.get_lines()]
    assert grid and outline.get_zorder() > max(grid)


def test_trace_plot_draws_l_as_its_two_parts():
    """The second worked example: l falls from 1.3678794 to 1.203438 as block 1 is added,
    because the old sum is rescaled by α = e⁻³ (to 0.068) before the block's 1.1353353."""
    rep = trace_report(np.array([1.0, 2.0, 5.0, 3.0]), 2)
    fig = plot.trace_report_figure(rep, "--values")
    assert fig._suptitle.get_text() == ("scores [1, 2, 5, 3] (inline): online softmax, form "
                                        "rescale, blocks of 2")
    ax = fig.axes[1]
    kept, added = ax.containers
    assert kept.get_label().startswith("l_old·α") and "block's own" in added.get_label()
    k = [b.get_height() for b in kept]
    a = [b.get_height() for b in added]
    assert k[0] == 0 and math.isclose(a[0], 1.3678794, rel_tol=1e-7)
    assert math.isclose(k[1], 1.3678794 * math.exp(-3), rel_tol=1e-6)
    assert math.isclose(a[1], 1 + math.exp(-2), rel_tol=1e-9)
    assert [b.get_y() for b in added] == k  # stacked: the block's sum on top of l_old·α
    t = osm_cli.online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2)
    assert np.allclose(np.add(k, a), [s.l for s in t.steps])


def test_a_file_titles_the_plot_with_its_name():
    rep = trace_report(np.array([1.0, 2.0]), 1)
    fig = plot.trace_report_figure(rep, "samples/scores.txt")
    assert fig._suptitle.get_text().startswith("samples/scores.txt: online softmax")
    assert plot.source_title("<stdin>", rep) == "scores [1, 2] (from standard input)"
