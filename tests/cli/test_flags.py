"""Validation once, in library words (issue 20, item 5): the library's errors name parameters,
never the command line's flags; the CLI prints each parameter as its flag through one table
(cli/flags.py), so its Error lines read as they always did."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import osm_cli
from conftest import osm, qkv
from osm_cli.cli.flags import as_flags, flag

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("core", "flash", "precision", "studies", "reports", "io", "api")


def test_parameters_become_flags():
    assert flag("block_q") == "--block-q" and flag("q_descale") == "--q-descale"
    assert flag("softmax_scale") == "--scale" and flag("learnable_sink") == "--sinks"
    assert flag("window_size") == "--window" and flag("attn_mask") == "--mask"
    assert as_flags("`order` reverse needs `kernel` tiles; fa2 visits") == (
        "--order reverse needs --kernel tiles; fa2 visits")
    assert as_flags("no parameter here, `x = 1` neither") == "no parameter here, `x = 1` neither"


def _raised_strings(tree: ast.AST):
    """The string pieces of every `raise …(…)` in a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    yield node.lineno, sub.value


def test_no_library_error_names_a_flag():
    found = []
    for layer in LIBRARY:
        for path in sorted((ROOT / "osm_cli" / layer).glob("*.py")):
            tree = ast.parse(path.read_text())
            found += [f"{path.relative_to(ROOT)}:{line}: {text!r}"
                      for line, text in _raised_strings(tree) if re.search(r"--[a-z]", text)]
    assert found == []


def test_the_library_says_parameters_and_the_cli_says_flags():
    q, k, v = qkv(8, 8, 4, heads=(2, 2), b=1)
    with pytest.raises(osm_cli.OsmError) as exc:
        osm_cli.attention(q, k, v, kernel="fa4")
    assert str(exc.value) == ("`kernel` fa4 models a kernel of float16 or bfloat16 inputs; give "
                              "`dtype` (e.g. `dtype` bf16), or `kernel` tiles for osm's own loop")
    r = osm("attention", "samples/qkv.npz", "--kernel", "fa4")
    assert (r.exit_code, r.stderr) == (1, f"Error: {as_flags(str(exc.value))}\n")
    assert r.stderr == ("Error: --kernel fa4 models a kernel of float16 or bfloat16 inputs; give "
                        "--dtype (e.g. --dtype bf16), or --kernel tiles for osm's own loop\n")


def test_descales_all_three_or_none_in_both_words(tmp_path):
    q, k, v = qkv(8, 8, 4, heads=(2, 2), b=1)
    with pytest.raises(osm_cli.InputError, match=r"^give `q_descale`, `k_descale` and "
                       r"`v_descale` together; missing `k_descale`, `v_descale`$"):
        osm_cli.attention(q, k, v, q_descale=np.ones((1, 2)))
    np.save(tmp_path / "d.npy", np.ones((1, 2), np.float32))
    r = osm("attention", "samples/qkv.npz", "--q-descale", tmp_path / "d.npy")
    assert r.exit_code == 1
    assert r.stderr == ("Error: give --q-descale, --k-descale and --v-descale together; missing "
                        "--k-descale, --v-descale\n")
