"""The interactive page of `--html FILE` (issue 21, item 7), without a browser: one file with
nothing outside it, whose document is made of the records' own numbers and the lines of
--explain, with FA1's bytes moved so far; refusals and bad paths. tests/present/test_page_browser.py
drives the same pages in chromium."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import osm_cli
from conftest import no_leftovers, one_error, osm
from osm_cli.present.page import page
from osm_cli.reports.explain import (
    attention_step_lines,
    backward_key_lines,
    backward_query_lines,
    trace_lines,
)
from osm_cli.reports.rules import WHOLE
from osm_cli.studies.costmodel import hbm_bytes_flash

ATTENTION = ["attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
             "--block-q", "4", "--block-k", "2"]
BACKWARD = ["backward", "samples/q.npy", "samples/k.npy", "samples/v.npy", "samples/do.npy",
            "--causal", "--block-q", "4", "--block-k", "2", "--key", "3", "--query", "5"]


def document(path) -> dict:
    """The JSON document inside a page (its "<" written \\u003c)."""
    text = path.read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="osm-data">(.*?)</script>', text,
                     re.S).group(1)
    return json.loads(blob)


def made(tmp_path, *args, name="p.html"):
    r = osm(*args, "--html", tmp_path / name)
    assert r.exit_code == 0, r.output
    assert r.stderr.endswith(f"wrote {tmp_path / name} (interactive page, HTML)\n")
    return tmp_path / name


def test_trace_page_is_the_records(tmp_path):
    """The second worked example: each step's state and arithmetic as the records and
    --explain have them; the bytes of the row read so far."""
    doc = document(made(tmp_path, "trace", "--values", "1,2,5,3", "-b", "2"))
    t = osm_cli.online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2)
    # titled with the scores given inline, as the plot is (not "--values")
    assert doc["title"] == "osm trace: scores [1, 2, 5, 3] (inline), block 2, form rescale"
    assert [s["sections"][0]["lines"] for s in doc["steps"]] == [trace_lines(s) for s in t.steps]
    second = doc["steps"][1]
    assert second["title"] == "block 1, keys 2:4, scores [5, 3]" and second["lit"] == [2, 4]
    assert second["state"] == [["block max", "5"], ["m", "2 → 5"], ["α", "0.049787068"],
                               ["l", "1.3678794 → 1.203438"]]
    assert second["sections"][0]["lines"][2] == ("l = 1.3678794·0.049787068 + exp(5−5) + "
                                                 "exp(3−5) = 1.203438")
    assert [s["bytes"]["read"] for s in doc["steps"]] == [16, 32]  # float64 scores read once
    assert doc["vector"]["cells"] == ["1", "2", "5", "3"]
    assert doc["vector"]["shade"] == [round(float(p), 4) for p in t.probabilities]
    # as the terminal's final line has it
    assert doc["final"] == ["final: m = 5, l = 1.20343799, LSE = m + ln l = 5.185182453 "
                            "(natural log)"]


def test_trace_page_both_forms_and_the_sink(tmp_path):
    doc = document(made(tmp_path, "trace", "--values", "1,2,5,3", "-b", "2", "--form", "both",
                        "--sink", "4"))
    merge = osm_cli.online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2, form="merge")
    titles = [[x["title"] for x in s["sections"]] for s in doc["steps"]]
    assert titles[:2] == [["form rescale", "form merge"]] * 2
    assert doc["steps"][1]["sections"][1]["lines"] == trace_lines(merge.steps[1], "merge")
    sink = doc["steps"][-1]  # the sink joins after the last block, lighting no score
    assert sink["title"] == "the sink σ = 4" and sink["lit"] is None
    assert sink["state"][1] == ["m", "5"] and sink["state"][2] == ["α", "1"]


def test_page_is_one_file_with_nothing_outside_it(tmp_path):
    path = made(tmp_path, *ATTENTION)
    text = path.read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.html"]
    assert "default-src 'none'" in text  # the page may load nothing, even by mistake
    assert not re.search(r"(?:src|href)\s*=|https?://|<link|@import|url\(", text)
    assert text.count("<script") == 2  # the document, the script; both inline


def test_page_escapes_what_it_holds():
    """A name holding "</script>" or a placeholder stays text: the page has its own two
    script elements and the document reads back whole."""
    doc = {"title": "a</script><!--{{data}}", "steps": [], "intro": ["<b>{{screen}}"]}
    text = page(doc, screen="<pre>screen</pre>")
    assert text.count("</script>") == 2 and text.count("<pre>screen</pre>") == 1
    blob = re.search(r'id="osm-data">(.*?)</script>', text, re.S).group(1)
    assert json.loads(blob) == doc
    assert "<title>a&lt;/script&gt;&lt;!--{{data}}</title>" in text


def test_attention_page_is_the_records(tmp_path):
    doc = document(made(tmp_path, *ATTENTION))
    with np.load("samples/causal.npz") as z:
        q, k, v = z["q"], z["k"], z["v"]
    res = osm_cli.attention(q, k, v, causal=True, block_q=4, block_k=2, trace_at=(0, 1, 2))
    assert [s["sections"][0]["lines"] for s in doc["steps"]] == [
        attention_step_lines(res.trace.steps, k) for k in range(len(res.trace.steps))]
    second = doc["steps"][1]
    assert second["lit"] == [0, 4, 2, 4] and second["title"] == "tile 1, keys 2:4"
    assert second["state"][3] == ["l", "1.147522 → 1.265359"]
    assert second["state"][4] == ["O[:3]", "[-1.087618, 0.2525032, 1.058833]"]
    assert [s["skipped"] for s in doc["steps"]] == [False, False, True, True]
    m = doc["matrix"]
    assert (m["level"], m["rows"], m["cols"], m["row"]) == ("entry", 8, 8, 2)
    assert m["skip"] == [[False, False, True, True], [False, False, False, False]]
    assert m["cells"][2][:4] == ["0.79", "0.12", "0.09", ""]  # key 3 is hidden from query 2
    # the bytes moved by FA1's Algorithm 1 for one head (float32 inputs: 4 B an element)
    end = hbm_bytes_flash(8, 4, block_k=2, n_q=8, dtype_bytes=4, row_visits=res.counters.row_visits)
    assert {s["bytes"]["end"] for s in doc["steps"]} == {end}
    moved = [s["bytes"]["read"] + s["bytes"]["written"] for s in doc["steps"]]
    assert moved == sorted(moved) and moved[-1] < end  # Q tile 1 meets the tiles after Q tile 0


def test_large_attention_draws_tiles(tmp_path):
    doc = document(made(tmp_path, "attention", "--random", "1,1,300,8", "--causal", "--query",
                        "250", "--block-q", "64", "--block-k", "64"))
    m = doc["matrix"]
    assert (m["level"], m["rows"], m["cols"], m["row"]) == ("tile", 5, 5, 3)
    assert [s["lit"] for s in doc["steps"]][:2] == [[3, 4, 0, 1], [3, 4, 1, 2]]
    assert [s["skipped"] for s in doc["steps"]] == [False] * 4 + [True]


def test_backward_page_walks_the_loop(tmp_path):
    """FA2's backward loop, K/V tiles outer: the tiles key 3 (K/V tile 1) and query 5 (Q tile
    1) meet, in the loop's order, with the two traces' norms as the tables have them."""
    doc = document(made(tmp_path, *BACKWARD))
    titles = [s["title"] for s in doc["steps"]]
    assert titles == ["K/V tile 0 (keys 0:2) × Q tile 1 (rows 4:8)",
                      "K/V tile 1 (keys 2:4) × Q tile 0 (rows 0:4)",
                      "K/V tile 1 (keys 2:4) × Q tile 1 (rows 4:8)",
                      "K/V tile 2 (keys 4:6) × Q tile 1 (rows 4:8)",
                      "K/V tile 3 (keys 6:8) × Q tile 1 (rows 4:8)"]
    q, k, v, do = (np.load(f"samples/{n}.npy") for n in ("q", "k", "v", "do"))
    res = osm_cli.attention_backward(q, k, v, None, do, causal=True, block_q=4, block_k=2,
                                     trace_at=(0, 0, 5), trace_key=3)
    last = dict(doc["steps"][-1]["state"])
    assert math.isclose(float(last["‖dQ_i‖, query 5"]), res.trace.steps[-1].dq_norm,
                        rel_tol=1e-5)
    assert math.isclose(float(last["‖dK_j‖, key 3"]), res.trace.key_steps[-1].dk_norm, rel_tol=1e-5)
    assert doc["matrix"]["col"] == 3 and doc["matrix"]["row"] == 5


def test_attention_page_of_several_rows(tmp_path):
    """--query 0:4: each tile's state a line a row (the m, l and O vectors of Q tile 0), each
    row's arithmetic a section of its own, every traced row marked in the matrix, each row's
    LSE at the end."""
    doc = document(made(tmp_path, *ATTENTION[:5], "--query", "0:4", *ATTENTION[7:]))
    with np.load("samples/causal.npz") as z:
        q, k, v = z["q"], z["k"], z["v"]
    res = osm_cli.attention(q, k, v, causal=True, block_q=4, block_k=2,
                            trace_at=(0, 1, [0, 1, 2, 3]))
    assert doc["title"] == "osm attention: batch 0, head 1, queries 0:4"
    assert doc["state_head"] == ["query", "tile max", "m", "α", "l", "O[:3]", "‖O‖"]
    second = doc["steps"][1]
    assert [row[0] for row in second["state"]] == ["0", "1", "2", "3"]
    assert second["state"][2][1:5] == ["-0.345765", "1.792688", "1", "1.147522 → 1.265359"]
    assert second["state"][0][1] == "-inf"  # query 0 sees none of keys 2:4
    assert [x["title"] for x in second["sections"]] == [f"query {i}" for i in range(4)]
    for n, step in enumerate(doc["steps"][:2]):
        assert [x["lines"] for x in step["sections"]] == [
            attention_step_lines(tr, n) for tr in res.trace.rows]
    assert doc["steps"][2]["sections"] == [{"title": "", "lines": [
        "skipped for every traced row: the mask hides these keys; m, l, O unchanged"]}]
    assert second["lit"] == [0, 4, 2, 4]
    assert doc["matrix"]["traced_rows"] == [0, 1, 2, 3] and doc["matrix"]["row"] == 0
    lse = res.lse[1]  # (H, N): the inputs have no batch
    assert doc["final"] == [f"LSE = m + ln l = {float(lse[i]):.10g} (query {i})"
                            for i in range(4)]


def test_backward_page_shows_each_tiles_arithmetic(tmp_path):
    """Each step's lines are `osm backward --explain`'s: the key's column of P, dP, D and
    dS = P∘(dP − D) down the Q tile, the query rows' along the K/V tile, then the gradients'
    updates; with --query 4:6 a section a row."""
    doc = document(made(tmp_path, *BACKWARD[:-1], "4:6"))
    q, k, v, do = (np.load(f"samples/{n}.npy") for n in ("q", "k", "v", "do"))
    res = osm_cli.attention_backward(q, k, v, None, do, causal=True, block_q=4, block_k=2,
                                     trace_at=(0, 0, [4, 5]), trace_key=3)
    third = doc["steps"][2]  # K/V tile 1 × Q tile 1: the key's and both rows' tile
    assert third["title"] == "K/V tile 1 (keys 2:4) × Q tile 1 (rows 4:8)"
    titles = [x["title"] for x in third["sections"]]
    assert titles == ["key 3, down Q tile 1's rows", "query 4, along K/V tile 1's keys",
                      "query 5, along K/V tile 1's keys"]
    key, q4, q5 = (x["lines"] for x in third["sections"])
    assert key[:-2] == backward_key_lines(res.trace.key_steps[1], res.options.softmax_scale, 3)
    assert q4[:-1] == backward_query_lines(res.trace.rows[0][1], res.options.softmax_scale)
    assert q5[:-1] == backward_query_lines(res.trace.rows[1][1], res.options.softmax_scale)
    assert any(line.startswith("dS = P∘(dP − D)") for line in q4)
    assert "dS[4, 3] = " in "\n".join(key) and "dS[4, 3] = " in "\n".join(q4)
    state = dict(third["state"])
    assert set(state) == {"‖dK_j‖, key 3", "‖dV_j‖, key 3", "‖dQ_i‖, query 4",
                          "‖dQ_i‖, query 5"}
    assert doc["matrix"]["traced_rows"] == [4, 5] and doc["matrix"]["col"] == 3
    doc = document(made(tmp_path, *BACKWARD[:-3], "6", "--query", "5", name="k6.html"))
    skipped = doc["steps"][3]  # key 6's K/V tile 3 and Q tile 0 (rows 0:4): hidden
    assert skipped["title"] == "K/V tile 3 (keys 6:8) × Q tile 0 (rows 0:4)"
    assert skipped["skipped"] and not any(s["skipped"] for s in doc["steps"][:3])
    assert skipped["sections"][0]["lines"] == [
        "skipped, not computed: the mask hides the tile; dQ, dK, dV unchanged"]


def test_html_bad_path_is_one_error_and_no_file(tmp_path):
    where = tmp_path / "no"
    r = osm("trace", "--values", "1,2", "--html", where / "p.html")
    assert r.exit_code == 1 and r.stdout == ""
    assert one_error(r.stderr) == f"{where / 'p.html'}: folder {where} does not exist"
    r = osm("trace", "--values", "1,2", "--html", tmp_path)  # a folder
    assert r.exit_code == 1 and r.stdout == "" and one_error(r.stderr)
    assert list(tmp_path.iterdir()) == [] and no_leftovers(tmp_path) == []


def test_html_keeps_a_page_whole_or_refuses(tmp_path):
    scores = tmp_path / "s.txt"
    scores.write_text(",".join(["1"] * (WHOLE + 1)))
    r = osm("trace", scores, "-b", "1", "--html", tmp_path / "p.html")
    assert r.exit_code == 1 and one_error(r.stderr) == (
        f"--html shows every block; {WHOLE + 1} blocks are more than the page holds ({WHOLE}): "
        "a larger --block makes fewer")
    assert not (tmp_path / "p.html").exists()
    doc = document(made(tmp_path, "trace", scores, "-b", "2"))  # every block, none elided
    assert len(doc["steps"]) == -(-(WHOLE + 1) // 2)
    assert doc["vector"]["groups"][0] == [0, 1]  # too many scores: one cell a block


VARLEN = ["samples/varlen/q.npy", "samples/varlen/k.npy", "samples/varlen/v.npy",
          "--cu-seqlens-q", "samples/varlen/cu_seqlens_q.npy", "--cu-seqlens-k",
          "samples/varlen/cu_seqlens_k.npy", "--layout", "bnhd"]


@pytest.mark.parametrize("args, words", [
    (["attention", "samples/qkv.npz", "--dtype", "fp16", "--precision", "naive"],
     "--html show the tiles of the tiled run"),
    (["attention", *VARLEN], "--html draw one dense head"),
    (["backward", *VARLEN], "--html draws one dense head"),
])
def test_refuses_a_page_it_cannot_draw(tmp_path, args, words):
    r = osm(*args, "--html", tmp_path / "p.html")
    assert r.exit_code == 1 and words in one_error(r.stderr), r.stderr
    assert list(tmp_path.iterdir()) == []
