"""The command line: exit codes AND messages, strict JSON, every bad input of issue 2 item 7."""

from __future__ import annotations

import json
import math
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer

from conftest import osm, strict_json
from osm_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
E = math.exp


def ok(*args, input=None):
    result = osm(*args, input=input, code=0)
    assert result.stderr == ""
    return result


def error(*args, input=None) -> str:
    """A bad input: exit 1, nothing on stdout, exactly one 'Error: …' line on stderr."""
    result = osm(*args, input=input, code=1)
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ")
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr.rstrip("\n")


def trace_json(*args, input=None) -> dict:
    return strict_json(ok("trace", *args, "--json", input=input).stdout)


# ---------------------------------------------------------------------------------------------
# trace: tables


def test_trace_seed_example_tables():
    out = ok("trace", "samples/scores.txt", "-b", "2").stdout
    assert out.startswith("samples/scores.txt: 4 scores in 2 blocks of 2\nstart: m = -inf, l = 0\n")
    assert re.search(r"0\s+0:2\s+\[2, 4\]\s+4\s+-inf → 4\s+0\s+0 → 1\.1353353\s*\n", out)
    assert re.search(r"1\s+2:4\s+\[1, 3\]\s+3\s+4\s+1\s+1\.1353353 → 1\.5530018\s*\n", out)
    assert "final: m = 4, l = 1.553001793, LSE = m + ln l = 4.440189699 (natural log)" in out
    assert re.search(r"1\s+4\s+0\.643914259888\s+0\.643914259888\s+0\.643914\s", out)
    assert "online vs one-shot stabilized: max |difference| = " in out
    assert "all rows" not in out  # a vector has no summary of rows


def test_trace_merge_table():
    out = ok("trace", "--values", "1,2,5,3", "-b", "2", "--form", "merge").stdout
    assert out.startswith("--values: 4 scores in 2 blocks of 2\n")
    assert re.search(r"1\s+2:4\s+5\s+1\.1353353\s+2 → 5\s+0\.049787068\s+1\s+1\.3678794 → "
                     r"1\.203438\s*\n", out)
    assert "final: m = 5, l = 1.20343799, LSE = m + ln l = 5.185182453" in out


def test_trace_form_both_tables():
    out = ok("trace", "samples/max_changes.txt", "--form", "both").stdout
    assert "form rescale:" in out and "form merge:" in out
    assert out.index("form rescale:") < out.index("form merge:")
    match = re.search(r"rescale vs merge: max \|difference\| = (\S+)", out)
    assert match and float(match.group(1)) <= 1e-15


FORTY = ",".join(str(i) for i in range(40))  # 20 blocks of 2, 40 elements


def test_trace_long_input_is_elided():
    """Rising scores move m at every block: no block is hidden; the elements are, and a
    caption says how many."""
    short = ok("trace", "--values", FORTY, "-b", "2").stdout
    # the element table's ellipsis row and its caption
    assert sum("⋮" in line for line in short.splitlines()) == 2
    assert re.search(r"\n\s*10\s+20:22\s", short)  # block 10: m moved there, so it is shown
    assert not re.search(r"\n\s*20\s+20\s", short)  # element 20 is hidden
    assert "⋮ 30 rows not shown (--all shows every row)" in short


def test_elision_never_hides_a_block_where_m_moved():
    """31 blocks of one score: m moves at blocks 0, 10 and 21 only; the rows between the first
    and last five are elided except those, and the caption counts what was left out."""
    scores = ",".join(["1"] * 10 + ["5"] + ["1"] * 10 + ["7"] + ["1"] * 10)
    out = ok("trace", "--values", scores, "-b", "1").stdout
    table = out[:out.index("final:")]
    shown = [int(line.split()[0]) for line in table.splitlines()
             if re.match(r"\s*\d+\s+\d+:\d+", line)]
    assert shown == [0, 1, 2, 3, 4, 10, 21, 27, 28, 29, 30, 31]
    assert table.count("\n  ⋮") == 3  # three runs left out: 5–9, 11–20, 22–26
    assert "⋮ 20 blocks not shown, where m did not move (--all shows every row)" in table
    assert re.search(r"\n\s*10\s+10:11\s+\[5\]\s+5\s+1 → 5\s+0.018315639", table)


