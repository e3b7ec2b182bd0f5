"""Several query rows traced side by side (issue 21, item 5): `--query 0:4` (a range) or
`--query 0,2,5` (a list) in attention's and backward's tables, JSON, CSV, --explain and step
mode, and the library's trace_at taking several rows. Each row's steps must be exactly the
steps a one-row trace of it records, in every loop (osm's textbook and fused loops, a kernel
preset's, the backward, a varlen batch)."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import fields

import numpy as np
import pytest

from osm_cli.errors import InputError
from osm_cli.flash.backward import attention_backward
from osm_cli.flash.forward import attention
from osm_cli.flash.options import Tiling

CAUSAL = ("attention", "samples/causal.npz", "--causal", "--head", "1", "--block-q", "4",
          "--block-k", "2")
BACKWARD = ("backward", "samples/causal.npz", "--causal", "--block-q", "4", "--block-k", "2",
            "--key", "1")


def same_steps(a, b):
    """Two step tuples field by field (o arrays bit for bit), the query tag aside."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in fields(x):
            if f.name == "query":
                continue
            u, w = getattr(x, f.name), getattr(y, f.name)
            if isinstance(u, np.ndarray):
                assert np.array_equal(u, w), f.name
            else:
                assert u == w or (u != u and w != w), (f.name, u, w)


@pytest.mark.parametrize("fused", [True, False])
def test_each_row_is_its_own_one_row_trace(qkv, fused):
    q, k, v = qkv(16, 16, 4, heads=(3, 3), b=2)
    rows = [5, 0, 15, 8]  # out of order, across Q tiles of 4
    tiling = Tiling(block_q=4, block_k=4, fused=fused)
    many = attention(q, k, v, causal=True, tiling=tiling, trace_at=(1, 2, rows))
    assert many.trace.queries == tuple(rows) and many.trace.at == (1, 2, 5)
    for n, qi in enumerate(rows):
        one = attention(q, k, v, causal=True, tiling=tiling, trace_at=(1, 2, qi))
        same_steps(one.trace.steps, many.trace.rows[n])
        assert {s.query for s in many.trace.rows[n]} == {qi}
        assert np.array_equal(one.trace.out, many.trace.outs[n])
    same_steps(many.trace.steps, many.trace.rows[0])


def test_a_kernel_presets_loop_and_a_varlen_batch_trace_rows_alike(qkv):
    import ml_dtypes

    from osm_cli.kernels import run_kernel

    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in qkv(40, 40, 64, heads=(2, 2), b=1))
    sink = np.array([0.5, -1.0], dtype=np.float32)
    many = run_kernel(q, k, v, kernel="fa4", causal=True, block_k=8, learnable_sink=sink,
                      trace_at=(0, 1, range(6, 10)))
    for n, qi in enumerate(range(6, 10)):
        one = run_kernel(q, k, v, kernel="fa4", causal=True, block_k=8, learnable_sink=sink,
                         trace_at=(0, 1, qi))
        same_steps(one.trace.steps, many.trace.rows[n])
        assert many.trace.rows[n][-1].sink  # each row's sink joins its own l
    import osm_cli

    cu = np.array([0, 10, 40])
    q, k, v = qkv(40, 40, 8, heads=(2, 2), b=1)
    q, k, v = (x[0].swapaxes(0, 1) for x in (q, k, v))  # (total, H, d): FlashAttention's varlen
    kw = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "causal": True, "block_k": 4,
          "layout": "bnhd"}
    many = osm_cli.attention(q, k, v, trace_at=(1, 1, [0, 29]), **kw)
    for n, qi in enumerate([0, 29]):
        same_steps(osm_cli.attention(q, k, v, trace_at=(1, 1, qi), **kw).trace.steps,
                   many.trace.rows[n])


def test_backward_traces_each_query_row(qkv):
    q, k, v = qkv(16, 16, 4, heads=(4, 2), b=2)
    do = qkv(16, 16, 4, heads=(4, 2), b=2, seed=7)[0]
    kw = {"causal": True, "block_q": 4, "block_k": 4, "trace_key": 5}
    many = attention_backward(q, k, v, do, trace_at=(1, 3, [2, 9, 15]), **kw)
    assert many.trace.queries == (2, 9, 15)
    for n, qi in enumerate([2, 9, 15]):
        one = attention_backward(q, k, v, do, trace_at=(1, 3, qi), **kw)
        assert one.trace.steps == many.trace.rows[n]  # GradSteps hold floats only
        assert {s.query for s in one.trace.steps} == {qi}
        assert one.trace.key_steps == many.trace.key_steps


