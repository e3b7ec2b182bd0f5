"""Every example of every command's --help runs as written from the repository root: exit 0
(or 1 for `osm check` judging a failing kernel, which is its verdict), no traceback.

They run in a scratch folder that sees samples/ (so `--out o.npy` writes there), through
typer's runner."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import typer

from conftest import osm
from osm_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = sorted(typer.main.get_command(app).commands)


def _examples():
    for name in COMMANDS:
        text = osm(name, "--help", width=200).stdout
        lines = text[text.index("Example"):].splitlines()[1:]
        for line in lines:
            line = line.strip()
            if not line.startswith("osm "):
                if line and not line.startswith(("#", "…")):
                    break
                continue
            yield name, line


# battery's examples name the user's own kernel module and exit with its verdict (1 on a
# finding): its own tests run them
EXAMPLES = [(n, line) for n, line in _examples() if n != "battery"]


def test_every_command_has_examples():
    assert {name for name, _ in EXAMPLES} >= set(COMMANDS) - {"battery"}


@pytest.mark.parametrize("name, line", EXAMPLES, ids=[line for _, line in EXAMPLES])
def test_help_example_runs(tmp_path, monkeypatch, name, line):
    (tmp_path / "samples").symlink_to(ROOT / "samples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    result = osm(*shlex.split(line)[1:])
    both = result.stdout + result.stderr
    assert "Traceback" not in both
    assert result.exit_code == 0, f"$ {line}\n{both}"
