"""Where the output goes (present/console.py, issue 13 item 5): piped output carries no trailing
whitespace, and its width comes from COLUMNS when that is set (100 columns otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

from conftest import osm
from osm_cli.present import console as consoles

ROOT = Path(__file__).resolve().parents[2]

# One run of each command that prints tables (stdout is not a terminal under the runner).
COMMANDS = [
    ["trace", "samples/scores.txt", "-b", "2"],
    ["trace", "samples/matrix.txt", "--form", "both"],
    ["trace", "samples/scores.txt", "--dtype", "bf16"],
    ["attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
     "--block-q", "4", "--block-k", "2", "--splits", "2"],
    ["attention", "samples/causal.npz", "--dtype", "bf16"],
    ["backward", "samples/q.npy", "samples/k.npy", "samples/v.npy", "samples/do.npy",
     "--causal", "--block-q", "4", "--block-k", "4"],
    ["overflow-demo"],
    ["merge", "samples/partials/o0.npy", "samples/partials/lse0.npy",
     "samples/partials/o1.npy", "samples/partials/lse1.npy"],
    ["sweep", "samples/long.npz", "--blocks", "64,128", "--causal"],
    ["sweep", "samples/matrix.txt", "--blocks", "1,2"],
    ["cost", "-n", "1024", "-d", "64"],
    ["check", "samples/kernel_fp16.npz", "--causal"],
]


def _ids(cmd):
    return " ".join(cmd[:2])


@pytest.mark.parametrize("cmd", COMMANDS, ids=_ids)
def test_piped_output_has_no_trailing_whitespace(cmd):
    result = osm(*cmd)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) > 3
    assert [line for line in lines if line != line.rstrip()] == []


@pytest.mark.parametrize("columns", [60, 80, 100, 132])
def test_piped_width_comes_from_columns(columns):
    """The overflow demo's last table stretches its 'why' column to the width it is given (its
    last few columns are the padding that is trimmed)."""
    result = osm("overflow-demo", width=columns)
    assert result.exit_code == 0
    assert columns - 3 <= max(cell_len(line) for line in result.stdout.splitlines()) <= columns


def test_piped_width_without_columns_is_100():
    result = osm("overflow-demo")
    widest = max(cell_len(line) for line in result.stdout.splitlines())
    assert consoles.PIPED_WIDTH - 3 <= widest <= consoles.PIPED_WIDTH


@pytest.mark.parametrize("value", ["", "abc", "0", "-5"])
def test_columns_that_is_not_a_width_is_ignored(monkeypatch, value):
    monkeypatch.setenv("COLUMNS", value)
    assert consoles.width_from_env(is_terminal=False) == consoles.PIPED_WIDTH
    assert consoles.width_from_env(is_terminal=True) is None  # rich asks the terminal


def test_trimmed_stdout_holds_spaces_until_the_line_ends(monkeypatch, capsys):
    """Spaces at the end of one write are kept if the line goes on, dropped if it ends."""
    t = consoles.TrimmedStdout()
    for piece in ["a  ", "b   ", "\nc \t\n", "  ", "\n", "d"]:
        t.write(piece)
    t.flush()
    assert capsys.readouterr().out == "a  b\nc\n\nd"


def test_a_real_pipe_gets_no_trailing_whitespace():
    """Through a real pipe, as `osm … | less` or `> file` sees it."""
    proc = subprocess.run(
        [sys.executable, "-m", "osm_cli", "attention", "samples/causal.npz", "--causal"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line == line.rstrip() for line in lines)
    assert max(cell_len(line) for line in lines) <= 80