@pytest.mark.parametrize("trace_at, says", [
    ((0, 0, []), "names no query row"),
    ((0, 0, [1, 1]), "names query 1 twice"),
    ((0, 0, "01"), "sequence of ints"),
    ((0, 0, [True]), "sequence of ints"),
    ((0, 0, [0, 99]), "query 99) is outside"),
])
def test_bad_trace_at_is_refused_in_parameter_names(qkv, trace_at, says):
    q, k, v = qkv(8, 8, 4)
    with pytest.raises(InputError, match=re.escape(says)):
        attention(q, k, v, trace_at=trace_at)


# --- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("width", [72, 80, 100])
def test_attention_rows_table_at_every_width(osm, width):
    r = osm(*CAUSAL, "--query", "0:4", width=width)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert max(len(line) for line in out.splitlines()) <= width
    trace = out[out.index("trace of batch 0, head 1, queries 0:4"):out.index("output rows")]
    assert "(a line per row under each tile: the m, l and O vectors a kernel holds)" in trace
    head = next(line for line in trace.splitlines() if "query" in line and "tile max" in line)
    assert re.search(r"O\[:[123]\] of 4", head) and "‖O‖" in head  # O stays in view
    if "O[:3]" not in head:  # a narrow width says what of O it left out
        assert re.search(r"\(O\[[12]:3\] left out at this width", trace)
    # tile 1's group: four lines, one per row; row 0 and 1 see no key of 2:4 (causal)
    lines = trace.splitlines()
    at = next(n for n, line in enumerate(lines) if re.match(r"\s+1\s+2:4\s+0\s", line))
    group = [line.split() for line in lines[at:at + 4]]
    assert [group[0][2]] + [cells[0] for cells in group[1:]] == ["0", "1", "2", "3"]
    assert group[0][3] == group[1][1] == "-inf"  # their tile max
    assert trace.count("skipped") == 8  # tiles 2 and 3 hidden from every row of Q tile 0
    assert re.search(r"\n +3   \[-0.2798.*\]\s+4.84e-08\n", out)  # row 3 against float64


def test_attention_rows_numbers_are_the_records(osm):
    d = json.loads(osm(*CAUSAL, "--query", "0,3", "--json").stdout)["trace"]
    assert d["queries"] == [0, 3] and "query" not in d
    step = d["steps"][1]
    assert (step["tile"], step["start"], step["stop"]) == (1, 2, 4)
    assert step["tile_max"][0] == "-inf" and step["tile_max"][1] == pytest.approx(0.74463695)
    assert step["l"] == [1.0, pytest.approx(1.79838276)]
    assert len(step["o_head"]) == 2 and len(step["o_head"][1]) == 3
    assert len(d["out"]) == 2 and len(d["reference"]) == 2
    one = json.loads(osm(*CAUSAL, "--query", "3", "--json").stdout)["trace"]
    assert set(one) == {"batch", "head", "query", "steps", "out", "reference"}  # as before
    assert one["steps"][1]["l"] == step["l"][1] and one["out"] == d["out"][1]


def test_repeated_query_options_add_up_and_bad_ones_exit_2(osm):
    a = osm(*CAUSAL, "--query", "2", "--query", "5", "--json").stdout
    b = osm(*CAUSAL, "--query", "2,5", "--json").stdout
    assert a == b and json.loads(a)["trace"]["queries"] == [2, 5]
    for bad, says in (("1:1", "a range I:J needs 0 <= I < J"), ("x", "give a query index"),
                      ("1,1", "query 1 is named twice"), ("0:200", "trace at most 128")):
        r = osm(*CAUSAL, "--query", bad)
        assert r.exit_code == 2 and says in r.stderr, r.stderr
    r = osm(*CAUSAL, "--query", "6:9")
    assert r.exit_code == 1 and "query 8) is outside Q's (B, H, t) = (1, 2, 8)" in r.stderr


