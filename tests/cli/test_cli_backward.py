"""`osm backward` as a user runs it: the README's worked example as rendered text at 80 and 100
columns, outputs equal to the Python API's, strict JSON, the CSV, all-or-nothing writes, and bad
input as one "Error:" line."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import osm, render_text
from osm_cli.flash.backward import attention_backward
from osm_cli.flash.options import ScoreOptions, Tiling
from osm_cli.present import backward as render
from osm_cli.reports.backward import backward_report

SAMPLES = ["samples/q.npy", "samples/k.npy", "samples/v.npy", "samples/do.npy"]


def assert_one_error_line(result, code=1, words=None):
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    if words is not None:
        assert words in lines[0], lines[0]


def tiny_report():
    with np.load("samples/backward_tiny.npz") as z:
        q, k, v, do = (z[n] for n in ("q", "k", "v", "do"))
    return backward_report(q, k, v, do, ScoreOptions(scale=1.0), Tiling(block_k=1))


def page(rep, width):
    """What osm backward prints, at `width` columns, each line's trailing spaces dropped."""
    text = "".join(render_text(x, width) for x in (
        *render.backward_heads(rep), render.key_trace(rep, width),
        render.query_trace(rep, width), render.backward_results(rep)))
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


@pytest.mark.parametrize("width", [80, 100])
def test_worked_example_as_printed(width):
    """The README's example: one query, two keys, each key its own K/V tile, so the query trace
    shows each key's P and dS: P = 0.7310586 and 0.2689414, dS = ∓0.7864477 (summing to 0)."""
    text = page(tiny_report(), width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    assert "…" not in text
    assert "D = rowsum(dO∘O)    4.07577\n" in text
    assert "block_q 128, block_k 1: 2 computed, 0 skipped of 2" in text
    query = text[text.index("query 0 of batch 0, head 0: dQ_i over the K/V tiles"):]
    assert "0   0:1  0.73105858  -0.78644773  0.78644773" in query
    assert "1   1:2  0.26894142   0.78644773   1.1122051" in query
    assert "dQ[0] vs the float64 reference: max |difference| = 0" in text
    assert " 0   -0.786447733   -0.786447733   0.7310585786" in text


def test_cli_matches_the_api_and_writes_the_gradients(tmp_path):
    outs = [tmp_path / f"{n}.npy" for n in ("dq", "dk", "dv")]
    result = osm("backward", *SAMPLES, "--causal", "--block-q", 2, "--block-k", 2, "--key", 3,
                 "--query", 5, "--head", 1, "--dq", outs[0], "--dk", outs[1], "--dv", outs[2])
    assert result.exit_code == 0, result.stderr
    q, k, v, do = (np.load(p) for p in SAMPLES)
    api = attention_backward(q, k, v, do, causal=True, block_q=2, block_k=2)
    for path, want in zip(outs, (api.dq, api.dk, api.dv), strict=True):
        np.testing.assert_array_equal(np.load(path), want)
    assert "key 3 of batch 0, kv head 1 (query head 1)" in result.stdout
    assert "query 5 of batch 0, head 1" in result.stdout
    assert "8 skipped" not in result.stdout  # t = s = 8, block 2: 6 of 16 tiles are hidden
    assert "10 computed, 6 skipped of 16" in result.stdout


def test_json_and_csv(tmp_path, strict_json):
    csv = tmp_path / "t.csv"
    result = osm("backward", *SAMPLES, "--block-k", 2, "--block-q", 4, "--json", "--csv", csv)
    assert result.exit_code == 0, result.stderr
    doc = strict_json(result.stdout)
    assert doc["tiles_total"] == 8 and doc["own_forward"] is True
    assert set(doc["errors"]) == {"dq", "dk", "dv"}
    assert doc["errors"]["dq"]["max_abs_err"] < 1e-6
    assert len(doc["key_trace"]) == 2 and len(doc["query_trace"]) == 4
    assert doc["key_trace"][0]["start"] == 0 and "dk_norm" in doc["key_trace"][0]
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("trace,batch,head,row,tile,start,stop,masked,p_max,ds_sum")
    assert len(lines) == 1 + 2 + 4


def test_kernel_forward_and_dtype(tmp_path):
    """--o/--lse: the kernel's saved forward; --dtype: the flash model and each gradient's rule."""
    q, k, v, do = (np.load(p) for p in SAMPLES)
    from osm_cli.flash.forward import attention

    fwd = attention(q, k, v)
    np.save(tmp_path / "o.npy", fwd.out)
    np.save(tmp_path / "lse.npy", fwd.lse)
    result = osm("backward", *SAMPLES, "--o", tmp_path / "o.npy", "--lse", tmp_path / "lse.npy",
                 "--dtype", "bf16")
    assert result.exit_code == 0, result.stderr
    assert "given O and LSE (a kernel's saved forward)" in result.stdout
    assert "flash backward (FA2)" in result.stdout
    for g in ("dQ", "dK", "dV"):
        assert f"{g} rule" in result.stdout
    assert "verdict              PASS" in result.stdout


def test_bundle_with_do(strict_json):
    result = osm("backward", "samples/backward_tiny.npz", "--scale", 1, "--json")
    assert result.exit_code == 0, result.stderr
    doc = strict_json(result.stdout)
    assert doc["traced_rows"]["dq"] == pytest.approx([-0.786447733, 0.786447733])


@pytest.mark.parametrize("make, words", [
    (lambda t: [*SAMPLES[:3], _save(t, "do", np.zeros((2, 8, 3)))], "dO has shape (2, 8, 3)"),
    (lambda t: [*SAMPLES, "--o", "samples/q.npy"], "give --o and --lse together"),
    (lambda t: [*SAMPLES, "--o", "samples/q.npy", "--lse", _save(t, "l", np.zeros((2, 7)))],
     "LSE has shape (2, 7)"),
    (lambda t: [*SAMPLES, "--o", "samples/q.npy", "--lse",
                _save(t, "l", np.full((2, 8), np.nan))], "LSE holds NaN"),
    # Q K V without a dO, as files or a bundle, is not an error: a seeded dO is used
    # (tests/studies/test_learner_inputs.py)
    (lambda t: [*SAMPLES, "samples/q.npy"], "expected Q K V DO"),
    (lambda t: [*SAMPLES, "--key", 8], "traced key 8 is outside K's 8 keys"),
    (lambda t: [*SAMPLES[:3], _save(t, "do", np.full((2, 8, 4), np.inf))], "dO holds inf"),
])
def test_bad_input_is_one_error_line(tmp_path, make, words):
    assert_one_error_line(osm("backward", *make(tmp_path)), words=words)


def test_bad_dtype_is_a_usage_error():
    result = osm("backward", *SAMPLES, "--dtype", "fp12")
    assert result.exit_code == 2 and "fp12" in result.stderr


def test_outputs_all_or_none(tmp_path):
    dq = tmp_path / "dq.npy"
    result = osm("backward", *SAMPLES, "--dq", dq, "--dk", tmp_path / "missing" / "dk.npy")
    assert_one_error_line(result)
    assert not dq.exists()
    result = osm("backward", *SAMPLES, "--dq", dq, "--dk", dq)
    assert_one_error_line(result)
    assert not dq.exists()


def _save(tmp_path, name, arr):
    path = tmp_path / f"{name}.npy"
    np.save(path, arr)
    return path
