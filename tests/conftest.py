"""Shared fixtures: the one Q/K/V generator (`qkv`, `rand`), the one CLI runner (`osm`), a
CliRunner, a fixed-width colourless renderer, strict JSON parsing, and a private tmux server
for the step-mode tests (a real terminal). `from conftest import qkv, osm` where a hypothesis
test cannot take a fixture."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from osm_cli.cli import app

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def render_text(renderable, width: int = 100) -> str:
    """The text a renderable prints in a 100-column console without colour."""
    console = Console(
        file=io.StringIO(), width=width, color_system=None, force_terminal=False,
        legacy_windows=False,
    )
    console.print(renderable)
    return console.file.getvalue()


def rand(*shape, seed=0, dtype=np.float64) -> np.ndarray:
    """Standard normal values of `shape`, seeded (or drawn next from a numpy Generator), in
    `dtype`."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def qkv(t, s, d, dv=None, heads=(1, 1), b=None, seed=0, dtype=np.float64, layout="bhnd",
        do=False, spread=1.0, stream=False):
    """Random Q (…, t, d), K (…, s, d), V (…, s, dv), and dO (…, t, dv) when do, as
    flash-attention's tests' generate_qkv makes them: seeded (Q from `seed`, K from seed + 1, V
    from seed + 2, dO from seed + 3, so a tensor stays the same when another changes shape; or,
    with stream or when `seed` is a numpy Generator, one after the other from one generator),
    standard normal values rounded to `dtype`. heads = (Hq, Hkv), GQA/MQA when they differ;
    b None: no batch axis (and no head axis for one head each). layout "bhnd": (B, H, N, d);
    "bnhd": FlashAttention's (B, N, H, d). spread: Q and K (in dtype) times it, so the scores
    spread spread² times as wide.

    Example: q, k, v = qkv(5, 7, 4, heads=(4, 2), b=2, layout="bnhd") -> q (2, 5, 4, 4)"""
    hq, hk = heads
    lead_q = () if b is None and hq == 1 and hk == 1 else ((hq,) if b is None else (b, hq))
    lead_k = () if not lead_q else ((hk,) if b is None else (b, hk))

    def shape(lead, n, width):
        if layout == "bnhd" and lead:
            return (*lead[:-1], n, lead[-1], width)
        if layout not in ("bhnd", "bnhd"):
            raise ValueError(f"layout {layout!r}: bhnd or bnhd")
        return (*lead, n, width)

    dv = d if dv is None else dv
    if stream:
        seed = np.random.default_rng(seed)
    one = isinstance(seed, np.random.Generator)
    q, k, v = (rand(*shape(lead, n, width), seed=seed if one else seed + i, dtype=dtype)
               for i, (lead, n, width) in enumerate(
                   [(lead_q, t, d), (lead_k, s, d), (lead_k, s, dv)]))
    if spread != 1:
        q, k = spread * q, spread * k
    if not do:
        return q, k, v
    return q, k, v, rand(*shape(lead_q, t, dv), seed=seed if one else seed + 3, dtype=dtype)


def captured_cases() -> list:
    """samples/kernels' captured kernel runs, by benchmarks/captures.py (their one loader)."""
    import importlib.util

    name = "osm_benchmarks_captures"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks/captures.py")
    mod = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod.load_cases(SAMPLES / "kernels")


def osm(*args, width: int | None = None, input=None, env: dict | None = None,
        code: int | None = None, runner: CliRunner | None = None):
    """`osm *args` through typer's CliRunner: the click Result, whose exit_code, stdout and
    stderr (kept apart) the test asserts. width: COLUMNS for the run (the tables at 72, 80 or
    100 columns; none: piped, 100); input: stdin's text; env: more variables; code: the exit
    code asserted (with stderr in the failure). Never a traceback, never an internal error.

    Example: osm("trace", "--values", "1,2,5,3", "-b", "2", width=80, code=0).stdout"""
    env = {**(env or {}), **({} if width is None else {"COLUMNS": str(width)})} or None
    result = (runner or CliRunner()).invoke(app, [str(a) for a in args], input=input, env=env)
    both = result.stdout + result.stderr
    assert "Traceback" not in both, both
    assert "internal error" not in both, both
    if code is not None:
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result