def test_attention_rows_csv_has_a_line_per_row_of_each_tile(osm, tmp_path):
    path = tmp_path / "t.csv"
    r = osm(*CAUSAL, "--query", "1:3", "--csv", path)
    assert r.exit_code == 0 and "tile table of the traced rows" in r.stderr
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [(x["step"], x["query"]) for x in rows] == [
        (str(s), q) for s in range(4) for q in ("1", "2")]
    assert rows[2]["tile_max"] == "-inf" and rows[3]["tile_max"] == "-0.34576496481895447"


def test_attention_rows_explained(osm):
    out = osm(*CAUSAL, "--query", "0,2", "--explain", width=80).stdout
    part = out[out.index("tile 1, keys 2:4"):out.index("tile 2, keys 4:6")]
    assert part.index("query 0") < part.index("query 2")
    assert "this row sees none of the tile's keys (masked): P = 0" in part  # row 0
    assert "m = max(1.792688, -0.345765) = 1.792688" in part  # row 2
    assert "l = l·α + ΣP = 1.147522·1 + 0.117837 = 1.265359" in part
    assert ("tile 2, keys 4:6\n   skipped for every traced row: the mask hides these keys; m, "
            "l, O unchanged") in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_step_frame_lights_every_row_of_the_tile(render_text):
    from conftest import SAMPLES
    from osm_cli.present.attention import attention_step_frame

    data = np.load(SAMPLES / "causal.npz")
    res = attention(data["q"], data["k"], data["v"], causal=True, block_q=4, block_k=2,
                    trace_at=(0, 1, (0, 1, 2)))
    group = attention_step_frame([], res, 1, width=80)
    table = group.renderables[1]
    styles = [row.style for row in table.rows]
    assert styles == [None] * 3 + ["reverse"] * 3  # tile 0's rows, then tile 1's lit
    text = render_text(group, 80)
    assert "tile 2 of 4" in text and "query 2" in text and "tile 1, keys 2:4" in text


def test_step_mode_with_rows_in_tmux(tmux):
    tmux.start("attention", *CAUSAL[1:], "--query", "0:3", "--step", height=60)
    screen = tmux.wait_for("tile 1 of 4")
    assert "queries 0:3" in screen and "query 2" in screen
    tmux("send-keys", "-t", "osm", "Enter")
    screen = tmux.wait_for("tile 2 of 4")
    assert "m = max(1.792688, -0.345765) = 1.792688" in screen
    tmux("send-keys", "-t", "osm", "b")
    tmux.wait_for("tile 1 of 4")


@pytest.mark.parametrize("width", [72, 80, 100])
def test_backward_rows_at_every_width(osm, width):
    r = osm(*BACKWARD, "--query", "2:6", width=width)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert max(len(line) for line in out.splitlines()) <= width
    assert "queries 2:6 of batch 0, head 0: dQ_i over the K/V tiles, start 0" in out
    rows = out[out.index("dQ_i of the traced query rows"):out.index("traced rows of the")]
    head = next(line for line in rows.splitlines() if "max |" in line)
    assert re.search(r"^ query +dQ_i(\[:[1-3]\] of 4)? ", head) and "max |dQ_i − ref|" in head
    lines = [line.split()[0] for line in rows.splitlines() if re.match(r"\s+[2-5]\s+\[", line)]
    assert lines == ["2", "3", "4", "5"]
    assert "dK[1] vs the float64 reference" in out and "dV[1] vs the float64 reference" in out


def test_backward_rows_json_and_csv(osm, tmp_path, strict_json):
    d = strict_json(osm(*BACKWARD, "--query", "2,5", "--json").stdout)
    assert d["traced"]["queries"] == [2, 5] and "query" not in d["traced"]
    assert len(d["query_trace"]) == 4 and d["query_trace"][2]["masked"] == [True, False]
    assert np.shape(d["traced_rows"]["dq"]) == (2, 4) == np.shape(d["reference_rows"]["dq"])
    one = strict_json(osm(*BACKWARD, "--query", "5", "--json").stdout)
    assert one["traced"]["query"] == 5 and one["traced_rows"]["dq"] == d["traced_rows"]["dq"][1]
    assert one["query_trace"][2]["dq_norm"] == d["query_trace"][2]["dq_norm"][1]
    assert "query" not in one["query_trace"][0]  # single-row steps keep their keys
    path = tmp_path / "g.csv"
    assert osm(*BACKWARD, "--query", "2,5", "--csv", path).exit_code == 0
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [(x["trace"], x["row"]) for x in rows] == [("key", "1")] * 2 + [
        ("query", "2")] * 4 + [("query", "5")] * 4