def test_trace_all_shows_every_element():
    full = ok("trace", "--values", FORTY, "-b", "2", "--all").stdout
    assert re.search(r"\n\s*20\s+20\s+\S+e-", full)  # element 20: p = e^(20-39) / l


def test_trace_all_shows_every_block():
    full = ok("trace", "--values", FORTY, "-b", "2", "--all").stdout
    assert "⋮" not in full
    assert re.search(r"\n\s*10\s+20:22\s", full)


def test_trace_masked_sample():
    out = ok("trace", "samples/masked.txt", "-b", "4").stdout
    assert "6 scores in 2 blocks of 4" in out
    assert "final: m = 3, l = 1.287058021, LSE = m + ln l = 3.25235901" in out


def test_trace_output_lines_fit_100_columns():
    from rich.cells import cell_len

    for form in ("rescale", "merge", "both"):
        out = ok("trace", "samples/matrix.txt", "--form", form, "--row", "3").stdout
        assert max(cell_len(line) for line in out.splitlines()) <= 100


# ---------------------------------------------------------------------------------------------
# trace: JSON

SEEDS = {
    # scores: [(m, scale, l) after each block], final (m, l, lse)
    "2,4,1,3": (
        [(4.0, 0.0, E(-2) + 1), (4.0, 1.0, E(-2) + 1 + E(-3) + E(-1))],
        ("4", "1.5530018", "4.4401897"),
    ),
    "1,2,5,3": (
        [(2.0, 0.0, E(-1) + 1), (5.0, E(-3), (E(-1) + 1) * E(-3) + 1 + E(-2))],
        ("5", "1.203438", "5.1851825"),
    ),
}
SEVEN = {  # the seed document's numbers, 7-8 significant digits as printed there
    "2,4,1,3": [("4", "0", "1.1353353"), ("4", "1", "1.5530018")],
    "1,2,5,3": [("2", "0", "1.3678794"), ("5", "0.049787068", "1.203438")],
}


def sig(x: float, digits: int = 8) -> str:
    return f"{x:.{digits}g}"


@pytest.mark.parametrize("form", ["rescale", "merge"])
@pytest.mark.parametrize("values", list(SEEDS))
def test_trace_json_seed_examples(values, form):
    doc = trace_json("--values", values, "-b", "2", "--form", form)
    steps, (m, l, lse) = SEEDS[values]
    assert doc["block"] == 2 and doc["form"] == form and doc["row"] == 0
    assert doc["shape"] == [4] and doc["lse_base"] == "e"
    assert len(doc["steps"]) == 2
    for k, (step, (m_k, scale_k, l_k), printed) in enumerate(
        zip(doc["steps"], steps, SEVEN[values], strict=True)
    ):
        assert (step["block"], step["start"], step["stop"]) == (k, 2 * k, 2 * k + 2)
        assert step["m"] == m_k
        assert step["scale"] == pytest.approx(scale_k, rel=1e-15, abs=0)
        assert step["l"] == pytest.approx(l_k, rel=1e-15)
        assert (sig(step["m"]), sig(step["scale"]), sig(step["l"])) == printed
        assert f"{step['l']:.7g}" == f"{l_k:.7g}"  # 7 significant digits, as the issue asks
    first, second = doc["steps"]
    assert first["m_prev"] == "-inf" and first["l_prev"] == 0
    assert second["m_prev"] == first["m"] and second["l_prev"] == first["l"]
    assert second["rescaled"] is (values == "1,2,5,3")
    assert (sig(doc["m"]), sig(doc["l"]), sig(doc["lse"])) == (m, l, lse)
    assert doc["lse"] == pytest.approx(doc["m"] + math.log(doc["l"]), rel=1e-15)
    assert sum(doc["probabilities"]) == pytest.approx(1, rel=1e-15)
    np.testing.assert_allclose(doc["probabilities"], doc["reference"], rtol=1e-14)
    np.testing.assert_allclose(doc["naive"], doc["reference"], rtol=1e-14)
    assert 0 <= doc["max_abs_diff"] < 1e-15
    if form == "merge":
        assert {"block_m", "block_l", "block_weight"} <= set(first)
        assert first["block_m"] == first["m"] and first["block_weight"] == 1
    else:
        assert "block_l" not in first


