"""`osm trace` options of issue 5: --order/--seed, --rescale-threshold, --csv, --plot, --step.

Numbers are checked against the seed examples by hand; order independence with hypothesis; the
plot as a real PNG of the promised size; step mode in a real terminal under tmux.
"""

from __future__ import annotations

import csv
import io
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import osm, strict_json
from osm_cli.core.fold import online_softmax
from osm_cli.core.reference import stable_softmax
from osm_cli.present.plot import INSTALL
from osm_cli.present.stepmode import buffered, step_through
from osm_cli.studies.lazy import lazy_report

ROOT = Path(__file__).resolve().parents[2]
E = math.exp


def trace_json(*args):
    return strict_json(osm("trace", *args, "--json", code=0).stdout)


# ---------------------------------------------------------------------------------------------
# --order


def test_reverse_order_by_hand():
    """[2, 4 | 1, 3] folded in reverse: block 1 first gives m = 3, l = e^-2 + 1 = 1.1353353;
    block 0 then moves m to 4: α = e^-1, l = 1.1353353·e^-1 + e^-2 + 1 = 1.5530018, the same
    final (m, l) as the forward fold."""
    doc = trace_json("samples/scores.txt", "-b", "2", "--order", "reverse")
    first, second = doc["steps"]
    assert (first["block"], first["start"], first["stop"]) == (1, 2, 4)
    assert first["m"] == 3 and first["l"] == pytest.approx(E(-2) + 1, rel=1e-15)
    assert second["block"] == 0 and second["m"] == 4
    assert second["scale"] == pytest.approx(E(-1), rel=1e-15)
    assert doc["l"] == pytest.approx(E(-2) + 1 + E(-3) + E(-1), rel=1e-15)
    assert doc["block_order"] == [1, 0] and doc["order"] == "reverse"
    check = doc["order_check"]
    assert check["forward_vs_order"] <= 2.3e-16 and check["forward_vs_tree"] <= 2.3e-16


def test_shuffle_seed_is_reproducible():
    args = ("--values", ",".join(str(x) for x in range(20)), "-b", "2", "--order", "shuffle")
    a = trace_json(*args, "--seed", "7")
    b = trace_json(*args, "--seed", "7")
    c = trace_json(*args, "--seed", "8")
    assert a["block_order"] == b["block_order"] == [s["block"] for s in a["steps"]]
    assert sorted(a["block_order"]) == list(range(10))
    assert a["block_order"] != c["block_order"]
    assert a["seed"] == 7


def test_order_report_in_table():
    r = osm("trace", "samples/scores.txt", "-b", "1", "--order", "shuffle", "--seed", "3")
    assert r.exit_code == 0
    assert "block order shuffle (seed 3):" in r.stdout
    assert "forward vs tree merge" in r.stdout and "shuffle vs tree merge" in r.stdout


def test_no_order_no_report():
    r = osm("trace", "samples/scores.txt")
    assert "block order" not in r.stdout and "tree merge" not in r.stdout


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 30), block=st.integers(1, 8), seed=st.integers(0, 10**6),
       form=st.sampled_from(["rescale", "merge"]))
