"""Every console example of the README and of every docs/**/*.md page is real output: each
```console block's `$ osm …` lines are run and what they print is compared line by line.

A block may hold several commands, each followed by its output. A command is run in a scratch
folder that sees the repository's samples/, docs/ and benchmarks/ (so an example that writes a
file writes it there, not into the checkout). `osm …` runs in-process through typer's runner;
a command with a pipe (`osm … | sed -n 7,12p`) runs in a shell, with `osm` as this Python's
`-m osm_cli`. Lines that do not start with `$ osm` (`$ cd …`, `$ pip …`) are not run, and nor is
what follows them up to the next command."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import osm

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
SHARED = ("samples", "docs", "benchmarks")


def _examples(path: Path):
    text = path.read_text(encoding="utf-8")
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        command, output = None, []
        for line in [*block.splitlines(), "$ "]:
            if line.startswith("$ "):
                if command is not None:
                    yield command, "\n".join(output)
                command = line[2:] if line.startswith("$ osm ") else None
                output = []
            else:
                output.append(line)


EXAMPLES = [(str(p.relative_to(ROOT)), c, o) for p in PAGES for c, o in _examples(p)]


def _norm(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines() if line.strip()]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    for name in SHARED:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page, command, expected", EXAMPLES,
                         ids=[f"{p}: {c}" for p, c, _ in EXAMPLES])
def test_console_example(scratch, page, command, expected):
    if "|" in command:
        exe = f"{shlex.quote(sys.executable)} -m osm_cli"
        shell = re.sub(r"(^|\|\s*)osm ", lambda m: f"{m.group(1)}{exe} ", command)
        # the code under test, as this process imports it (a worktree's PYTHONPATH too)
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "COLUMNS": "100",
               "PYTHONPATH": str(ROOT)}
        done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True,
                              text=True, timeout=120, cwd=scratch, env=env)
        got = done.stdout + done.stderr
    else:
        result = osm(*shlex.split(command)[1:])
        got = result.stdout + result.stderr
    assert _norm(got) == _norm(expected), f"{page}: $ {command}"


def test_every_page_is_collected():
    """The README and the docs hold examples, and each page is looked at."""
    pages = {p for p, _, _ in EXAMPLES}
    assert "README.md" in pages
    assert len(EXAMPLES) >= 15
