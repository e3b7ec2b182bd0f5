"""`osm sweep Q K V`: the attention runner of studies/sweep.py, worked by hand on a tiny causal
case, the block-sparse traffic model (FA1 Prop. 4), the one-.npz and three-.npy forms, the reference
computed once, the scores form unchanged, and the command-line errors.
"""

from __future__ import annotations

import importlib
import math
import sys

import numpy as np
import pytest

from conftest import osm
from osm_cli.present.plot import INSTALL
from osm_cli.studies.costmodel import hbm_bytes_flash
from osm_cli.studies.sweep import attention_runner, sweep
from osm_cli.studies.tilemap import row_visits, skip_map

E = math.exp
att = importlib.import_module("osm_cli.studies.sweep")  # the names attention_runner calls


def ramp_qkv():
    """t = s = 4, d = 2. With scale 1, q_i = [1, 0] and k_j = [j, 0] the score of key j is j for
    every query; v_j = [j, 1], so O's second component is 1 exactly."""
    q = np.array([[1.0, 0.0]] * 4)
    k = np.array([[float(j), 0.0] for j in range(4)])
    v = np.array([[float(j), 1.0] for j in range(4)])
    return q, k, v


def test_sweep_qkv_by_hand():
    """Causal (key j visible to query i iff j ≤ i), block_q 2 (Q tiles rows 0:2 and 2:4), one
    byte per element, 60 bytes of "SRAM".

    Tiles (Q tile × K/V tile): block 1: 2 × 4 = 8, the Q tile 0:2 never sees keys 2 and 3 -> 2
    skipped; block 2: 2 × 2 = 4, keys 2:4 for rows 0:2 skipped -> 1; block 4: 2, none.
    Rescales (a row's finite running max moves): the scores rise with j, so with block 1 row i
    moves its max at keys 1 … i: 0 + 1 + 2 + 3 = 6; block 2: rows 2 and 3 move from 1 (keys 0:2)
    to 2 and 3 (keys 2:4) -> 2; block 4: one tile per row -> 0.
    Tile bytes, 1·(B_r·d + 2·B_c·d) + 4·(B_r·B_c + B_r·d + 2·B_r) = 36 + 12·B_c: 48, 60, 84.
    HBM tiled, t(d+2) + 2sd + T_c·t·(3d+4) = 16 + 16 + 40·T_c: 192, 112, 72; standard
    2td + 2sd + 4ts = 96. Skipping tiles, (row, tile) visits 2·2 + 4·2 = 12, 1·2 + 2·2 = 6, 4
    replace T_c·t: 32 + 10·visits = 152, 92, 72.
    """
    q, k, v = ramp_qkv()
    run = attention_runner(q, k, v, block_q=2, causal=True, scale=1.0)
    r = sweep([1, 2, 4], run, n_q=4, n_k=4, d=2, dtype_bytes=1, sram_bytes=60, block_q=2)
    m = [x.measure for x in r.rows]
    assert [x.tiles for x in m] == [8, 4, 2]
    assert [x.skipped for x in m] == [2, 1, 0]
    assert [x.rescales for x in m] == [6, 2, 0]
    assert [x.row_visits for x in m] == [12, 6, 4]
    assert [x.tile_bytes for x in r.rows] == [48, 60, 84]
    assert [x.fits for x in r.rows] == [True, True, False]
    assert [x.hbm_flash for x in r.rows] == [192, 112, 72]
    assert [x.hbm_skipping for x in r.rows] == [152, 92, 72]
    assert r.hbm_standard == 96
    assert r.fa1_block == (2, 8)  # M = 60: ceil(60 / 8) = 8, min(8, d = 2) = 2
    assert all(x.max_error <= 5e-16 and x.lse_error <= 5e-16 for x in m)