def test_trace_json_merge_statistics():
    """[1, 2] | [5, 3]: l⁽¹⁾ = 1 + e^-2 = 1.1353353 enters with w = 1; the old l gets α = e^-3."""
    step = trace_json("--values", "1,2,5,3", "-b", "2", "--form", "merge")["steps"][1]
    assert step["block_m"] == 5
    assert sig(step["block_l"]) == "1.1353353"
    assert step["block_weight"] == 1
    step = trace_json("--values", "2,4,1,3", "-b", "2", "--form", "merge")["steps"][1]
    assert step["block_m"] == 3 and sig(step["block_weight"]) == "0.36787944"


@pytest.mark.parametrize("values", list(SEEDS) + ["-inf,1.5,-inf,0.25,3,-inf", "0,-700,700,3"])
@pytest.mark.parametrize("block", [1, 2, 3])
def test_merge_probabilities_equal_rescale(values, block):
    a = trace_json("--values", values, "-b", block)
    b = trace_json("--values", values, "-b", block, "--form", "merge")
    np.testing.assert_allclose(b["probabilities"], a["probabilities"], rtol=1e-14, atol=0)
    assert b["lse"] == pytest.approx(a["lse"], rel=1e-15)
    assert [s["m"] for s in b["steps"]] == [s["m"] for s in a["steps"]]


def test_trace_json_form_both():
    doc = trace_json("--values", "1,2,5,3", "--form", "both")
    assert doc["form"] == "both"
    assert "block_l" not in doc["steps"][0]
    assert sig(doc["merge_steps"][1]["block_l"]) == "1.1353353"
    assert [s["l"] for s in doc["merge_steps"]] == pytest.approx([s["l"] for s in doc["steps"]],
                                                                 rel=1e-15)
    assert 0 <= doc["forms_max_abs_diff"] <= 1e-15


def test_trace_row_of_matrix():
    out = ok("trace", "samples/matrix.txt", "--row", "1").stdout
    assert out.startswith("samples/matrix.txt: row 1 of 4, 4 scores in 2 blocks of 2\n")
    assert "0.049787068" in out  # row 1 is the second seed example
    assert "final: m = 5, l = 1.20343799" in out
    assert "all rows" in out
    assert re.search(r"\n\s+2\s+-inf\s+0\s+-inf\s+0\s*\n", out)  # the masked row's summary

    doc = trace_json("samples/matrix.txt", "--row", "1")
    assert doc["row"] == 1 and doc["shape"] == [4, 4]
    assert doc["m"] == [4, 5, "-inf", 2]
    assert doc["l"][2] == 0 and doc["lse"][2] == "-inf"
    assert [sig(x) for x in (doc["lse"][0], doc["lse"][1])] == ["4.4401897", "5.1851825"]
    assert sig(doc["steps"][1]["scale"]) == "0.049787068"
    assert doc["probabilities"][2] == [0, 0, 0, 0]
    assert doc["naive"][2] == ["nan"] * 4  # 0 / 0, shown as a string


def test_trace_fully_masked_row_json():
    doc = trace_json("samples/matrix.txt", "--row", "2", "-b", "3")
    for step in doc["steps"]:
        assert step["m"] == "-inf" and step["l"] == 0 and step["scale"] in (0, 1)
        assert step["block_max"] == "-inf"


def test_trace_row_out_of_range():
    msg = error("trace", "samples/matrix.txt", "--row", "4")
    assert msg == "Error: samples/matrix.txt: --row 4 is out of range; it has 4 row(s)"
    assert "out of range" in error("trace", "samples/scores.txt", "--row", "1")
    result = osm("trace", "samples/matrix.txt", "--row", "-1")
    assert result.exit_code == 2 and "--row" in result.stderr


# ---------------------------------------------------------------------------------------------
# trace: other inputs


def test_trace_stdin():
    out = ok("trace", "-", input="1 2 5 3").stdout
    assert out.startswith("<stdin>: 4 scores in 2 blocks of 2")
    assert "0.049787068" in out
    doc = trace_json("-", input="2 4\n1 3\n")
    assert doc["shape"] == [2, 2] and doc["m"] == [4, 3]


