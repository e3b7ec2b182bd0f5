"""PyTorch FlexAttention's captures (samples/flex/, an H200, compiled, bf16): osm check with the
score_mod and mask_mod each case's meta describes PASSes its outputs, LSE and gradients
(softcap, ALiBi, causal, sliding window, a document mask of uneven packed sequences with one
of length 1, prefix-LM, softcap with documents, at N = 256 and N = 300), and FAILs the case
run with a wrong block mask, naming the partial tile declared full, on the command line too."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import osm

ROOT = Path(__file__).resolve().parents[2]
FLEX = ROOT / "samples" / "flex"


def _program():
    name = "osm_benchmarks_flex_check"  # benchmarks/flex_check.py: the captures' mods
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks/flex_check.py")
    mod = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)
    return mod


PROGRAM = _program()
CASES = sorted(FLEX.glob("flex_*.npz"))
RIGHT = [p for p in CASES if "wrong" not in p.name]


def test_every_case_is_here():
    names = {p.stem for p in CASES}
    for case in ("softcap", "alibi", "causal", "sliding", "document", "prefix_lm",
                 "softcap_document"):
        assert {f"flex_{case}_n256", f"flex_{case}_n300"} <= names
    assert "flex_wrong_block_mask_causal_n256" in names


@pytest.mark.parametrize("path", RIGHT, ids=lambda p: p.stem)
def test_osm_check_passes_flex_forward_and_gradients(path):
    row = PROGRAM.judge_case(path)
    assert row["out"], row
    assert row["lse_err"] < 1e-4  # float32 LSE of bf16 inputs
    assert all(ok for ok, _ in row["grads"].values()) and len(row["grads"]) == 3, row
    assert row["block"] in (None, (True, ""))  # flex's own block mask is right


def test_the_wrong_block_mask_fails_with_the_tile_named():
    row = PROGRAM.judge_case(FLEX / "flex_wrong_block_mask_causal_n256.npz")
    assert not row["out"]
    assert row["block"] == (False, "batch 0, head 0, Q tile 1 (rows 128:256), K/V tile 1 (keys "
                                   "128:256): claimed full but partial: its mask is never "
                                   "applied")


def test_the_wrong_block_mask_on_the_command_line(tmp_path):
    """osm check OUT Q K V --mask-mod causal --block-mask FILE: exit 1, the tile named; the
    right block mask and outputs of the same inputs pass."""
    with np.load(FLEX / "flex_wrong_block_mask_causal_n256.npz") as z:
        a = {n: z[n] for n in z.files}
    for n in ("out", "q", "k", "v", "out_right"):
        np.save(tmp_path / f"{n}.npy", a[n])
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    np.savez(tmp_path / "wrong.npz", **{n: a[n] for n in names})
    np.savez(tmp_path / "right.npz", **{n: a[f"{n}_right"] for n in names})
    scale = str(json.loads(str(a["meta"]))["scale"])
    base = ["check", "--dtype", "bf16", "--mask-mod", "causal", "--scale", scale, "--no-model"]
    qkv = [str(tmp_path / f"{n}.npy") for n in "qkv"]
    bad = osm(*base, str(tmp_path / "out.npy"), *qkv, "--block-mask",
              str(tmp_path / "wrong.npz"))
    assert bad.exit_code == 1
    assert "FAIL: block mask: batch 0, head 0, Q tile 1 (rows 128:256), K/V tile 1" in bad.stderr
    good = osm(*base, str(tmp_path / "out_right.npy"), *qkv, "--block-mask",
               str(tmp_path / "right.npz"))
    assert good.exit_code == 0, good.stdout + good.stderr
    assert "block mask PASS: 0 wrong of 8 tiles" in good.stdout