def test_runner_matches_attention_and_reference(monkeypatch):
    """The error is attention's own against the float64 reference; the reference is computed
    once for the whole sweep, not once per block size."""
    q, k, v = ramp_qkv()
    calls = []
    real = att.reference
    monkeypatch.setattr(att, "reference", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    run = attention_runner(q.astype(np.float32), k, v, causal=True, scale=1.0,
                           accum=np.float32)
    measures = [run(b) for b in (1, 2, 4)]
    assert len(calls) == 1
    res = att.attention(q.astype(np.float32), k, v, causal=True, scale=1.0, block_k=2,
                        accum=np.float32)
    ref_out, ref_lse = real(q.astype(np.float32), k, v, causal=True, scale=1.0)
    assert measures[1].max_error == att.errors(res, ref_out, ref_lse)["max_abs_err"]
    # row 3 by hand: O = Σ p_j·v_j with p_j = e^j / Σ e^j
    w = np.array([E(j) for j in range(4)])
    assert ref_out[3, 0] == pytest.approx((w * np.arange(4)).sum() / w.sum(), rel=1e-15)
    assert ref_lse[3] == pytest.approx(math.log(w.sum()), rel=1e-15)
    assert 0 < measures[0].max_error < 1e-6  # float32 state


def test_block_sparse_model():
    """FA1 Prop. 4: only the (row, key block) pairs visited pay for Q_i, O_i, l_i, m_i."""
    assert hbm_bytes_flash(4, 2, dtype_bytes=1, block_k=2) == 112
    assert hbm_bytes_flash(4, 2, dtype_bytes=1, block_k=2, row_visits=8) == 112  # = T_c·t
    assert hbm_bytes_flash(4, 2, dtype_bytes=1, block_k=2, row_visits=6) == 92
    # backward likewise: t·d + 6sd + visits·(5d + 2) = 8 + 48 + 6·12
    assert hbm_bytes_flash(4, 2, dtype_bytes=1, block_k=2, row_visits=6, backward=True) == (
        92 + 8 + 48 + 72)
    # per head: heads and batch multiply
    assert hbm_bytes_flash(4, 2, 2, 3, 1, block_k=2, row_visits=6) == 92 * 6


def test_row_visits_ragged_last_tile():
    """t = 5 in Q tiles of 2: rows 2, 2, 1. Skipping tile (0, 1) and (2, 0) of a 3 × 2 map
    leaves 2·1 + 2·2 + 1·1 = 7 visits of 10."""
    skip = np.array([[False, True], [False, False], [True, False]])
    assert row_visits(skip, 5, 2) == 7
    assert row_visits(np.zeros((3, 2), bool), 5, 2) == 10


def test_skip_map_by_hand():
    """t = 2, s = 5, causal bottom-right keeps 11110 / 11111: in tiles of 1 × 2 keys, none of
    the three tiles of row 1 is empty and row 0's last tile (key 4) is; top-left keeps 10000 /
    11000, so row 0 skips tiles 1 and 2, row 1 skips tile 2."""
    q, k = np.zeros((2, 3)), np.zeros((5, 3))
    br = skip_map(q, k, block_q=1, block_k=2, causal=True)
    tl = skip_map(q, k, block_q=1, block_k=2, causal=True, causal_align="top-left")
    assert br.tolist() == [[False, False, True], [False, False, False]]
    assert tl.tolist() == [[False, True, True], [False, True, True]]


# ---------------------------------------------------------------------------------------------
# the command line


@pytest.fixture
def ramp_npz(tmp_path):
    q, k, v = ramp_qkv()
    path = tmp_path / "ramp.npz"
    np.savez(path, q=q, k=k, v=v)
    for name, x in zip("qkv", (q, k, v), strict=True):
        np.save(tmp_path / f"{name}.npy", x)
    return path


HAND = ["--causal", "--blocks", "1,2,4", "--block-q", "2", "--dtype-bytes", "1", "--sram", "60",
        "--scale", "1"]


def test_cli_sweep_qkv_json(strict_json, ramp_npz):
    r = osm("sweep", str(ramp_npz), *HAND, "--json")
    assert r.exit_code == 0, r.stderr
    doc = strict_json(r.stdout)
    assert [b["tiles"] for b in doc["blocks"]] == [8, 4, 2]
    assert [b["masked_tiles"] for b in doc["blocks"]] == [2, 1, 0]
    assert [b["tiles_computed"] for b in doc["blocks"]] == [6, 3, 2]
    assert [b["rescales"] for b in doc["blocks"]] == [6, 2, 0]
    assert [b["tile_bytes"] for b in doc["blocks"]] == [48, 60, 84]
    assert [b["fits"] for b in doc["blocks"]] == [True, True, False]
    assert [b["hbm_flash"] for b in doc["blocks"]] == [192, 112, 72]
    assert [b["hbm_flash_skipping"] for b in doc["blocks"]] == [152, 92, 72]
    assert doc["hbm_standard"] == 96 and doc["rows"] == 4 and doc["keys"] == 4 and doc["d"] == 2
    assert doc["shape_q"] == [4, 2] and doc["causal"] is True and doc["error_of"] == "O"
    assert all(b["max_abs_error"] <= 5e-16 for b in doc["blocks"])
    three = [str(ramp_npz.parent / f"{n}.npy") for n in "qkv"]
    r3 = osm("sweep", *three, *HAND, "--json")
    assert r3.exit_code == 0, r3.stderr
    assert strict_json(r3.stdout)["blocks"] == doc["blocks"]


def test_cli_sweep_qkv_table(ramp_npz, monkeypatch):
    monkeypatch.chdir(ramp_npz.parent)
    r = osm("sweep", "ramp.npz", *HAND)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "ramp.npz: Q (4, 2)  K (4, 2)  V (4, 2), causal (bottom-right)"
    assert lines[1] == ("B = 1, H = 1, 4 queries × 4 keys per head: the tiled forward at each "
                        "block_k (state in float64)")
    head = next(x for x in lines if x.lstrip().startswith("block"))
    assert head.split() == ["block", "tiles", "skipped", "rescales", "max", "|O−ref|", "max",
                            "|ΔLSE|", "tile", "bytes", "fits", "HBM", "tiled", "HBM", "skip"]
    row = next(x for x in lines if x.split()[:1] == ["2"]).split()
    assert row[:4] == ["2", "4", "1", "2"] and row[-7:] == ["60", "B", "yes", "112", "B", "92",
                                                             "B"]
    assert "FA1 Prop. 4" in r.stdout
    # without a mask no tile is skipped: the std/tiled ratio instead, 96 / 192 = 0.5
    r = osm("sweep", "ramp.npz", *HAND[1:])
    assert "std/tiled" in r.stdout and "HBM skip" not in r.stdout
    one = next(x for x in r.stdout.splitlines() if x.split()[:1] == ["1"])
    assert one.endswith("0.5×")  # the last column, without the pad rich gave it before 0.2


def test_cli_sweep_qkv_samples(strict_json):
    """samples/long.npz (512 × 64, fp16), causal, the README's case: tiles of 128 rows."""
    r = osm("sweep", "samples/long.npz", "--causal", "--blocks", "64,128",
            "--json")
    assert r.exit_code == 0, r.stderr
    b64, b128 = strict_json(r.stdout)["blocks"]
    # 4 Q tiles × 8 K/V tiles of 64: Q tile i skips K/V tiles 2i + 2 … 7 -> 6 + 4 + 2 + 0 = 12
    assert (b64["tiles"], b64["masked_tiles"], b64["row_visits"]) == (32, 12, 20 * 128)
    assert (b128["tiles"], b128["masked_tiles"], b128["row_visits"]) == (16, 6, 10 * 128)
    # standard: (4·512·64 + 4·512²)·2 bytes; tiled with B_c 128: (512·66 + 2·512·64 +
    # 4·512·196)·2; skipping: 10 tiles of 128 rows instead of 16
    assert strict_json(r.stdout)["hbm_standard"] == 2_359_296
    assert b128["hbm_flash"] == 1_001_472 and b128["hbm_flash_skipping"] == 700_416
    assert b128["tile_bytes"] == 148_480 and b128["fits"]


def test_cli_sweep_scores_unchanged():
    """The scores form prints what it printed before Q/K/V were added."""
    r = osm("sweep", "samples/matrix.txt", "--blocks", "1,2,4")
    assert r.exit_code == 0, r.stderr
    got = [line.rstrip() for line in r.stdout.splitlines()]
    assert got[:4] == [
        "samples/matrix.txt: 4 row(s) × 4 keys, measured per block size",
        "model: head dim d = 64, 2 bytes per element, tiles of 128 query rows, SRAM 192 KiB",
        "(M = 98304 elements: FA1 would pick B_r = 64, B_c = 384)",
        "standard attention, forward: 2.18 kB of HBM traffic (model)",
    ]
    assert got[5:10] == [
        " block  tiles  masked  rescales  max |p−ref|  max |ΔLSE|  tile bytes  fits  HBM tiled"
        "  std/tiled",
        " " + "─" * 95,
        "     1      4       0         4            0           0    49.8 KiB   yes    7.82 kB"
        "     0.278×",
        "     2      2       0         2     1.11e-16           0    50.5 KiB   yes    4.69 kB"
        "     0.464×",
        "     4      1       0         0            0           0      52 KiB   yes    3.12 kB"
        "     0.697×",
    ]
    assert "masked: tiles whose scores are all -inf" in r.stdout


def test_cli_sweep_qkv_plot(tmp_path, ramp_npz):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra osm-cli[plot]")
    path = tmp_path / "sweep.png"
    r = osm("sweep", str(ramp_npz), *HAND, "--plot", str(path))
    assert r.exit_code == 0, r.stderr
    assert f"wrote {path}" in r.stderr
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert int.from_bytes(data[16:20], "big") == 900 and int.from_bytes(data[20:24], "big") == 750


def test_cli_sweep_qkv_plot_without_matplotlib(tmp_path, monkeypatch, ramp_npz):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "s.png"
    r = osm("sweep", str(ramp_npz), "--plot", str(path))
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", f"Error: {INSTALL}\n")
    assert not path.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--values", "1,2"], "--values and --head-dim are for scores"),
        (["-d", "8"], "--values and --head-dim are for scores"),
    ],
)
def test_cli_sweep_qkv_errors(ramp_npz, args, message):
    r = osm("sweep", str(ramp_npz), *args)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith(f"Error: {message}") and r.stderr.count("\n") == 1


