"""FA1's I/O cost model (docs/numerics.md#io-model) worked by hand, the GPT-2 medium case of FA1
Fig. 2, the block-size sweep on a small case by hand, and `osm cost` / `osm sweep` on the
command line.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import osm
from osm_cli.errors import InputError
from osm_cli.studies.costmodel import (
    attention_flops,
    cost,
    fa1_blocks,
    fa1_traffic,
    hbm_bytes_flash,
    hbm_bytes_standard,
    parse_size,
    tile_bytes,
)
from osm_cli.studies.sweep import score_runner, sweep


@pytest.mark.parametrize(
    "text, size",
    [("192KiB", 196608), ("192 KiB", 196608), ("192K", 196608), ("192kb", 192000),
     ("1.5MiB", 1572864), ("1MB", 10**6), ("100", 100), ("2GiB", 2 * 1024**3), ("64B", 64)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "KiB", "12XB", "-3KiB", "0.5B", "1e-3"])
def test_parse_size_refuses(text):
    with pytest.raises(InputError):
        parse_size(text)


def test_fa1_blocks():
    """192 KiB of fp16 is M = 98304 elements: B_c = ceil(98304 / 256) = 384, B_r = min(384, 64)."""
    assert fa1_blocks(98304, 64) == (64, 384)
    assert fa1_blocks(98304, 128) == (128, 192)  # ceil(98304 / 512) = 192 > d
    assert fa1_blocks(100, 64) == (1, 1)  # ceil(100 / 256) = 1
    with pytest.raises(InputError):
        fa1_blocks(0, 64)


def test_small_case_by_hand():
    """N = 4 keys and queries, d = 2, one byte per element.

    standard forward:  4Nd + 4N² = 32 + 64 = 96
    standard backward: 8Nd + 7N² = 64 + 112 = 176
    tiled forward, B_c = 2 (T_c = 2): N(d + 2) + 2Nd + T_c·N·(3d + 4) = 16 + 16 + 80 = 112
    tiled backward:   Nd + 6Nd + T_c·N·(5d + 2) = 8 + 48 + 96 = 152
    """
    assert hbm_bytes_standard(4, 2, dtype_bytes=1) == 96
    assert hbm_bytes_standard(4, 2, dtype_bytes=1, backward=True) == 96 + 176
    assert hbm_bytes_flash(4, 2, dtype_bytes=1, block_k=2) == 112
    assert hbm_bytes_flash(4, 2, dtype_bytes=1, block_k=2, backward=True) == 112 + 152
    # heads, batch and bytes per element multiply
    assert hbm_bytes_standard(4, 2, 3, 5, 2) == 96 * 3 * 5 * 2
    # FA1's B_c from M: M = 16 elements, d = 2 -> B_c = ceil(16 / 8) = 2, the same as above
    assert hbm_bytes_flash(4, 2, 16, dtype_bytes=1) == 112
    # two elementwise passes add 2·2·N² per direction
    assert hbm_bytes_standard(4, 2, dtype_bytes=1, elementwise_passes=2) == 96 + 64
    with pytest.raises(InputError):
        hbm_bytes_flash(4, 2)


def test_rectangular():
    """t = 2 query rows, n = 6 keys, d = 1: 2td + 2nd + 4tn = 4 + 12 + 48 = 64."""
    assert hbm_bytes_standard(6, 1, n_q=2, dtype_bytes=1) == 64
    # tiled, B_c = 3, T_c = 2: t(d + 2) + 2nd + T_c·t·(3d + 4) = 6 + 12 + 28 = 46
    assert hbm_bytes_flash(6, 1, n_q=2, dtype_bytes=1, block_k=3) == 46


def test_theorem_2_scaling():
    """Θ(N²d²/M): the T_c term halves when M doubles (B_c doubles), while standard grows as N²."""
    n, d = 4096, 64

    def term(m):
        return hbm_bytes_flash(n, d, m, dtype_bytes=1) - n * (d + 2) - 2 * n * d

    assert term(2 * 65536) * 2 == term(65536)
    assert hbm_bytes_standard(2 * n, d) / hbm_bytes_standard(n, d) == pytest.approx(4, rel=0.02)


def test_gpt2_medium_fig2():
    """FA1 Fig. 2 (GPT-2 medium: N 1024, d 64, 16 heads, batch 64; A100, 192 KiB SRAM, fp16):
    40.3 GB standard vs 4.4 GB FlashAttention, forward + backward. The model gives 25.2 GB
    (42.4 GB with a mask and dropout as separate kernels) vs 4.6 GB: the same order of magnitude.
    """
    c = cost(1024, 64, 16, 64, 2, parse_size("192KiB"))
    assert (c.block_q, c.block_k) == (64, 384)
    assert c.standard_fwd == 9_126_805_504  # (4·1024·64 + 4·1024²)·1024 heads·batch·2 bytes
    assert c.flash_fwd == 1_639_972_864
    assert c.standard_fwd_bwd == 25_232_932_864
    assert c.flash_fwd_bwd == 4_605_345_792
    assert c.standard_fwd_bwd_passes == 42_412_802_048
    assert 30e9 < c.standard_fwd_bwd_passes < 50e9  # ~40 GB
    assert 2e9 < c.flash_fwd_bwd < 6e9  # a few GB
    assert c.flops_fwd == 4 * 1024**2 * 64 * 16 * 64
    assert attention_flops(1024, 64, backward=True) == 4 * 1024**2 * 64 * 7 // 2


def test_tile_bytes():
    """Q_i 128×64 + K_j, V_j 64×64 in fp16; S 128×64, O 128×64, m, l 128 in fp32."""
    assert tile_bytes(128, 64, 64) == 2 * (8192 + 8192) + 4 * (8192 + 8192 + 256) == 99328


# ---------------------------------------------------------------------------------------------
# sweep


def test_sweep_small_case_by_hand():
    """Scores [1, 2, 5, 3], d = 2, one query row per tile, one byte per element.

    Rescales (the running max moves from a finite value):
      block 1: -inf→1, 1→2 (1), 2→5 (2), 5 stays -> 2;  block 2: [1, 2] m=2, [5, 3] 2→5 -> 1;
      block 4: one block -> 0.
    Tiles: ceil(4 / b) = 4, 2, 1. Tile bytes: 1·(2 + 2·b·2) + 4·(b + 2 + 2) = 18 + 8b.
    HBM, tiled: t(d+2) + 2nd + T_c·t·(3d+4) = 4 + 16 + 10·T_c = 60, 40, 30; standard 36.
    """
    s = np.array([[1.0, 2.0, 5.0, 3.0]])
    r = sweep([1, 2, 4], score_runner(s, block_q=1), n_q=1, n_k=4, d=2, dtype_bytes=1,
              sram_bytes=40, block_q=1)
    assert [x.measure.rescales for x in r.rows] == [2, 1, 0]
    assert [x.measure.tiles for x in r.rows] == [4, 2, 1]
    assert [x.measure.skipped for x in r.rows] == [0, 0, 0]
    assert [x.tile_bytes for x in r.rows] == [26, 34, 50]
    assert [x.fits for x in r.rows] == [True, True, False]  # 50 B > 40 B of "SRAM"
    assert [x.hbm_flash for x in r.rows] == [60, 40, 30]
    assert r.hbm_standard == 36
    assert all(x.measure.max_error <= 2e-16 for x in r.rows)
    assert r.fa1_block == (2, 5)  # M = 40: ceil(40 / 8) = 5, min(5, d = 2) = 2


def test_sweep_masked_tiles_and_float32():
    s = np.array([[1.0, 2.0, -np.inf, -np.inf], [0.0, 1.0, -np.inf, -np.inf]])
    r = sweep([2], score_runner(s, np.float32, block_q=2), n_q=2, n_k=4, d=2, block_q=2)
    m = r.rows[0].measure
    assert (m.tiles, m.skipped) == (2, 1)  # keys 2:4 are masked in both rows
    assert 0 < m.max_error < 1e-7  # float32 rounding against the float64 reference
    with pytest.raises(InputError):
        sweep([0], score_runner(s), n_q=2, n_k=4, d=2)


def test_cli_cost(strict_json):
    r = osm("cost", "-n", "1024", "-d", "64", "--heads", "16", "--batch", "64")
    assert r.exit_code == 0, r.stderr
    for text in ("B_c = ceil(M/4d) = 384", "9.13 GB", "1.64 GB", "25.2 GB", "4.61 GB", "42.4 GB",
                 "not a measurement"):
        assert text in r.stdout
    doc = strict_json(osm("cost", "-n", "4", "-d", "2", "--dtype-bytes", "1", "--sram", "16",
                          "--json").stdout)
    assert doc["standard_fwd"] == 96 and doc["flash_fwd"] == 112 and doc["block_k"] == 2


def test_cli_sweep_json(strict_json):
    r = osm("sweep", "--values", "1,2,5,3", "--blocks", "1,2,4", "-d", "2",
            "--block-q", "1", "--dtype-bytes", "1", "--sram", "40", "--json")
    assert r.exit_code == 0, r.stderr
    doc = strict_json(r.stdout)
    assert [b["rescales"] for b in doc["blocks"]] == [2, 1, 0]
    assert [b["hbm_flash"] for b in doc["blocks"]] == [60, 40, 30]
    assert [b["tile_bytes"] for b in doc["blocks"]] == [26, 34, 50]
    assert doc["hbm_standard"] == 36 and doc["sram_bytes"] == 40


def test_cli_sweep_table():
    r = osm("sweep", "samples/matrix.txt", "--blocks", "1,2")
    assert r.exit_code == 0, r.stderr
    assert "rescales" in r.stdout and "not a measurement" in r.stdout
    assert "FA1 would pick B_r = 64, B_c = 384" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--blocks", "1,x"], "whole numbers"),
        (["--blocks", "0,2"], "at least 1"),
        (["--sram", "12XB"], "not a size"),
    ],
)
def test_cli_sweep_bad_options(args, message):
    r = osm("sweep", "--values", "1,2", *args)
    assert r.exit_code == 2
    assert message in r.stderr


def test_cli_sweep_bad_scores():
    r = osm("sweep", "--values", "1,nan")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "NaN" in r.stderr


def test_fa1_traffic_by_hand():
    """t = n = 4, d = 2, 2×2 tiles, 1 B an element. Forward: O, l, m written first (4·(2 + 2) =
    16); K/V tile 0 reads K_0, V_0 (2·2·2 = 8) and each of its Q tiles' 2 rows reads Q_i, O_i,
    l_i, m_i (2·(2d + 2) = 12) and writes O_i, l_i, m_i (2·(d + 2) = 8)."""
    read, written = fa1_traffic(4, 4, 2, 2, 2)
    assert read.tolist() == [[8 + 12, 8 + 24], [8 + 24 + 8 + 12, 2 * (8 + 24)]]
    assert written.tolist() == [[16 + 8, 16 + 16], [16 + 24, 16 + 32]]
    assert read[-1, -1] + written[-1, -1] == hbm_bytes_flash(4, 2, block_k=2, n_q=4,
                                                             dtype_bytes=1) == 112


@pytest.mark.parametrize("t, n, d, bq, bk", [(8, 8, 4, 4, 2), (7, 9, 3, 4, 2), (5, 13, 2, 2, 5),
                                             (1, 1, 1, 1, 1)])
def test_fa1_traffic_ends_at_the_model(t, n, d, bq, bk):
    """Step by step it ends where hbm_bytes_flash does, with skipped tiles (its row_visits) and
    in any K/V tile order; the backward's part alone with backward=True; it only grows."""
    rng = np.random.default_rng(t * 100 + n)
    n_q, n_k = -(-t // bq), -(-n // bk)
    skip = rng.random((n_q, n_k)) < 0.3
    rows = np.minimum(bq, t - bq * np.arange(n_q))
    visits = int(((~skip).T * rows).sum())
    forward = hbm_bytes_flash(n, d, block_k=bk, n_q=t, dtype_bytes=1, row_visits=visits)
    both = hbm_bytes_flash(n, d, block_k=bk, n_q=t, dtype_bytes=1, row_visits=visits,
                           backward=True)
    for backward, end in ((False, forward), (True, both - forward)):
        read, written = fa1_traffic(t, n, d, bq, bk, skip, backward=backward,
                                    order=rng.permutation(n_k))
        assert read[-1, -1] + written[-1, -1] == end
        moved = (read + written).ravel()
        assert (np.diff(moved) >= 0).all()
