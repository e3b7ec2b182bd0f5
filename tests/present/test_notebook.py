"""The public records in notebooks (issue 21, item 11): what online_softmax, attention,
attention_backward and check return shows as tables in Jupyter (`_repr_html_`,
`_repr_markdown_`), with the terminal tables' cells, escaped; and docs/notebooks.md's cells,
run here, show what the page says they show."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import osm_cli
from osm_cli.core.notebook import Table, html_tables, markdown_tables

ROOT = Path(__file__).resolve().parents[2]


def test_trace_shows_its_steps():
    t = osm_cli.online_softmax(np.array([1.0, 2.0, 5.0, 3.0]), block=2)
    md = t._repr_markdown_()
    assert "| 1 | 2:4 | 5 | 2 → 5 | 0.049787068 | 1.3678794 → 1.203438 |" in md
    assert "| l | 1.20343799 |" in md and "| LSE = m + ln l | 5.185182453 |" in md
    page = t._repr_html_()
    assert page.startswith('<div class="osm-record">') and page.count("<table>") == 2
    assert '<td style="text-align:right">0.049787068</td>' in page


def test_a_long_trace_is_elided_with_a_note():
    t = osm_cli.online_softmax(np.arange(40.0), block=2)
    md = t._repr_markdown_()
    assert md.count("\n| ") == 2 + 5 + 1 + 5 + 4  # the header, 5 rows, ⋮, 5 rows; 4 final
    assert "| ⋮ | ⋮ |" in md and "*⋮ 10 blocks not shown*" in md
    assert "| 19 | 38:40 | 39 | 37 → 39 | 0.13533528 | 1.5819767 |" in md


def test_attention_shows_summary_and_trace():
    with np.load("samples/causal.npz") as z:
        q, k, v = z["q"], z["k"], z["v"]
    r = osm_cli.attention(q, k, v, causal=True, block_q=4, block_k=2, trace_at=(0, 1, 2))
    md = r._repr_markdown_()
    assert "| tiles | block_q 4, block_k 2: 6 computed, 2 skipped of 8 |" in md
    assert ("| 1 | 2:4 | -0.345765 | 1.792688 | 1 | 1.147522 → 1.265359 | "
            "[-1.088, 0.2525, 1.059] | 2.009255 |") in md
    assert "| 2 | 4:6 | skipped | 1.792688 |   | 1.265359 |   |   |" in md
    assert "<th style=\"text-align:right\">‖O‖</th>" in r._repr_html_()


def test_backward_shows_both_traces():
    q, k, v, do = (np.load(f"samples/{n}.npy") for n in ("q", "k", "v", "do"))
    g = osm_cli.attention_backward(q, k, v, None, do, causal=True, block_q=4, block_k=2)
    md = g._repr_markdown_()
    assert "| 0 | 0:4 | 1 | 0.89643288 | 0.37397602 | 1.1387664 |" in md  # as osm backward
    assert "| 2 | 4:6 | skipped |   | 0 |" in md
    assert "| D = rowsum(dO∘O) | -1.58211 to 1.84438 |" in md


def test_several_rows_show_side_by_side():
    """--query 0:4's records in Jupyter: a line per row under each tile (the m, l and O vectors
    of Q tile 0), not the first row alone; backward's dQ_i likewise for each traced row."""
    with np.load("samples/causal.npz") as z:
        q, k, v = z["q"], z["k"], z["v"]
    r = osm_cli.attention(q, k, v, causal=True, block_q=4, block_k=2,
                          trace_at=(0, 1, [0, 1, 2, 3]))
    md = r._repr_markdown_()
    assert "**trace of batch 0, head 1, queries 0:4: start m = -inf, l = 0, O = 0" in md
    assert "| tile | keys | query | tile max | m | α | l | O[:3] of 4 | ‖O‖ |" in md
    assert ("|   |   | 2 | -0.345765 | 1.792688 | 1 | 1.147522 → 1.265359 | "
            "[-1.088, 0.2525, 1.059] | 2.009255 |") in md  # query 2's line as its own trace's
    assert "| 1 | 2:4 | 0 | -inf | 0.8353411 | 1 | 1 |" in md
    assert md.count("| skipped |") == 8  # tiles 2 and 3, for each of the 4 rows
    q, k, v, do = (np.load(f"samples/{n}.npy") for n in ("q", "k", "v", "do"))
    g = osm_cli.attention_backward(q, k, v, None, do, causal=True, block_q=4, block_k=2,
                                   trace_at=(0, 0, [4, 5]), trace_key=3)
    md = g._repr_markdown_()
    assert "**queries 4, 5 of batch 0, head 0: dQ_i over the K/V tiles" in md
    lines = [ln for ln in md.splitlines() if ln.startswith("|   |   | 5 |")]
    assert len(lines) == 4 and lines[-1].endswith(
        f"| {g.trace.rows[1][-1].dq_norm:.8g} |")


def test_check_shows_its_verdicts():
    with np.load("samples/kernel_fp16.npz") as z:
        c = osm_cli.check(z["q"], z["k"], z["v"], z["out"], dtype="float16", causal=True,
                          lse=z["lse"])
    md = c._repr_markdown_()
    assert md.startswith("**check: PASS**")
    assert "| out | 0.000977 | 0.00586 | PASS |   |" in md
    assert "| LSE | 8.77e-07 | 0.000803 | PASS |   |" in md
    with np.load("samples/kernel_fp16.npz") as z:  # its output off by a third: a FAIL
        bad = osm_cli.check(z["q"], z["k"], z["v"], z["out"] * 1.3, dtype="float16",
                            causal=True, probe=False)
    md = bad._repr_markdown_()
    assert md.startswith("**check: FAIL**") and "| out |" in md and "| FAIL |" in md


def test_cells_are_escaped():
    t = [Table("a <b> | c", ("x|y", "<z>"), (("1 | 2", "<script>"),), note="n|o")]
    page = html_tables(t)
    assert "<script>" not in page and "&lt;script&gt;" in page and "a &lt;b&gt; | c" in page
    md = markdown_tables(t)
    assert "| x\\|y | <z> |" in md and "| 1 \\| 2 | <script> |" in md


@pytest.mark.parametrize("name", ["Trace", "Attention", "Backward", "CheckReport"])
def test_every_public_record_has_both(name):
    record = getattr(osm_cli, name)
    assert callable(record._repr_html_) and callable(record._repr_markdown_)


def test_the_docs_page_shows_what_the_records_show():
    """docs/notebooks.md: each ```python cell is run (in order, in one namespace, from the
    repository root) and the markdown after it is its last line's _repr_markdown_()."""
    text = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    cells = re.findall(r"```python\n(.*?)```\n\n<!-- (\w+)\._repr_markdown_\(\) -->\n(.*?)\n"
                       r"<!-- end -->", text, re.S)
    assert len(cells) == 4
    names: dict = {}
    for code, var, shown in cells:
        exec(compile(code, "docs/notebooks.md", "exec"), names)
        assert names[var]._repr_markdown_().strip() == shown.strip(), var
