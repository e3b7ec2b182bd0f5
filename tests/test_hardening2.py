"""Hostile but fair input, round 2 (issue 19), through the command line: each class of the
issue ends in its documented exit code and one "Error: …" line (or silence, for a broken
pipe), never a traceback, a RuntimeWarning, a clobbered file or device, a NaN written
silently, or a PASS for garbage. docs/inputs.md holds the decisions these tests check."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, no_leftovers, one_error, osm_process, snapshot

from osm_cli.cli import app

HUGE = "1000000000000000000000000000000"  # 1e30: no C long holds it
QKV = ("samples/q.npy", "samples/k.npy", "samples/v.npy")
DEVICES = [p for p in ("/dev/null", "/dev/full") if Path(p).exists()]


def is_device(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


def stdout_link_intact() -> None:
    """/dev/stdout is still what the system made it: a link (to /proc/self/fd/1) or a device."""
    mode = os.lstat("/dev/stdout").st_mode
    assert stat.S_ISLNK(mode) or stat.S_ISCHR(mode), oct(mode)


# ---------------------------------------------------------------------------------------------
# 1. special files are written in place, never replaced


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flag", ["--out", "--lse"])
def test_attention_output_to_a_device_stays_a_device(runner, device, flag):
    r = runner.invoke(app, ["attention", *QKV, flag, device, "--no-reference"])
    assert is_device(device)
    if device == "/dev/full":
        assert r.exit_code == 1
        assert one_error(r.stderr) == "/dev/full: cannot write (No space left on device)"
    else:
        assert r.exit_code == 0, r.stderr


def test_a_plot_and_a_screen_export_to_dev_null(runner):
    r = runner.invoke(app, ["trace", "samples/scores.txt", "--svg", "/dev/null"])
    assert r.exit_code == 0, r.stderr
    assert is_device("/dev/null")


def test_csv_to_dev_stdout_goes_to_stdout_and_leaves_the_link(tmp_path):
    before = snapshot(tmp_path)
    r = osm_process("trace", "samples/scores.txt", "--csv", "/dev/stdout")
    assert r.returncode == 0, r.stderr
    stdout_link_intact()
    text = r.stdout.decode()
    assert text.startswith("form,step,block,start,stop") or "form,step,block" in text
    assert "\nrescale,0,0,0,2," in text
    assert b"wrote /dev/stdout (step table, CSV)" in r.stderr
    assert snapshot(tmp_path) == before


def test_csv_to_dev_stdout_redirected_to_a_file_appends_to_that_file(tmp_path):
    """A shell's `> file`: osm's table and the CSV both reach the file, nothing is truncated."""
    target = tmp_path / "all.txt"
    with open(target, "wb") as fh:
        r = osm_process("trace", "samples/scores.txt", "--csv", "/dev/stdout", stdout=fh,
                        stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    stdout_link_intact()
    text = target.read_text()
    assert "form,step,block" in text and "final: m = " in text


def test_dev_full_on_a_plot_output(runner):
    r = runner.invoke(app, ["trace", "samples/scores.txt", "--csv", "/dev/full"])
    assert r.exit_code == 1
    assert one_error(r.stderr) == "/dev/full: cannot write (No space left on device)"
    assert is_device("/dev/full") and r.stdout == ""


def test_a_fifo_is_written_in_place(runner, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = runner.invoke(app, ["trace", "samples/scores.txt", "--csv", str(fifo)])
    reader.join(timeout=30)
    assert r.exit_code == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"form,step,block")
    assert no_leftovers(tmp_path) == []


def test_a_link_to_a_device_writes_the_device(runner, tmp_path):
    link = tmp_path / "sink.npy"
    link.symlink_to("/dev/null")
    r = runner.invoke(app, ["attention", *QKV, "--out", str(link), "--no-reference"])
    assert r.exit_code == 0, r.stderr
    assert os.readlink(link) == "/dev/null" and is_device("/dev/null")


def test_a_link_to_a_regular_file_is_replaced_and_its_target_kept(runner, tmp_path):
    """Today's behaviour for a link to a regular file: the link becomes the new file."""
    target = tmp_path / "target.npy"
    target.write_bytes(b"old")
    link = tmp_path / "o.npy"
    link.symlink_to(target)
    r = runner.invoke(app, ["attention", *QKV, "--out", str(link), "--no-reference"])
    assert r.exit_code == 0, r.stderr
    assert not link.is_symlink() and np.load(link).shape == (2, 8, 4)
    assert target.read_bytes() == b"old"


def test_a_failed_write_to_a_device_leaves_the_regular_files_untouched(runner, tmp_path):
    """--out to a file, --lse to /dev/full: the device fails first, the file is not written."""
    out = tmp_path / "o.npy"
    out.write_bytes(b"old")
    r = runner.invoke(app, ["attention", *QKV, "--out", str(out), "--lse", "/dev/full",
                            "--no-reference"])
    assert r.exit_code == 1
    one_error(r.stderr)
    assert out.read_bytes() == b"old" and no_leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 7. streams and encodings


