"""`osm attention` options of issue 5: --csv (the traced row's tile table), --plot (the traced
head's probability matrix with its tiles), --step (one K/V tile per key press, under tmux), and
the tile maps behind the picture (studies/tilemap.py), checked by hand and against attention itself.
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

from conftest import osm
from osm_cli.cli import PLOT_LIMIT
from osm_cli.flash.forward import attention
from osm_cli.present.csv import tiles_csv
from osm_cli.present.plot import INSTALL
from osm_cli.studies.tilemap import head_probabilities, skip_map

ROOT = Path(__file__).resolve().parents[2]
E = math.exp


@pytest.fixture
def ramp(tmp_path):
    """t = s = 4, d = 2, float64: q_i = [1, 0], k_j = [j, 0] (with --scale 1 the score of key j
    is j for every query), v_j = [j, 1]."""
    path = tmp_path / "ramp.npz"
    q = np.array([[1.0, 0.0]] * 4)
    k = np.array([[float(j), 0.0] for j in range(4)])
    v = np.array([[float(j), 1.0] for j in range(4)])
    np.savez(path, q=q, k=k, v=v)
    return path


RAMP = ["--causal", "--scale", "1", "--block-q", "2", "--block-k", "2"]


# ---------------------------------------------------------------------------------------------
# --csv


def test_csv_by_hand(tmp_path, ramp):
    """Query 3 sees keys 0 … 3 with scores 0 … 3. Tile 0 (keys 0:2): max 1, m -inf → 1,
    l = e^-1 + 1, O = [1, 1 + e^-1]. Tile 1 (keys 2:4): max 3, α = e^(1 − 3) = e^-2,
    l = e^-3 + e^-2 + e^-1 + 1, O = α·O + [2e^-1 + 3, e^-1 + 1]."""
    path = tmp_path / "tiles.csv"
    r = osm("attention", ramp, *RAMP, "--query", "3", "--csv", path)
    assert r.exit_code == 0, r.stderr
    assert f"wrote {path} (tile table of the traced row, CSV)" in r.stderr
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert list(rows[0]) == ["batch", "head", "query", "step", "tile", "start", "stop", "skipped",
                             "tile_max", "m_prev", "m", "alpha", "l_prev", "l", "rescaled",
                             "o_norm", "o_0", "o_1"]
    a, b = rows
    assert (a["batch"], a["head"], a["query"], a["tile"], a["start"], a["stop"]) == (
        "0", "0", "3", "0", "0", "2")
    assert a["m_prev"] == "-inf" and a["m"] == "1.0" and a["tile_max"] == "1.0"
    assert a["alpha"] == "0.0" and a["rescaled"] == "false" and a["skipped"] == "false"
    assert float(a["l"]) == pytest.approx(E(-1) + 1, rel=1e-15)
    assert float(a["o_0"]) == 1.0 and float(a["o_1"]) == pytest.approx(1 + E(-1), rel=1e-15)
    assert b["m_prev"] == "1.0" and b["m"] == "3.0" and b["rescaled"] == "true"
    assert float(b["alpha"]) == pytest.approx(E(-2), rel=1e-15)
    l = E(-3) + E(-2) + E(-1) + 1
    assert float(b["l_prev"]) == float(a["l"]) and float(b["l"]) == pytest.approx(l, rel=1e-15)
    o = [E(-2) + 2 * E(-1) + 3, l]
    assert [float(b["o_0"]), float(b["o_1"])] == pytest.approx(o, rel=1e-15)
    assert float(b["o_norm"]) == pytest.approx(math.hypot(*o), rel=1e-15)


def test_csv_skipped_tile(tmp_path, ramp):
    """Query 1 is in the Q tile of rows 0:2, for which keys 2:4 are all hidden: that tile is
    skipped, its line keeps the state (m = 1, l = e^-1 + 1) with tile_max -inf."""
    path = tmp_path / "tiles.csv"
    assert osm("attention", ramp, *RAMP, "--query", "1", "--csv", path).exit_code == 0
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert [(x["tile"], x["skipped"]) for x in rows] == [("0", "false"), ("1", "true")]
    assert rows[1]["tile_max"] == "-inf" and rows[1]["m"] == "1.0"
    assert rows[1]["l"] == rows[0]["l"] == rows[1]["l_prev"]
    assert float(rows[1]["l"]) == pytest.approx(E(-1) + 1, rel=1e-15)


def test_csv_matches_records():
    """Every line is one Step at full precision (repr), in the order visited."""
    z = np.load(ROOT / "samples/causal.npz")
    res = attention(z["q"], z["k"], z["v"], causal=True, block_q=4, block_k=2, trace_at=(0, 1, 2),
                    order=np.array([3, 1, 0, 2]))
    rows = list(csv.DictReader(io.StringIO(tiles_csv(res))))
    assert [int(x["tile"]) for x in rows] == [3, 1, 0, 2]
    for line, s in zip(rows, res.trace.steps, strict=True):
        assert float(line["m"]) == s.m and float(line["l"]) == s.l
        assert line["skipped"] == ("true" if s.masked else "false")
        assert [float(line[f"o_{j}"]) for j in range(3)] == s.o.tolist()


def test_csv_errors(tmp_path, ramp):
    r = osm("attention", ramp, "--csv", tmp_path / "no" / "x.csv")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("Error: ") and "does not exist" in r.stderr
    assert r.stderr.count("\n") == 1
    r = osm("attention", ramp, "--dtype", "bf16", "--precision", "naive", "--csv",
            tmp_path / "x.csv")
    assert r.exit_code == 1 and r.stderr == (
        "Error: --csv, --plot, --step and --html show the tiles of the tiled run; --precision "
        "naive is one-shot attention\n")


# ---------------------------------------------------------------------------------------------
# the tile map and the probabilities behind --plot


def test_head_probabilities_by_hand(ramp):
    z = np.load(ramp)
    hm = head_probabilities(z["q"], z["k"], block_q=2, block_k=2, causal=True, scale=1.0)
    w = np.array([E(j) for j in range(4)])
    expect = np.tril(np.ones((4, 4))) * w
    expect /= expect.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(hm.p, expect, rtol=1e-15, atol=0)
    assert hm.masked.tolist() == (np.triu(np.ones((4, 4)), 1) == 1).tolist()
    assert hm.skip.tolist() == [[False, True], [False, False]]
    # only the first rows × cols are kept, each row still normalised over every key
    part = head_probabilities(z["q"], z["k"], block_q=2, block_k=2, causal=True, scale=1.0,
                              rows=3, cols=2)
    np.testing.assert_array_equal(part.p, hm.p[:3, :2])
    assert (part.t, part.s) == (4, 4)


def test_head_probabilities_gqa_and_mask():
    """Query head 3 of 4 over 2 kv heads reads kv head 1; a bool mask hides keys per head."""
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(1, 4, 6, 3)), rng.normal(size=(1, 2, 5, 3))
    mask = rng.random((1, 4, 6, 5)) < 0.7
    hm = head_probabilities(q, k, head=3, block_q=4, block_k=2, mask=mask)
    s = q[0, 3] @ k[0, 1].T / math.sqrt(3)
    s = np.where(mask[0, 3], s, -np.inf)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(hm.p, e / e.sum(axis=1, keepdims=True), rtol=1e-14)
    assert (hm.masked == ~mask[0, 3]).all()


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 2), t=st.integers(1, 13), s=st.integers(0, 13),
       bq=st.integers(1, 5), bk=st.integers(1, 5), causal=st.booleans(),
       align=st.sampled_from(["bottom-right", "top-left"]),
       window=st.one_of(st.none(), st.tuples(st.integers(-1, 4), st.integers(-1, 4))),
       masked=st.floats(0, 1), seed=st.integers(0, 10**6))
def test_skip_map_agrees_with_attention(b, h, t, s, bq, bk, causal, align, window, masked, seed):
    """skip_map applies attention's own skip rule: the same count, per tile."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(b, h, t, 2)), rng.normal(size=(b, h, s, 2))
    mask = rng.random((b, 1, t, s)) >= masked if seed % 2 else None
    kw = dict(causal=causal, causal_align=align, window=window, mask=mask)
    res = attention(q, k, k, block_q=bq, block_k=bk, **kw)
    m = skip_map(q, k, block_q=bq, block_k=bk, **kw)
    assert m.shape == (-(-t // bq), -(-s // bk))
    assert int(m.sum()) == res.tiles.skipped and m.size == res.tiles.total
    for i in range(m.shape[0]):  # the traced row of each Q tile saw exactly these skips
        r = attention(q, k, k, block_q=bq, block_k=bk, trace_at=(0, 0, i * bq), **kw)
        assert [x.masked for x in r.trace.steps] == m[i].tolist()


# ---------------------------------------------------------------------------------------------
# --plot


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra osm-cli[plot]")
    path = tmp_path / "p.png"
    r = osm("attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
            "--block-q", "4", "--block-k", "2", "--plot", path)
    assert r.exit_code == 0, r.stderr
    assert f"wrote {path} (probability matrix of batch 0, head 1 with its tiles, PNG)" in r.stderr
    data = path.read_bytes()
    assert _png_size(data) == (900, 800)
    assert data.endswith(b"IEND\xaeB`\x82")
    assert len(data) > 20_000  # a heatmap, a colour bar and a legend, not an empty canvas
    assert "trace of batch 0, head 1, query 2" in r.stdout  # the report is still printed


def test_plot_title_and_limit(tmp_path, monkeypatch):
    """A head longer than PLOT_LIMIT is drawn for its first 512 queries and keys, as the
    title says; the tile map covers the whole head."""
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra osm-cli[plot]")
    import osm_cli.present.plot

    seen = {}

    def fake(hm, title, traced):
        seen.update(hm=hm, title=title, traced=traced)
        return b"png"

    monkeypatch.setattr(osm_cli.present.plot, "attention_png", fake)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(600, 8)) for _ in range(3))
    npz = tmp_path / "long.npz"
    np.savez(npz, q=q, k=k, v=v)
    r = osm("attention", npz, "--causal", "--block-q", "64", "--block-k", "128", "--query", "7",
            "--no-reference", "--plot", tmp_path / "x.png")
    assert r.exit_code == 0, r.stderr
    assert seen["title"] == (f"{npz}: P = softmax(scale·QKᵀ) of batch 0, head 0\n"
                             "showing the first 512 of 600 queries × the first 512 of 600 keys")
    hm = seen["hm"]
    assert hm.p.shape == (PLOT_LIMIT, PLOT_LIMIT) and seen["traced"] == 7
    # 10 Q tiles of 64 × 5 K/V tiles of 128: Q tile i sees keys up to 64i + 63, so it skips
    # the K/V tiles j with 128j > 64i + 63: 4, 4, 3, 3, 2, 2, 1, 1, 0, 0 -> 20
    assert hm.skip.shape == (10, 5) and int(hm.skip.sum()) == 20
    assert hm.skip.sum(axis=1).tolist() == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    assert "30 computed, 20 skipped of 50" in r.stdout
    assert (tmp_path / "x.png").read_bytes() == b"png"