def test_any_block_order_same_result(n, block, seed, form):
    """Any permutation of the blocks gives the one-shot probabilities to rounding (float64)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(2, n)) * 8
    s[rng.random(s.shape) < 0.2] = -np.inf
    order = rng.permutation(-(-n // block))
    t = online_softmax(s, block, form, order=order)
    assert [x.block for x in t.steps] == order.tolist()
    np.testing.assert_allclose(t.probabilities, stable_softmax(s), rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# --rescale-threshold


def test_lazy_counts_by_hand():
    """Scores 0, 1, 2, 3 in blocks of 1, τ = 2.5.

    Eager: m goes 0 → 1 → 2 → 3, three rescales. Lazy: 1 and 2 are within 0 + 2.5, so m stays 0
    (two skipped rescales, exp(s − m) up to e^2); 3 > 2.5 moves m to 3: one rescale, two saved.
    """
    s = np.array([0.0, 1.0, 2.0, 3.0])
    rep, eager = lazy_report(s, 1, 2.5)
    assert (rep.rescales, rep.rescales_eager, rep.rescales_saved, rep.skipped) == (1, 3, 2, 2)
    assert rep.max_excess == 2.0
    assert rep.max_abs_diff <= 1e-16
    lazy = online_softmax(s, 1, threshold=2.5)
    assert [x.m for x in lazy.steps] == [0, 0, 0, 3]
    assert [x.lazy_skipped for x in lazy.steps] == [False, True, True, False]
    assert [x.rescaled for x in lazy.steps] == [False, False, False, True]
    assert [x.m for x in eager.steps] == [0, 1, 2, 3]
    # l before the last step: e^0 + e^1 + e^2 against the stale m = 0
    assert lazy.steps[2].l == pytest.approx(1 + E(1) + E(2), rel=1e-15)
    assert lazy.steps[3].alpha == pytest.approx(E(-3), rel=1e-15)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 6), tau=st.floats(0.1, 20),
       seed=st.integers(0, 10**6))
def test_lazy_equals_eager(n, block, tau, seed):
    """Lazy and eager give the same probabilities to rounding, and never more rescales."""
    rng = np.random.default_rng(seed)
    s = np.sort(rng.normal(size=n) * 6)  # rising scores: the running max moves often
    rep, eager = lazy_report(s, block, tau)
    assert rep.max_abs_diff <= 1e-14
    assert rep.rescales <= rep.rescales_eager
    assert rep.max_excess <= tau


def test_lazy_cli():
    doc = trace_json("--values", "0,1,2,3", "-b", "1",
                     "--rescale-threshold", "2.5")
    assert doc["rescales"] == 1 and doc["rescales_eager"] == 3 and doc["rescales_saved"] == 2
    assert [s["skipped"] for s in doc["steps"]] == [False, True, True, False]
    assert doc["threshold_units"] == "natural log"
    r = osm("trace", "--values", "0,1,2,3", "-b", "1", "--rescale-threshold", "2.5")
    assert "1 skip" in r.stdout  # α = 1 marked in the table
    assert "rescales: 1 lazy (τ = 2.5) vs 3 eager: 2 saved, 2 skipped" in r.stdout
    assert "natural log" in r.stdout


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--form", "merge", "--rescale-threshold", "1"], 1, "--form rescale only"),
        (["--rescale-threshold", "inf"], 1, "finite"),
        (["--rescale-threshold", "-1"], 2, "--rescale-threshold"),
        (["--order", "sideways"], 2, "--order"),
    ],
)
def test_bad_options(args, code, message):
    r = osm("trace", "--values", "1,2,3", *args)
    assert r.exit_code == code
    assert message in r.stderr
    if code == 1:
        assert r.stderr.startswith("Error: ")


# ---------------------------------------------------------------------------------------------
# --csv


def test_csv_export(tmp_path):
    path = tmp_path / "steps.csv"
    r = osm("trace", "samples/scores.txt", "-b", "2", "--form", "both", "--csv", path)
    assert r.exit_code == 0
    assert f"wrote {path}" in r.stderr
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [(x["form"], x["block"]) for x in rows] == [
        ("rescale", "0"), ("rescale", "1"), ("merge", "0"), ("merge", "1")]
    first, second = rows[0], rows[1]
    assert first["m_prev"] == "-inf" and float(first["m"]) == 4.0
    assert math.isclose(float(second["l"]), E(-2) + 1 + E(-3) + E(-1), rel_tol=1e-15)
    assert second["l"] == "1.5530017927759192"  # repr: every digit of the float64
    assert rows[3]["block_weight"] != "" and rows[1]["block_weight"] == ""
    assert second["rescaled"] == "false" and second["skipped"] == "false"


def test_csv_bad_folder(tmp_path):
    r = osm("trace", "samples/scores.txt", "--csv", tmp_path / "no" / "x.csv")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "does not exist" in r.stderr


# ---------------------------------------------------------------------------------------------
# --plot


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra osm-cli[plot]")
    path = tmp_path / "trace.png"
    r = osm("trace", "samples/scores.txt", "-b", "1", "--rescale-threshold", "1.5", "--plot", path)
    assert r.exit_code == 0, r.stderr
    data = path.read_bytes()
    assert _png_size(data) == (900, 750)
    assert data.endswith(b"IEND\xaeB`\x82")
    assert len(data) > 20_000  # three panels of lines, not an empty canvas


def test_sweep_plot_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra osm-cli[plot]")
    path = tmp_path / "sweep.png"
    args = ["sweep", "samples/matrix.txt", "--blocks", "1,2,4", "--plot", str(path)]
    r = osm(*args)
    assert r.exit_code == 0, r.stderr
    assert _png_size(path.read_bytes()) == (900, 750)


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = tmp_path / "t.png"
    r = osm("trace", "samples/scores.txt", "--plot", path)
    assert r.exit_code == 1
    assert r.stderr == f"Error: {INSTALL}\n"
    # right for an installed osm (matplotlib is all the extra adds) and for a clone (its extra)
    assert INSTALL == ("--plot needs matplotlib: pip install matplotlib (in a clone of osm: "
                       "pip install '.[plot]')")
    assert not path.exists() and r.stdout == ""


# ---------------------------------------------------------------------------------------------
# --step


def test_step_not_a_terminal():
    r = osm("trace", "samples/scores.txt", "-b", "1", "--step")
    assert r.exit_code == 0
    assert r.stderr.count("not a terminal") == 1
    assert "showing the whole table" in r.stderr
    assert "online vs one-shot stabilized" in r.stdout
    assert "Enter" not in r.stdout  # no key hints in piped output
    assert r.stdout == osm("trace", "samples/scores.txt", "-b", "1").stdout


class _Console:
    def __init__(self):
        self.frames, self.clears = [], 0

    def clear(self):
        self.clears += 1

    def print(self, x):
        self.frames.append(x)


@pytest.mark.parametrize(
    "keys, shown",
    [("\r \n", 4), ("x\rq", 2), ("q", 1), ("\x1b", 1), ("  ", 3)],
)
def test_step_through_keys(keys, shown):
    """Enter, space, n advance; q or Esc stop (on the last frame: finish); other keys are
    ignored."""
    console, pending = _Console(), list(keys)

    def getkey():
        return pending.pop(0) if pending else "q"

    assert step_through(console, lambda k: k, 4, getkey) == shown
    assert console.frames == list(range(shown)) and console.clears == shown


@pytest.mark.parametrize(
    "keys, frames, shown",
    [("  b", [0, 1, 2, 1], 2), ("G\r", [0, 3], 4), ("Gg q", [0, 3, 0, 1], 2),
     (["right", "left", "end", "home"], [0, 1, 0, 3, 0], 1), ("bbg", [0], 1)],
)
def test_step_through_back_and_forth(keys, frames, shown):
    """b/← back, g/Home first, G/End last (each at the edge ignored); Enter on the last
    frame finishes (count returned), q elsewhere stops there."""
    console, pending = _Console(), list(keys)

    def getkey():
        return pending.pop(0) if pending else "q"

    assert step_through(console, lambda k: k, 4, getkey) == shown
    assert console.frames == frames


def test_buffered_keys():
    """Typed-ahead keys arrive in one read and are taken one at a time; an arrow key's escape
    sequence is its name (→ right, ← left, Home, End), one osm has no use for (↑) is ignored
    (it is not Esc); end of input quits."""
    reads = ["x ", "\x1b[A", "\x1b[C", "\x1b[D", "\x1b[H", "\x1b[F", "\r", ""]
    get = buffered(lambda: reads.pop(0))
    assert [get() for _ in range(9)] == ["x", " ", "", "right", "left", "home", "end", "\r",
                                         "q"]


def test_step_mode_in_tmux(tmux):
    """One block per key, each explained: row k highlighted, its arithmetic under the table;
    Enter and space advance, b and ← go back, g and G jump to the first and last; Enter on
    the last block ends step mode with the full report."""
    tmux.start("trace", "samples/scores.txt", "-b", "1", "--step")
    screen = tmux.wait_for("block 1 of 4")
    assert "-inf → 2" in screen and "2 → 4" not in screen
    assert "m = max(-inf, 2) = 2" in screen and "α = exp(-inf − 2) = 0" in screen
    tmux("send-keys", "-t", "osm", "Enter")
    screen = tmux.wait_for("block 2 of 4")
    assert "2 → 4" in screen and "0.13533528" in screen  # α = e^(2 − 4)
    assert "α = exp(2 − 4) = 0.13533528" in screen
    assert "l = 1·0.13533528 + exp(4−4) = 1.1353353" in screen
    tmux("send-keys", "-t", "osm", "x", "Space")  # typed ahead together: x ignored, space next
    screen = tmux.wait_for("block 3 of 4")
    assert "l = 1.1353353·1 + exp(1−4) = 1.1851224" in screen
    tmux("send-keys", "-t", "osm", "b")  # back one
    screen = tmux.wait_for("block 2 of 4")
    assert "1.1353353 → 1.1851224" not in screen and "α = exp(2 − 4)" in screen
    tmux("send-keys", "-t", "osm", "Right")  # → is forward
    tmux.wait_for("block 3 of 4")
    tmux("send-keys", "-t", "osm", "Left")  # ← is back
    tmux.wait_for("block 2 of 4")
    tmux("send-keys", "-t", "osm", "G")  # the last
    screen = tmux.wait_for("block 4 of 4, the last")
    assert "l = 1.1851224·1 + exp(3−4) = 1.5530018" in screen
    assert "final:" not in screen  # the summary comes after the last step, not with it
    tmux("send-keys", "-t", "osm", "g")  # the first
    tmux.wait_for("block 1 of 4")
    tmux("send-keys", "-t", "osm", "End")
    tmux.wait_for("block 4 of 4, the last")
    tmux("send-keys", "-t", "osm", "Enter")
    screen = tmux.wait_for("EXIT=0")
    assert "final: m = 4, l = 1.553001793" in screen
    assert "online vs one-shot stabilized" in screen
    # the current row is drawn in reverse video
    styled = tmux("capture-pane", "-p", "-e", "-t", "osm").stdout
    row = next(line for line in styled.splitlines() if "1.1851224" in line and "1.5530018" in line)
    assert "\x1b[7m" in row


def test_step_mode_quit_in_tmux(tmux):
    tmux.start("trace", "samples/scores.txt", "-b", "1", "--step")
    tmux.wait_for("block 1 of 4")
    tmux("send-keys", "-t", "osm", "Enter")
    tmux.wait_for("block 2 of 4")
    tmux("send-keys", "-t", "osm", "q")
    screen = tmux.wait_for("EXIT=0")
    assert "stopped at block 2 of 4" in screen
    assert "final:" not in screen


def test_order_on_a_matrix_with_a_fully_masked_row_is_quiet():
    """samples/matrix.txt's row 2 is all -inf: its LSE is -inf in every order, which is no
    difference (and no 'invalid value' warning from -inf - -inf)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "osm_cli", "trace", "samples/matrix.txt",
                        "--order", "reverse"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == ""
    rows = [line.split() for line in r.stdout.splitlines()]
    assert ["2", "-inf", "0", "-inf", "0"] in rows  # row 2: m, l, LSE, its |Δ| from the reference
    assert ["forward", "vs", "reverse", "0", "0"] in rows  # max |Δp|, max |ΔLSE|: no difference
    assert ["forward", "vs", "tree", "merge", "0", "0"] in rows
