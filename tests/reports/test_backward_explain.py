"""`osm backward --explain` and step mode (issue 21, item 2): each tile's arithmetic with the
actual numbers on the traced row and key (P = exp(S − LSE), dP = dO·Vᵀ, D = rowsum(dO∘O),
dS = P∘(dP − D), the dQ_i, dK_j, dV_j shares on their leading components), fitting 80
columns; the numbers are the loop's own and add up to the gradients it wrote."""

from __future__ import annotations

import re

import numpy as np
import pytest

from osm_cli.flash.backward import attention_backward
from osm_cli.reports.explain import backward_key_lines, backward_query_lines

BACKWARD = ("backward", "samples/causal.npz", "--causal", "--block-q", "4", "--block-k", "2",
            "--query", "2", "--key", "1")


def _backward(qkv, **kw):
    q, k, v = qkv(8, 8, 4, heads=(2, 2), b=1)
    do = qkv(8, 8, 4, heads=(2, 2), b=1, seed=5)[0]
    return attention_backward(q, k, v, do, block_q=4, block_k=2, **kw), (q, k, v, do)


def test_the_details_are_the_loops_numbers_and_add_up(qkv):
    res, (q, k, v, do) = _backward(qkv, causal=True, trace_at=(0, 1, 6), trace_key=3)
    s = res.options.softmax_scale
    # the query trace: dQ_i after its last tile is the dQ row written; each share adds up
    steps = [st for st in res.trace.steps if not st.masked]
    for st in steps:
        (name, before, add, after), = st.detail.adds
        assert name == "dQ_i" and np.allclose(before + add, after, rtol=0, atol=1e-15)
        p, dp, d, ds = st.detail.p, st.detail.dp, st.detail.d[0], st.detail.ds
        assert np.allclose(ds, p * (dp - d), rtol=0, atol=1e-15)
    assert np.allclose(steps[-1].detail.adds[0][3], res.dq[0, 1, 6, :3], rtol=1e-14, atol=0)
    # P and dP by hand, from the inputs: P = exp(S − LSE) of the forward's LSE, dP = dO·Vᵀ
    j0, j1 = steps[0].start, steps[0].stop
    sc = s * q[0, 1, 6] @ k[0, 1, j0:j1].T
    assert np.allclose(steps[0].detail.p, np.exp(sc - res.lse[0, 1, 6]), rtol=1e-12)
    assert np.allclose(steps[0].detail.dp, do[0, 1, 6] @ v[0, 1, j0:j1].T, rtol=1e-12)
    assert np.isclose(steps[0].detail.d[0], do[0, 1, 6] @ res.out[0, 1, 6], rtol=1e-12)
    # the key trace: dV_j and dK_j after the last Q tile are the rows written
    last = [st for st in res.trace.key_steps if not st.masked][-1].detail
    (dv_name, *_, dv_after), (dk_name, *_, dk_after) = last.adds
    assert (dv_name, dk_name) == ("dV_j", "dK_j")
    assert np.allclose(dv_after, res.dv[0, 1, 3, :3], rtol=1e-14)
    assert np.allclose(dk_after, res.dk[0, 1, 3, :3], rtol=1e-14)


def test_the_lines_show_the_numbers(qkv):
    res, _ = _backward(qkv, trace_at=(0, 0, 2), trace_key=1)
    st = res.trace.steps[0]
    lines = backward_query_lines(st, res.options.softmax_scale)
    det = st.detail
    assert lines[0].startswith("P = exp(S − LSE) = [") and lines[1].startswith("dP = dO_i·V_jᵀ")
    assert f"D = rowsum(dO_i∘O_i) = {det.d[0]:.6g}:" in lines[2]
    want = f"  dS[2, 1] = {det.p[1]:.6g}·({det.dp[1]:.6g} "
    assert any(line.startswith(want) and line.endswith(f" = {det.ds[1]:.6g}") for line in lines)
    assert lines[-3].startswith("  dQ_i[0] = 0 ")
    key = backward_key_lines(res.trace.key_steps[0], res.options.softmax_scale, 1)
    assert key[0].startswith("P[:, 1] = exp(S − LSE) = [") and "dV_j[0] = 0 " in "\n".join(key)


