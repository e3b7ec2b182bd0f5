"""--score-mod and --mask-mod as a user types them (issue 24): osm attention's summary, trace
and JSON with a document mask and a softcap, osm backward saying how it differentiates, osm
check PASSing a matching output and FAILing it without the document mask, and bad specs as
one "Error:" line."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from conftest import osm, qkv
from osm_cli.flash import mods
from osm_cli.flash.options import ScoreOptions
from osm_cli.flash.reference import reference

DOCS = np.repeat([0, 1, 2, 3], [1, 40, 29, 30])


@pytest.fixture
def files(tmp_path):
    bf = ml_dtypes.bfloat16
    arrays = {n: x.astype(np.float32) for n, x in
              zip("q k v do".split(), qkv(100, 100, 16, heads=(2, 2), b=1, dtype=bf, do=True),
                  strict=True)}
    for name, x in {**arrays, "ids": DOCS}.items():
        np.save(tmp_path / f"{name}.npy", x)
    (tmp_path / "user.py").write_text(
        "import numpy as np\n\n\ndef cap(score, b, h, q_idx, kv_idx):\n"
        "    return 3 * np.tanh(score / 3)\n\n\ndef scalar(score, b, h, q_idx, kv_idx):\n"
        "    return score if q_idx > kv_idx else -score\n")
    opts = ScoreOptions(score_mod=mods.softcap(3.0), mask_mod=[mods.document(DOCS),
                                                                mods.causal()])
    out, _ = reference(arrays["q"], arrays["k"], arrays["v"], opts)
    np.save(tmp_path / "out.npy", out.astype(bf).astype(np.float32))
    return tmp_path


MODS = ["--score-mod", "softcap:3", "--mask-mod", "document:{}/ids.npy", "--mask-mod", "causal"]


def _mods(tmp):
    return [a.format(tmp) for a in MODS]


def test_attention_shows_the_mods_the_block_mask_and_the_kinds(files):
    qkv = [str(files / f"{n}.npy") for n in "qkv"]
    res = osm("attention", *qkv, *_mods(files), "--block-q", "16",
              "--block-k", "16", "--query", "60", width=100)
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    assert "score_mod softcap:3 (exact derivative), mask_mod document & causal" in text
    assert "16 computed (15 partial, masked; 1 full), 33 skipped of 49" in " ".join(text.split())
    assert "block mask: f a full tile (no mask applied), p a partial one (masked)" in text
    assert [ln.split()[:2] for ln in text.splitlines() if " p " in ln[:8]] == [
        ["2", "p"], ["3", "p"]]
    doc = json.loads(osm("attention", *qkv, *_mods(files), "--block-q", "16",
                         "--block-k", "16", "--query", "60", "--json").stdout)
    assert doc["tiles_partial"] == 15 and doc["mods"].startswith("score_mod softcap:3")
    assert [st.get("kind") for st in doc["trace"]["steps"] if not st["skipped"]] == ["partial",
                                                                            "partial"]


def test_a_python_score_mod_with_differences_in_the_backward(files):
    args = [str(files / f"{n}.npy") for n in ("q", "k", "v", "do")]
    res = osm("backward", *args, "--score-mod", f"python:{files}/user.py:cap",
              "--mask-mod", "causal", width=120)
    assert res.exit_code == 0, res.stderr
    assert f"score_mod python:{files}/user.py:cap (finite differences derivative)" in \
        " ".join(res.stdout.split())


def test_check_passes_the_matching_mods_and_fails_without_the_document_mask(files):
    base = ["check", *(str(files / f"{n}.npy") for n in ("out", "q", "k", "v")), "--dtype",
            "bf16"]
    good = osm(*base, *_mods(files))
    assert good.exit_code == 0, good.stdout + good.stderr
    assert "PASS" in good.stdout
    bad = osm(*base, "--score-mod", "softcap:3", "--mask-mod", "causal")
    assert bad.exit_code == 1 and "FAIL" in bad.stdout


@pytest.mark.parametrize("args, says", [
    (["--mask-mod", "sliding"], "--mask-mod sliding needs a parameter: sliding:N"),
    (["--mask-mod", "diagonal"], "the built-ins are causal, sliding, document, prefix-lm"),
    (["--score-mod", "softcap:x"], "'x' is not a number"),
    (["--score-mod", "python:{}/user.py:nope"], "has no function 'nope' (it has cap, scalar)"),
    (["--score-mod", "python:{}/user.py:scalar"], "must take numpy arrays"),
    (["--mask-mod", "document:{}/missing.npy"], "missing.npy"),
])
def test_bad_specs_are_one_error_line(files, args, says):
    qkv = [str(files / f"{n}.npy") for n in "qkv"]
    res = osm("attention", *qkv, *(a.format(files) for a in args))
    assert res.exit_code == 1, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], res.stderr


def test_check_block_mask_fails_a_partial_tile_declared_full(files):
    """A FlexAttention block mask of the causal document mask (t = s = 100 in 32-blocks) passes;
    the same with a partial diagonal tile declared full fails, the tile named."""
    from osm_cli.flash.blockmask import FULL, PARTIAL, block_kinds

    mm = [mods.document(DOCS), mods.causal()]
    kinds = block_kinds(mm, 1, 2, 100, 100, 32, 32)

    def save(k, name):
        arrays = {"block_size": np.array([32, 32])}
        for num, idx, kind in (("kv_num_blocks", "kv_indices", PARTIAL),
                               ("full_kv_num_blocks", "full_kv_indices", FULL)):
            arrays[num] = (k == kind).sum(-1).astype(np.int32)
            arrays[idx] = np.argsort(k != kind, axis=-1, kind="stable").astype(np.int32)
        np.savez(files / name, **arrays)

    save(kinds, "good.npz")
    wrong = kinds.copy()
    wrong[0, 1, 3, 3] = FULL
    save(wrong, "wrong.npz")
    base = ["check", *(str(files / f"{n}.npy") for n in ("out", "q", "k", "v")), "--dtype",
            "bf16", *_mods(files)]
    good = osm(*base, "--block-mask", str(files / "good.npz"))
    assert good.exit_code == 0, good.stdout + good.stderr
    assert "block mask PASS: 0 wrong of 32 tiles (block 32×32 against document & causal)" in \
        good.stdout
    bad = osm(*base, "--block-mask", str(files / "wrong.npz"))
    assert bad.exit_code == 1
    assert ("FAIL: block mask: batch 0, head 1, Q tile 3 (rows 96:100), K/V tile 3 (keys "
            "96:100): claimed full but partial: its mask is never applied") in bad.stderr


def test_trace_and_sweep_take_the_mods(files):
    """osm trace: row r is q_idx r, position j kv_idx j, so sliding:1 on row 2 of a 3 × 3
    matrix keeps keys 1 and 2; osm sweep on Q/K/V runs the mods in every tile size."""
    res = osm("trace", "--values", "1,2,5", "-b", "1", "--mask-mod",
              "sliding:1", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["m"] == 1.0  # row 0 (q_idx 0) sees only key 0
    (files / "m.txt").write_text("1 2 5\n1 2 5\n1 2 5\n")
    res = osm("trace", str(files / "m.txt"), "--row", "2", "-b", "1",
              "--mask-mod", "sliding:1", "--score-mod", "tanh-gate", "--json")
    doc = json.loads(res.stdout)  # per row: row 0 sees key 0, row 1 keys 0:2, row 2 keys 1:3
    assert doc["m"] == [float(np.tanh(x)) for x in (1.0, 2.0, 5.0)]
    assert doc["l"][2] == pytest.approx(np.exp(np.tanh(2.0) - np.tanh(5.0)) + 1, rel=1e-15)
    both = osm("trace", "--values", "1,2", "--softcap", "2", "--score-mod",
               "softcap:2")
    assert both.exit_code == 1 and "not both" in both.stderr
    qkv = [str(files / f"{n}.npy") for n in "qkv"]
    sw = osm("sweep", *qkv, "--blocks", "16,32", "--block-q", "16", "--json",
             *_mods(files))
    assert sw.exit_code == 0, sw.stderr
    from osm_cli.studies.tilemap import kind_map

    rows = json.loads(sw.stdout)["blocks"]
    q, k = (np.load(files / f"{n}.npy") for n in "qk")
    mm = [mods.document(DOCS), mods.causal()]
    assert [r["masked_tiles"] for r in rows] == [
        int((kind_map(q, k, block_q=16, block_k=bk, mask_mod=mm) == "skip").sum())
        for bk in (16, 32)] == [33, 18]
    assert max(r["max_abs_error"] for r in rows) < 1e-6


def test_backward_traces_mark_full_and_partial_tiles(files):
    """osm backward under a mask_mod marks each traced tile as the forward's trace does (f a
    full tile, p a partial one: the block mask's walk), in both traces' tables at 80 columns
    and in the JSON; key 85 sits in K/V tile 5, which Q tile 5 sees in part (the diagonal)
    and Q tile 6 whole; query 98 sees K/V tile 4 in part (a document starts at 70), 5 whole
    and 6 in part. Without a mask_mod no tile is marked."""
    args = [str(files / f"{n}.npy") for n in ("q", "k", "v", "do")]
    base = ["backward", *args, "--block-q", "16", "--block-k", "16", "--query", "98", "--key",
            "85"]
    mm = ["--mask-mod", f"document:{files}/ids.npy", "--mask-mod", "causal"]
    res = osm(*base, *mm, width=80)
    assert res.exit_code == 0, res.stderr
    legend = "block mask: f a full tile (no mask applied), p a partial one (masked)"
    assert res.stdout.count(legend) == 2
    marked = [ln.split()[:3] for ln in res.stdout.splitlines()
              if len(ln.split()) > 2 and ln.split()[1] in ("f", "p")]
    assert marked == [["5", "p", "80:96"], ["6", "f", "96:100"],  # the key's Q tiles
                      ["4", "p", "64:80"], ["5", "f", "80:96"], ["6", "p", "96:100"]]
    doc = json.loads(osm(*base, *mm, "--json", code=0).stdout)
    assert [s.get("kind") for s in doc["key_trace"]] == [None] * 5 + ["partial", "full"]
    assert [s.get("kind") for s in doc["query_trace"]] == [None] * 4 + ["partial", "full",
                                                                        "partial"]
    plain = osm(*base, "--causal", width=80)
    assert plain.exit_code == 0 and legend not in plain.stdout
    assert all("kind" not in s for s in json.loads(
        osm(*base, "--causal", "--json", code=0).stdout)["query_trace"])