def test_plot_no_keys(tmp_path):
    """With no keys there is no matrix to draw: one Error line, and neither file is written."""
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra osm-cli[plot]")
    npz = tmp_path / "nokeys.npz"
    np.savez(npz, q=np.ones((3, 2)), k=np.ones((0, 2)), v=np.ones((0, 2)))
    hm = head_probabilities(np.ones((3, 2)), np.ones((0, 2)), block_q=2, block_k=2)
    assert hm.p.shape == (3, 0) and hm.skip.shape == (2, 0)
    r = osm("attention", npz, "--plot", tmp_path / "n.png", "--csv", tmp_path / "n.csv")
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == ("Error: --plot: head 0 has 3 queries and 0 keys; there is no probability "
                        "matrix to draw\n")
    assert not (tmp_path / "n.png").exists() and not (tmp_path / "n.csv").exists()


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = tmp_path / "p.png"
    r = osm("attention", "samples/causal.npz", "--plot", path)
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", f"Error: {INSTALL}\n")
    assert not path.exists()


# ---------------------------------------------------------------------------------------------
# --step


def test_step_not_a_terminal():
    args = ["samples/causal.npz", "--causal", "--head", "1", "--query", "2", "--block-q", "4",
            "--block-k", "2"]
    r = osm("attention", *args, "--step")
    assert r.exit_code == 0
    assert r.stderr == "--step: standard output is not a terminal; showing the whole table\n"
    assert "Enter" not in r.stdout
    assert r.stdout == osm("attention", *args).stdout