def test_gqa_says_the_sums_run_over_the_heads(qkv):
    q, k, v = qkv(8, 8, 4, heads=(4, 2), b=1)
    do = qkv(8, 8, 4, heads=(4, 2), b=1, seed=5)[0]
    res = attention_backward(q, k, v, do, block_q=4, block_k=2, trace_at=(0, 3, 1), trace_key=2)
    assert res.trace.key_steps[0].detail.heads == 2
    lines = backward_key_lines(res.trace.key_steps[0], res.options.softmax_scale, 2)
    assert ("  (the sums run over the 2 query heads that read this kv head; the columns above "
            "are the traced head's)") in lines


@pytest.mark.parametrize("width", [72, 80, 100])
def test_backward_explain_at_every_width(osm, width):
    r = osm(*BACKWARD, "--explain", width=width)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert max(len(line) for line in out.splitlines()) <= width
    key = out[out.index("each Q tile's arithmetic for key 1"):out.index("query 2 of batch 0")]
    query = out[out.index("each K/V tile's arithmetic"):out.index("traced rows of")]
    # one number met twice: dS[2, 1] is row 2's share of key 1, in both traces
    ds = re.findall(r"dS\[2, 1\] = .* = (-?[\d.]+)", key + query)
    assert ds == ["-1.78239", "-1.78239"]
    assert "P = exp(S − LSE): the forward's probabilities, recomputed from its LSE" in query
    assert "dQ_i[0] = 0.769857 − 0.0852349 = 0.684622" in query.replace("\n     ", " ")
    assert "dV_j[0] = -0.661556 − 1.20993 = -1.87149" in key
    assert query.count("skipped, not computed") == 2
    # the trace tables' final values are what the arithmetic reached
    assert "0.6846224666" in out and "-1.871487141" in out


def test_backward_step_frames_cross_both_traces(render_text, qkv):
    from osm_cli.flash.options import ScoreOptions, Tiling
    from osm_cli.present.backward import backward_step_frame
    from osm_cli.reports.backward import backward_report

    q, k, v = qkv(8, 8, 4)
    do = qkv(8, 8, 4, seed=5)[0]
    rep = backward_report(q, k, v, do, ScoreOptions(causal=True), Tiling(block_q=4, block_k=2),
                          trace_at=(0, 0, 5), trace_key=1, with_reference=False)
    first = render_text(backward_step_frame([], rep, 0, 80), 80)
    assert "Q tile 0, rows 0:4" in first and "step 1 of 6" in first and "(Q tile 1 of 2)" in first
    third = render_text(backward_step_frame([], rep, 2, 80), 80)
    assert "K/V tile 0, keys 0:2" in third and "step 3 of 6" in third
    assert "(K/V tile 1 of 4)" in third and "b or ←: back" in third
    table = backward_step_frame([], rep, 3, 80).renderables[1]
    assert [row.style for row in table.rows] == [None, "reverse"]


def test_backward_step_mode_in_tmux(tmux):
    tmux.start(*BACKWARD, "--step", height=50)
    screen = tmux.wait_for("step 1 of 6")
    assert "dS[2, 1] = 0.241·(-6.57289 − 0.822924) = -1.78239" in screen
    assert "max |dQ − ref|" not in screen  # the summary comes after the last step
    tmux("send-keys", "-t", "osm", "Enter", "Enter")
    screen = tmux.wait_for("step 3 of 6")
    assert "K/V tile 0, keys 0:2" in screen
    tmux("send-keys", "-t", "osm", "b")  # back across into the key trace
    screen = tmux.wait_for("step 2 of 6")
    assert "Q tile 1, rows 4:8" in screen
    tmux("send-keys", "-t", "osm", "G", "Enter")
    screen = tmux.wait_for("EXIT=0")
    assert "dQ[2] vs the float64 reference" in screen


def test_keys_typed_while_a_frame_is_drawn_are_kept(monkeypatch):
    """Step mode reads keys in raw mode entered with TCSANOW: click's getchar (TCSAFLUSH) threw
    away what was typed while the previous frame was being drawn, so a quick second Enter
    was lost."""
    import os
    import pty
    import signal

    from osm_cli.cli.common import getkey

    def lost(*_):
        raise AssertionError("the keys typed ahead were thrown away: getkey waited for more")

    master, slave = pty.openpty()
    old = signal.signal(signal.SIGALRM, lost)
    signal.alarm(5)
    try:
        with os.fdopen(slave, "r", closefd=True) as tty_in:
            monkeypatch.setattr("sys.stdin", tty_in)
            os.write(master, b"b ")  # typed ahead, before step mode reads (the terminal cooked)
            assert getkey() == "b "
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.close(master)