def test_closed_stdout_is_one_error_line():
    r = osm_process("trace", "samples/scores.txt", preexec_fn=lambda: os.close(1),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 1
    assert one_error(r.stderr).startswith("standard output is closed")


def test_closed_stdin_is_one_error_line():
    r = osm_process("trace", "-", preexec_fn=lambda: os.close(0))
    assert r.returncode == 1
    assert one_error(r.stderr).startswith("standard input is closed")


def test_stdin_that_is_not_text():
    r = osm_process("trace", "-", input=b"\xff\xfe\x00 1 2")
    assert r.returncode == 1
    assert one_error(r.stderr) == "standard input is not UTF-8 text"


@pytest.mark.parametrize("extra", [["--json"], []])
def test_a_broken_pipe_ends_silently_with_141(extra, tmp_path):
    scores = tmp_path / "long.txt"
    np.savetxt(scores, np.linspace(-3, 3, 4000)[None])
    with subprocess.Popen([sys.executable, "-m", "osm_cli", "trace", str(scores), "--all",
                           *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=ROOT) as proc:
        proc.stdout.read(100)
        proc.stdout.close()
        stderr = proc.stderr.read()
        assert proc.wait(timeout=120) == 141
    assert stderr == b""


def test_stdout_on_a_full_disk():
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "wb") as full:
        r = osm_process("trace", "samples/scores.txt", stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 1
    assert one_error(r.stderr) == "cannot write to standard output (No space left on device)"
    assert is_device("/dev/full")


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
                                  "PYTHONIOENCODING": None}])
def test_an_ascii_terminal_gets_ascii_spellings(env):
    r = osm_process("trace", "samples/scores.txt", env=env)
    assert r.returncode == 0, r.stderr
    text = r.stdout.decode("ascii")  # every byte ASCII
    assert "alpha = exp(m_old - m), l = l*alpha + sum exp(s - m)" in text
    r = osm_process("trace", "samples/missing−file.txt", env=env)
    assert r.returncode == 1
    if "PYTHONUTF8" in env:  # the name's bytes, undecodable in C, come back as they were
        assert r.stderr == "Error: samples/missing−file.txt: no such file\n".encode()
    else:
        assert one_error(r.stderr) == "samples/missing-file.txt: no such file"


def test_ascii_spelling_of_the_kth_step():
    from osm_cli.cli.streams import ascii_spelled

    assert ascii_spelled("m⁽ᵏ⁾ = max(m⁽ᵏ⁻¹⁾, …), α ≤ 1", "ascii") == (
        "m(k) = max(m(k-^1), ...), alpha <= 1")
    assert ascii_spelled("α", "utf-8") == "α"


# ---------------------------------------------------------------------------------------------
# 8. COLUMNS that is no width


@pytest.mark.parametrize("columns", ["0", "1", "-3", "19", "1000001", HUGE])
def test_columns_that_is_no_width_is_unset(runner, columns, tmp_path):
    r = runner.invoke(app, ["trace", "samples/missing.txt"], env={"COLUMNS": columns})
    assert r.exit_code == 1
    assert one_error(r.stderr) == "samples/missing.txt: no such file"
    csv = tmp_path / "t.csv"
    r = runner.invoke(app, ["trace", "samples/scores.txt", "--csv", str(csv)],
                      env={"COLUMNS": columns})
    assert r.exit_code == 0
    assert f"wrote {csv} (step table, CSV)" in r.stderr
    r = runner.invoke(app, ["overflow-demo"], env={"COLUMNS": columns})
    assert r.stdout == runner.invoke(app, ["overflow-demo"]).stdout  # as piped: 100 columns


# ---------------------------------------------------------------------------------------------
# 10. the first round's inputs, again


def test_a_block_longer_than_any_input_is_one_block(runner):
    r = runner.invoke(app, ["trace", "--values", "1,2,3", "-b", HUGE])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("--values: 3 scores in 1 block of 3\n")


def test_sweep_of_a_block_longer_than_any_input(runner):
    r = runner.invoke(app, ["sweep", "--values", "1,2,3", "--blocks", f"2,{HUGE}", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [row["block"] for row in doc["blocks"]] == [2, 3]


@pytest.mark.parametrize("lse", [-np.inf, np.inf])
def test_merge_of_empty_partials_writes_no_nan(runner, tmp_path, lse, strict_json):
    files = []
    for n in range(2):
        np.save(tmp_path / f"o{n}.npy", np.ones((3, 4)))
        np.save(tmp_path / f"l{n}.npy", np.full(3, lse))
        files += [str(tmp_path / f"o{n}.npy"), str(tmp_path / f"l{n}.npy")]
    r = runner.invoke(app, ["merge", *files, "--json"])
    assert r.exit_code == 0, r.stderr
    assert "nan" not in r.stdout.lower()
    doc = strict_json(r.stdout)
    split = doc["splits"][0]
    assert split["empty_rows"] == 3 and split["lse_min"] is None
    assert split["weight_mean"] is None