@pytest.fixture(name="osm")
def _osm_fixture():
    return osm


@pytest.fixture(name="qkv")
def _qkv_fixture():
    return qkv


def _no_constants(name):
    raise ValueError(f"non-standard JSON constant {name}")


def strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity (RFC 8259)."""
    return json.loads(text, parse_constant=_no_constants)


@pytest.fixture(name="strict_json")
def _strict_json_fixture():
    return strict_json


@pytest.fixture(name="render_text")
def _render_text_fixture():
    return render_text


@pytest.fixture
def runner() -> CliRunner:
    # click 8.2+ keeps stdout and stderr apart: result.stdout, result.stderr.
    return CliRunner()


@pytest.fixture
def samples() -> Path:
    return SAMPLES


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    """Run from the repository root so samples/... paths resolve as in the README, with no
    COLUMNS from the shell that started pytest: piped output is then 100 columns wide, the
    width the golden text is written at (a test sets COLUMNS itself to ask for another)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def tmux():
    """tmux(*args) on a private server, killed afterwards; skips when tmux is not installed."""
    exe = shutil.which("tmux")
    if exe is None:
        pytest.skip("tmux is not installed; step mode needs a real terminal to test")
    sock = f"osm-test-{uuid.uuid4().hex[:8]}"

    def cmd(*args, check=True):
        return subprocess.run([exe, "-L", sock, *args], capture_output=True, text=True,
                              check=check, timeout=60)

    def start(*osm_args, height=40):
        """Run `osm *osm_args` in a 110-column session "osm"; the pane stays after it exits."""
        # The tables pick their digits for the width they are printed at: the terminal's,
        # unless COLUMNS (which the tmux server may inherit from the test process) says otherwise.
        shell = " ".join(["env -u COLUMNS -u LINES", sys.executable, "-m", "osm_cli", *osm_args])
        cmd("new-session", "-d", "-s", "osm", "-x", "110", "-y", str(height), "-c", str(ROOT),
            f"{shell}; echo EXIT=$?; sleep 600")  # the pane outlives a slow test; killed after

    def wait_for(text, timeout=90.0) -> str:
        """The screen once `text` is on it (a frame's hint line, printed last, so the whole
        frame is drawn by then); fails with the screen after `timeout` seconds. The wait is
        for the condition, polled: on a loaded machine osm's start alone can take many
        seconds, so the limit is generous and costs nothing when the text comes at once."""
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = cmd("capture-pane", "-p", "-t", "osm").stdout
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared; the screen was:\n{screen}")

    cmd.start, cmd.wait_for = start, wait_for
    yield cmd
    cmd("kill-server", check=False)


# ---------------------------------------------------------------------------------------------
# hostile input (tests/hardening/test_devices_and_extremes.py, tests/hardening/test_fuzz_inputs.py)


def osm_process(*args, env: dict | None = None, timeout: float = 120, **kw):
    """`osm *args` in a fresh Python process, from the repository root: real file descriptors,
    real encodings, real signals, which CliRunner stands in for. env adds to (None: removes) the
    environment's variables; COLUMNS is unset unless env gives it. Output is captured as bytes
    unless kw says where stdout and stderr go."""
    full = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    return subprocess.run([sys.executable, "-m", "osm_cli", *map(str, args)], cwd=ROOT,
                          env=full, timeout=timeout, **kw)


def one_error(stderr: str | bytes) -> str:
    """The one "Error: …" line on stderr (asserted: no other line but osm's own "note: …"
    lines, no traceback, no Python warning); the line without "Error: "."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("note: ")]
    assert "Traceback" not in text and "Warning" not in text and "internal error" not in text, (
        text)
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and len(lines) == 1, text
    return errors[0][len("Error: "):]


def no_leftovers(folder: Path) -> list[str]:
    """The names in folder that are osm's temporaries (io/save.py's TEMP_TAG)."""
    return sorted(p.name for p in Path(folder).iterdir() if ".osm-tmp-" in p.name)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder and its bytes, to compare before and after a refused command."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(Path(folder).rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(name="osm_process")
def _osm_process_fixture():
    return osm_process


@pytest.fixture(name="one_error")
def _one_error_fixture():
    return one_error