def test_cli_sweep_errors(tmp_path, ramp_npz):
    def err(*args):
        r = osm("sweep", *map(str, args))
        assert r.exit_code == 1 and r.stdout == "", r.stdout
        assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    d = ramp_npz.parent
    assert "got 2 files" in err(d / "q.npy", d / "k.npy")
    assert "are for Q/K/V" in err("samples/matrix.txt", "--causal")
    assert "are for Q/K/V" in err("--values", "1,2", "--scale", "2")
    np.save(tmp_path / "v5.npy", np.zeros((5, 2)))
    assert "K and V sequence lengths differ" in err(d / "q.npy", d / "k.npy", tmp_path / "v5.npy")
    q = np.ones((4, 2))
    q[1, 1] = np.nan
    np.save(tmp_path / "qnan.npy", q)
    assert "Q holds NaN" in err(tmp_path / "qnan.npy", d / "k.npy", d / "v.npy")
    assert "missing.npy: no such file" in err(d / "q.npy", d / "k.npy", tmp_path / "missing.npy")
    r = osm("sweep", str(ramp_npz), "--blocks", "0")
    assert r.exit_code == 2 and "at least 1" in r.stderr


def test_cli_sweep_qkv_csv(tmp_path, ramp_npz):
    """The hand-worked case of test_sweep_qkv_by_hand, as CSV rows."""
    path = tmp_path / "sweep.csv"
    r = osm("sweep", str(ramp_npz), *HAND, "--csv", str(path))
    assert r.exit_code == 0, r.stderr
    assert r.stderr == f"wrote {path} (the sweep table, CSV)\n"
    lines = path.read_text().splitlines()
    assert lines[0] == ("block,tiles,skipped,rescales,max_error,lse_error,tile_bytes,fits,"
                        "hbm_tiled,hbm_skipping,hbm_standard,row_visits")
    rows = [line.split(",") for line in lines[1:]]
    cols = [[r[i] for r in rows] for i in (0, 1, 2, 3, 6, 7, 8, 9, 10, 11)]
    assert cols == [["1", "2", "4"], ["8", "4", "2"], ["2", "1", "0"], ["6", "2", "0"],
                    ["48", "60", "84"], ["true", "true", "false"], ["192", "112", "72"],
                    ["152", "92", "72"], ["96"] * 3, ["12", "6", "4"]]
    assert all(float(r[4]) <= 5e-16 for r in rows)