STEP = ("samples/causal.npz", "--causal", "--head", "1", "--query", "2", "--block-q", "4",
        "--block-k", "2", "--step")


def test_step_mode_in_tmux(tmux):
    """One K/V tile per key, the current tile in reverse video and its arithmetic (O too) under
    the table, the skipped tiles stepped through too; the summary (whose errors give the end
    away) and the output row only after the last tile."""
    tmux.start("attention", *STEP, height=45)
    screen = tmux.wait_for("tile 1 of 4")
    assert "6 computed, 2 skipped of 8" not in screen and "max |O − ref|" not in screen
    assert "-inf → 1.792688" in screen and "2:4" not in screen
    assert "output row" not in screen
    assert "m = max(-inf, 1.792688) = 1.792688" in screen
    assert "O[0] = 0·0 − 1.084855 = -1.084855" in screen
    tmux("send-keys", "-t", "osm", "Enter")
    screen = tmux.wait_for("tile 2 of 4")
    assert "1.147522 → 1.265359" in screen
    styled = tmux("capture-pane", "-p", "-e", "-t", "osm").stdout
    row = next(line for line in styled.splitlines() if "1.147522 → 1.265359" in line)
    assert "\x1b[7m" in row  # the current tile is highlighted
    assert "O[0] = -1.084855·1 − 0.002762556 = -1.087618" in screen
    first = next(line for line in styled.splitlines() if "0 → 1.147522" in line)
    assert "\x1b[7m" not in first
    tmux("send-keys", "-t", "osm", "x", "Space")  # x is ignored, space advances
    screen = tmux.wait_for("tile 3 of 4")
    assert "4:6" in screen and "skipped" in screen
    assert "skipped, not computed: the mask hides its keys" in screen
    tmux("send-keys", "-t", "osm", "Enter")
    tmux.wait_for("tile 4 of 4, the last")
    tmux("send-keys", "-t", "osm", "Enter")
    screen = tmux.wait_for("EXIT=0")
    assert "6 computed, 2 skipped of 8" in screen
    assert "output row O / l" in screen and "-0.8595331907" in screen


def test_step_mode_quit_in_tmux(tmux):
    tmux.start("attention", *STEP, height=45)
    tmux.wait_for("tile 1 of 4")
    tmux("send-keys", "-t", "osm", "Enter")
    tmux.wait_for("tile 2 of 4")
    tmux("send-keys", "-t", "osm", "q")
    screen = tmux.wait_for("EXIT=0")
    assert "stopped at tile 2 of 4" in screen
    assert "output row" not in screen