def _seed2_json_ok(doc: dict):
    assert sig(doc["steps"][1]["scale"]) == "0.049787068"
    assert sig(doc["l"] if not isinstance(doc["l"], list) else doc["l"][0]) == "1.203438"


def test_trace_npy(tmp_path):
    p = tmp_path / "s.npy"
    np.save(p, np.array([1.0, 2.0, 5.0, 3.0]))
    _seed2_json_ok(trace_json(p))
    out = ok("trace", p).stdout
    assert out.startswith(f"{p}: 4 scores in 2 blocks of 2")


def test_trace_npy_float32_matrix(tmp_path):
    p = tmp_path / "m.npy"
    np.save(p, np.array([[1, 2, 5, 3], [2, 4, 1, 3]], dtype=np.float32))
    doc = trace_json(p)
    assert doc["shape"] == [2, 4]
    _seed2_json_ok(doc)


def test_trace_npz(tmp_path):
    p = tmp_path / "s.npz"
    np.savez(p, scores=np.array([1.0, 2.0, 5.0, 3.0]))
    _seed2_json_ok(trace_json(p))


def test_trace_csv(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("1,2,5,3\n2,4,1,3\n")
    doc = trace_json(p)
    assert doc["shape"] == [2, 4]
    _seed2_json_ok(doc)


def test_trace_int_npy_and_column_text(tmp_path):
    p = tmp_path / "i.npy"
    np.save(p, np.array([1, 2, 5, 3], dtype=np.int64))
    _seed2_json_ok(trace_json(p))
    col = tmp_path / "col.txt"
    col.write_text("1\n2\n5\n3\n")
    _seed2_json_ok(trace_json(col))


# ---------------------------------------------------------------------------------------------
# bad input (issue 2, item 7): exit 1, one "Error:" line naming the file and the problem


def test_missing_file():
    assert error("trace", "no/such/file.txt") == "Error: no/such/file.txt: no such file"


def test_directory():
    assert error("trace", "samples") == "Error: samples: is a directory, not a file"


def test_empty_file(tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("")
    assert error("trace", p) == f"Error: {p}: no numbers found (the input is empty)"
    blank = tmp_path / "blank.txt"
    blank.write_text("# just a comment\n\n")
    assert "no numbers found" in error("trace", blank)


def test_empty_stdin():
    assert error("trace", "-", input="") == (
        "Error: <stdin>: no numbers found (the input is empty)"
    )


def test_non_numeric_token(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("1 2 3\n4 oops 6\n")
    assert error("trace", p) == f"Error: {p}: line 2, column 3: 'oops' is not a number"
    assert error("trace", "--values", "1,x,3") == (
        "Error: --values: line 1, column 3: 'x' is not a number"
    )


def test_ragged_rows(tmp_path):
    p = tmp_path / "ragged.txt"
    p.write_text("1 2 3\n4 5\n")
    msg = error("trace", p)
    assert msg.startswith(f"Error: {p}: line 2 has 2 numbers but line 1 has 3")


def test_nan_in_scores(tmp_path):
    assert error("trace", "--values", "1 2 nan") == (
        "Error: --values: NaN at index 2; softmax of NaN is undefined"
    )
    p = tmp_path / "nan.npy"
    np.save(p, np.array([[1.0, 2.0], [np.nan, 0.0]]))
    assert error("trace", p).startswith(f"Error: {p}: NaN at index (1, 0)")


def test_plus_inf_in_scores():
    msg = error("trace", "--values", "1,inf,-inf")
    assert msg.startswith("Error: --values: +inf at index 1;")


@pytest.mark.parametrize(
    "arr, words",
    [(np.array(2.0), "is a single number (0-d)"), (np.zeros((2, 2, 2)), "has 3 dimensions")],
    ids=["0-d", "3-D"],
)
def test_wrong_dimensions(tmp_path, arr, words):
    p = tmp_path / "a.npy"
    np.save(p, arr)
    msg = error("trace", p)
    assert msg.startswith(f"Error: {p}: {words}")


def test_object_npy(tmp_path):
    p = tmp_path / "obj.npy"
    np.save(p, np.array([1.0, "x"], dtype=object), allow_pickle=True)
    msg = error("trace", p)
    assert msg.startswith(f"Error: {p}: ") and ("pickle" in msg or "objects" in msg)


def test_pickled_npy(tmp_path):
    p = tmp_path / "pickled.npy"
    p.write_bytes(pickle.dumps({"scores": [1.0, 2.0]}))
    msg = error("trace", p)
    assert msg.startswith(f"Error: {p}: ") and "pickle" in msg


def test_text_file_named_npy(tmp_path):
    p = tmp_path / "text.npy"
    p.write_text("1 2 5 3\n")
    assert error("trace", p).startswith(f"Error: {p}: ")


def test_non_array_npz(tmp_path):
    p = tmp_path / "fake.npz"
    p.write_text("not a zip\n")
    assert error("trace", p).startswith(f"Error: {p}: ")


def test_npz_with_two_arrays(tmp_path):
    p = tmp_path / "two.npz"
    np.savez(p, q=np.zeros(4), k=np.ones(4))
    assert error("trace", p) == f"Error: {p}: holds 2 arrays (q, k); expected exactly one"


def test_boolean_npy(tmp_path):
    p = tmp_path / "b.npy"
    np.save(p, np.array([True, False]))
    assert "boolean" in error("trace", p)


def test_no_scores_and_both_sources():
    assert error("trace").startswith("Error: no scores given")
    assert "not both" in error("trace", "samples/scores.txt", "--values", "1,2")


@pytest.mark.parametrize("block", ["0", "-1"])
def test_bad_block(block):
    result = osm("trace", "samples/scores.txt", "--block", block)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "Invalid value for '--block'" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("Error: ")


def test_bad_form():
    result = osm("trace", "samples/scores.txt", "--form", "sideways")
    assert result.exit_code == 2 and "--form" in result.stderr


def test_error_line_is_one_line_even_when_long(tmp_path):
    """A long path does not wrap the message onto a second line (stderr is not a terminal)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    msg = error("trace", deep / "missing.txt")
    assert msg.endswith("missing.txt: no such file")


def test_trace_extreme_magnitudes():
    doc = trace_json("--values", "1e308,-1e308", "-b", "1")
    assert doc["probabilities"] == [1, 0]


# ---------------------------------------------------------------------------------------------
# overflow-demo


def test_overflow_demo_default():
    out = ok("overflow-demo").stdout
    assert out.startswith("exp(x) in each dtype (x = 100, 102, 99)")
    assert re.search(r"float16\s+6\.55e\+04\s+11\.0899\s+-17\.3287\s+inf\s+inf\s+inf", out)
    assert re.search(r"float64\s+1\.798e\+308\s+709\.783\s+-745\.133\s+2\.688e\+43", out)
    assert re.search(r"float32\s+naive\s+nan\s+nan\s+nan", out)
    assert re.search(r"float64\s+naive\s+0\.114195\s+0\.843795\s+0\.0420101", out)
    assert re.search(r"online \(osm\)\s+\[0, 0, 0\]", out)
    assert re.search(r"stabilized \(textbook\)\s+\[nan, nan, nan\]", out)
    assert "the textbook stabilized form gives NaN" in " ".join(out.split())


def test_the_fully_masked_row_is_explained_alike_in_trace_and_overflow_demo():
    """One explanation, word for word, in both commands (overflow-demo's masked table, the
    trace of a row with every score -inf), then which of each one's columns is which form."""
    from osm_cli.studies.overflow import MASKED_ROW

    demo = " ".join(ok("overflow-demo").stdout.split())
    trace = " ".join(ok("trace", "--values", "-inf,-inf,-inf").stdout.split())
    assert MASKED_ROW in demo and MASKED_ROW in trace
    assert ("naive and stabilized (textbook) are the unguarded forms, online (osm) the "
            "guarded") in demo
    assert ("Here online p and stabilized p are osm's guarded forms (0 for every entry); naive p "
            "is 0 / 0 = nan.") in trace
    assert MASKED_ROW not in " ".join(ok("trace", "--values", "-inf,1").stdout.split())


def test_overflow_demo_with_values():
    out = ok("overflow-demo", "10", "11", "12").stdout
    assert out.startswith("exp(x) in each dtype (x = 10, 11, 12)")
    words = " ".join(out.split())  # the note wraps at 100 columns
    assert "exp overflows to inf for x in float16 above 11.09: exp(12) does not fit" in words
    assert "Naive softmax still works in bfloat16 (fails above 88.72)" in words
    # exp(10), exp(11) fit float16 (max 65504), exp(12) = 162755 does not: 0, 0 and inf / inf
    assert re.search(r"float16\s+6\.55e\+04.*2\.203e\+04\s+5\.987e\+04\s+inf\s*\n", out)
    assert re.search(r"float16\s+naive\s+0\s+0\s+nan", out)
    assert re.search(r"float32\s+naive\s+0\.0900306\s+0\.244728\s+0\.665241", out)


@pytest.mark.parametrize("bad", ["nan", "inf", "+inf"])
def test_overflow_demo_nan_and_inf_refused(bad):
    assert error("overflow-demo", "1", bad) == (
        "Error: values must be numbers or -inf (a masked score): softmax is undefined for NaN "
        "and for +inf (inf / inf)")


def test_overflow_demo_takes_negative_values():
    """-inf and negative numbers are values, not options (`--` works too)."""
    for args in (["-inf", "-1", "2", "--dtype", "fp16"],
                 ["--dtype", "fp16", "--", "-inf", "-1", "2"]):
        result = osm("overflow-demo", *args)
        assert result.exit_code == 0, result.stderr
        assert "exp(x) in each dtype (x = -inf, -1, 2)" in result.stdout
    result = osm("overflow-demo", "-inf", "-inf")
    assert result.exit_code == 0
    assert "Every value is masked (-inf)" in " ".join(result.stdout.split())


def test_overflow_demo_not_a_number():
    result = osm("overflow-demo", "1", "abc")
    assert result.exit_code == 2
    assert "Invalid value for 'values'" in result.stderr


def test_overflow_demo_value_beyond_float16():
    out = ok("overflow-demo", "70000", "1").stdout
    assert not re.search(r"online\s+nan", out)


# ---------------------------------------------------------------------------------------------
# help and entry points


COMMANDS = sorted(typer.main.get_command(app).commands)


def test_commands_registered():
    assert {"trace", "overflow-demo"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_example(name):
    for flag in ("--help", "-h"):
        out = ok(name, flag).stdout
        assert out.startswith(f"Usage: osm {name} ")
        assert "Example" in out
        examples = out[out.index("Example"):]
        assert f"osm {name}" in examples  # the example is a real command line
        assert len(out.splitlines()) > 5


def test_top_level_help_lists_commands():
    out = ok("--help").stdout
    for name in COMMANDS:
        assert name in out


def test_python_dash_m():
    result = subprocess.run(
        [sys.executable, "-m", "osm_cli", "--help"], capture_output=True, text=True, cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "trace" in result.stdout and "overflow-demo" in result.stdout
    assert "Usage: osm " in result.stdout


def test_sweep_random_is_the_sweep_of_those_tensors(tmp_path):
    """--random B,H,N,d (and --seed) on sweep: the seeded Q, K, V attention --random uses,
    swept as if saved to a .npz (the same table but for the source's name)."""
    from osm_cli.studies.inputs import random_qkv

    q, k, v = random_qkv((1, 2, 64, 8), 3)
    np.savez(tmp_path / "r.npz", q=q, k=k, v=v)
    args = ["--blocks", "8,32", "--causal", "--json"]
    got = json.loads(ok("sweep", "--random", "1,2,64,8", "--seed", "3", *args).stdout)
    saved = json.loads(ok("sweep", str(tmp_path / "r.npz"), *args).stdout)
    assert got["source"] == "--random 1,2,64,8 --seed 3"
    assert {**got, "source": None} == {**saved, "source": None}
    r = osm("sweep", "samples/scores.txt", "--random", "1,1,4,4")
    assert r.exit_code == 1
    assert r.stderr == "Error: give scores, Q K V files or --random B,H,N,d, one of them\n"
