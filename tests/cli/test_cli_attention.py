"""`osm attention` through the CLI: the README commands, outputs equal to the Python API's,
strict JSON, and a battery of bad inputs (exit 1 with one "Error:" line, never a traceback).
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import osm, qkv, rand
from osm_cli.flash.forward import attention
from osm_cli.flash.reference import errors, reference

F32 = np.float32
SAMPLE_FILES = ["samples/q.npy", "samples/k.npy", "samples/v.npy"]


def sample_qkv(name="qkv.npz"):
    with np.load(f"samples/{name}") as z:
        return z["q"], z["k"], z["v"]


def write(tmp_path, **arrays):
    """Save each array as NAME.npy under tmp_path; return the paths in order."""
    paths = []
    for name, arr in arrays.items():
        path = tmp_path / f"{name}.npy"
        np.save(path, arr, allow_pickle=arr.dtype.kind == "O")
        paths.append(path)
    return paths


def assert_one_error_line(result, code=1, words=None):
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "internal error" not in lines[0]
    assert result.stdout == ""
    if words is not None:
        assert words in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------
# The README commands


def test_sample_summary_and_trace():
    q, k, v = (np.load(p) for p in SAMPLE_FILES)
    res = attention(q, k, v)
    errs = errors(res, *reference(q, k, v))
    result = osm("attention", *SAMPLE_FILES)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    text = result.stdout
    assert "Q (2, 8, 4)  K (2, 8, 4)  V (2, 8, 4)" in text
    assert "0.5" in text  # scale 1/sqrt(4)
    assert "block_q 128, block_k 128: 1 computed, 0 skipped of 1" in text
    assert "0 (output 0, LSE neg-inf)" in text
    for key in ("max_abs_err", "max_rel_err", "max_lse_err"):
        assert 0 < errs[key] < 1e-6  # float32 run against the float64 reference
        assert f"{errs[key]:.3g}" in text
    assert "trace of batch 0, head 0, query 0: start m = -inf, l = 0, O = 0" in text
    assert f"{res.trace.steps[0].block_max:.7g}" in text


def test_npz_causal_head_and_query(strict_json):
    q, k, v = sample_qkv()
    res = attention(q, k, v, causal=True, trace_at=(0, 1, 5))
    ref_out, _ = reference(q, k, v, causal=True)
    result = osm("attention", "samples/qkv.npz", "--causal", "--head", 1, "--query", 5)
    assert result.exit_code == 0, result.stderr
    assert "causal" in result.stdout and "yes (bottom-right)" in result.stdout
    assert "trace of batch 0, head 1, query 5" in result.stdout
    doc = strict_json(osm("attention", "samples/qkv.npz", "--causal", "--head", 1, "--query", 5,
                          "--json").stdout)
    assert (doc["trace"]["head"], doc["trace"]["query"]) == (1, 5)
    assert doc["trace"]["out"] == res.out[1, 5].tolist()
    np.testing.assert_allclose(doc["trace"]["reference"], ref_out[1, 5], rtol=0, atol=1e-15)
    assert doc["causal"] is True and doc["causal_align"] == "bottom-right"


def test_causal_sample_skips_tiles(strict_json):
    q, k, v = sample_qkv("causal.npz")
    res = attention(q, k, v, causal=True, block_q=4, block_k=2, trace_at=(0, 1, 2))
    result = osm("attention", "samples/causal.npz", "--causal", "--head", 1, "--query", 2,
                 "--block-q", 4, "--block-k", 2, "--json")
    assert result.exit_code == 0, result.stderr
    doc = strict_json(result.stdout)
    assert doc["tiles_skipped"] == res.tiles.skipped > 0
    assert doc["tiles_computed"] == res.tiles.computed
    assert [s["skipped"] for s in doc["trace"]["steps"]] == [s.masked for s in res.trace.steps]
    assert any(s["skipped"] for s in doc["trace"]["steps"])


def test_out_and_lse_files_equal_the_api(tmp_path):
    o_path, lse_path = tmp_path / "o.npy", tmp_path / "lse.npy"
    result = osm("attention", *SAMPLE_FILES, "--out", o_path, "--lse", lse_path, "--no-reference")
    assert result.exit_code == 0, result.stderr
    assert "skipped (--no-reference)" in result.stdout
    res = attention(*(np.load(p) for p in SAMPLE_FILES))
    o, lse = np.load(o_path), np.load(lse_path)
    assert o.shape == (2, 8, 4) and o.dtype == np.float32
    assert lse.shape == (2, 8) and lse.dtype == np.float32  # Q's shape without its last axis
    np.testing.assert_array_equal(o, res.out)
    np.testing.assert_array_equal(lse, res.lse)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lse.npy", "o.npy"]  # no temporaries


def test_out_and_lse_bnhd_gqa_masked_rows(tmp_path):
    """(B, N, H, d) with GQA and t > s bottom-right causal: LSE is FlashAttention's (B, H, t),
    +inf on empty rows."""
    q, k, v = qkv(6, 4, 3, dv=5, heads=(4, 2), b=2, seed=1, dtype=F32, layout="bnhd")
    paths = write(tmp_path, q=q, k=k, v=v)
    o_path, lse_path = tmp_path / "o.npy", tmp_path / "lse.npy"
    result = osm("attention", *paths, "--layout", "bnhd", "--causal", "--masked-lse", "pos-inf",
                 "--block-k", 3, "--out", o_path, "--lse", lse_path)
    assert result.exit_code == 0, result.stderr
    res = attention(q, k, v, layout="bnhd", causal=True, masked_lse="pos-inf", block_k=3)
    o, lse = np.load(o_path), np.load(lse_path)
    assert o.shape == (2, 6, 4, 5) and lse.shape == (2, 4, 6)
    np.testing.assert_array_equal(o, res.out)
    np.testing.assert_array_equal(lse, res.lse)
    assert np.isposinf(lse[:, :, :2]).all() and (o[:, :2] == 0).all()  # rows 0, 1 see no key
    assert np.isfinite(lse[:, :, 2:]).all()
    assert "16 (output 0, LSE pos-inf)" in result.stdout  # 2 batches × 4 heads × 2 rows


def test_json_is_strict_and_complete(strict_json):
    q, k, v = sample_qkv()
    res = attention(q, k, v, block_k=3, trace_at=(0, 1, 6))
    errs = errors(res, *reference(q, k, v))
    result = osm("attention", "samples/qkv.npz", "--block-k", 3, "--batch", 0, "--head", 1,
                 "--query", 6, "--json")
    assert result.exit_code == 0, result.stderr
    doc = strict_json(result.stdout)
    assert doc["shape_q"] == [2, 8, 4]
    assert (doc["tiles_computed"], doc["tiles_skipped"]) == (3, 0)
    assert doc["rescales"] == res.counters.rescales and doc["masked_rows"] == 0
    for key in ("max_abs_err", "max_rel_err", "max_lse_err"):
        assert doc[key] == pytest.approx(errs[key], rel=1e-12)
    steps = doc["trace"]["steps"]
    assert len(steps) == 3
    assert steps[0]["m_prev"] == "-inf" and steps[0]["l_prev"] == 0 and steps[0]["scale"] == 0
    for got, want in zip(steps, res.trace.steps, strict=True):
        assert (got["start"], got["stop"]) == (want.start, want.stop)
        assert got["m"] == want.m and got["scale"] == want.alpha and got["l"] == want.l
        assert got["m"] >= (want.m_prev if math.isfinite(want.m_prev) else -1e300)
    assert steps[-1]["l"] > 0


def test_json_with_fully_masked_rows_uses_strings(strict_json, tmp_path):
    q, k, v = qkv(5, 2, 3, seed=4, dtype=F32)
    paths = write(tmp_path, q=q, k=k, v=v)
    result = osm("attention", *paths, "--causal", "--query", 1, "--json")
    assert result.exit_code == 0, result.stderr
    doc = strict_json(result.stdout)
    assert doc["masked_rows"] == 3 and doc["max_lse_err"] < 1e-6
    assert doc["trace"]["steps"][0]["m"] == "-inf"
    assert doc["trace"]["out"] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("extra", [["--form", "merge"], ["--causal-align", "top-left", "--causal"],
                                   ["--window", "-1,0"], ["--window", "2,1"], ["--scale", "0.25"]])
def test_options_match_the_api(tmp_path, extra):
    q, k, v = qkv(7, 9, 4, dv=3, heads=(2, 2), seed=7, dtype=F32)
    paths = write(tmp_path, q=q, k=k, v=v)
    o_path = tmp_path / "o.npy"
    result = osm("attention", *paths, "--block-q", 3, "--block-k", 4, "--out", o_path, *extra)
    assert result.exit_code == 0, result.stderr
    kw = {"form": "merge"} if extra[0] == "--form" else {}
    if "--causal" in extra:
        kw.update(causal=True, causal_align="top-left")
    if extra[0] == "--window":
        kw["window"] = tuple(int(x) for x in extra[1].split(","))
    if extra[0] == "--scale":
        kw["scale"] = 0.25
    res = attention(q, k, v, block_q=3, block_k=4, **kw)
    np.testing.assert_array_equal(np.load(o_path), res.out)


def test_window_minus_one_zero_is_causal(tmp_path, strict_json):
    q, k, v = qkv(9, 9, 4, seed=10, dtype=F32)
    paths = write(tmp_path, q=q, k=k, v=v)
    tiles = ("--block-q", 2, "--block-k", 2, "--query", 5, "--json")
    a = strict_json(osm("attention", *paths, "--causal", *tiles).stdout)
    b = strict_json(osm("attention", *paths, "--window", "-1,0", *tiles).stdout)
    assert a["trace"]["out"] == b["trace"]["out"]
    # 5 × 5 tiles of 2: the 15 on or below the diagonal are computed, the 10 above skipped
    assert (a["tiles_computed"], a["tiles_skipped"]) == (b["tiles_computed"],
                                                         b["tiles_skipped"]) == (15, 10)
    assert [s["skipped"] for s in a["trace"]["steps"]] == [False] * 3 + [True] * 2


def test_bool_mask_file(tmp_path, strict_json):
    q, k, v = qkv(6, 8, 4, heads=(2, 2), seed=13, dtype=F32)
    keep = np.ones((1, 2, 1, 8), bool)
    keep[..., :4] = False
    paths = write(tmp_path, q=q, k=k, v=v, m=keep)
    doc = strict_json(osm("attention", *paths[:3], "--mask", paths[3], "--block-k", 4,
                          "--json").stdout)
    assert (doc["tiles_computed"], doc["tiles_skipped"]) == (1, 1)
    res = attention(q, k, v, mask=keep, block_k=4)
    assert doc["trace"]["out"] == res.out[0, 0].tolist()


def test_help_and_python_m():
    result = osm("attention", "--help")
    assert result.exit_code == 0 and "Examples" in result.stdout
    proc = subprocess.run([sys.executable, "-m", "osm_cli", "attention", *SAMPLE_FILES,
                           "--no-reference"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "1 computed, 0 skipped of 1" in proc.stdout


# ---------------------------------------------------------------------------------------------
# Bad inputs: exit 1, one "Error:" line


def _bad_arrays():
    q, k, v = qkv(4, 5, 8, dv=3, dtype=F32)
    nan_q, inf_k, inf_v = q.copy(), k.copy(), v.copy()
    nan_q[2, 3], inf_k[0, 0], inf_v[4, 2] = np.nan, np.inf, -np.inf
    return {
        "head dims": ((q, rand(5, 7, dtype=F32), v), "Q and K head dims differ"),
        "kv lengths": ((q, k, rand(6, 3, dtype=F32)), "K and V sequence lengths differ"),
        "gqa heads": ((rand(3, 4, 8, dtype=F32), rand(2, 5, 8, dtype=F32),
                       rand(2, 5, 3, dtype=F32)), "multiple of the kv heads"),
        "batch": ((rand(2, 1, 4, 8, dtype=F32), rand(3, 1, 5, 8, dtype=F32),
                   rand(3, 1, 5, 3, dtype=F32)), "batch sizes differ"),
        "bool": ((q, k > 0, v), "K has dtype bool"),
        "complex": ((q, k, v.astype(np.complex64)), "V has dtype complex64"),
        "object": ((q, k, v.astype(object)), "Python objects"),
        "nan q": ((nan_q, k, v), "Q holds NaN at index (0, 0, 2, 3)"),
        "inf k": ((q, inf_k, v), "K holds inf at index (0, 0, 0, 0)"),
        "-inf v": ((q, k, inf_v), "V holds inf at index (0, 0, 4, 2)"),
        "1-d": ((q[0], k, v), "expected (N, d), (H, N, d) or (B, H, N, d)"),
    }


@pytest.mark.parametrize("case", list(_bad_arrays()))
def test_bad_arrays(tmp_path, case):
    (q, k, v), words = _bad_arrays()[case]
    result = osm("attention", *write(tmp_path, q=q, k=k, v=v))
    assert_one_error_line(result, words=words)


@pytest.mark.parametrize(("args", "words"), [
    (["--window", "3"], "Invalid value for '--window' / '--window-size': the window must be two "
                        "integers LEFT,RIGHT (e.g. 128,0); got '3'"),
    (["--window", "a,b"], "got 'a,b'"),
    (["--window", "1,2,3"], "got '1,2,3'"),
    (["--window", "3.5,0"], "got '3.5,0'"),
    (["--window", ""], "the window must be two integers"),
    (["--window", "-5,0"], "window sides are a number of keys (≥ 0), or -1 for unbounded; got "
                           "-5,0"),
])
def test_bad_window_is_a_bad_option_value(args, words):
    """A --window that is no pair of sides is a bad option value (exit 2), for every command
    that takes it, before any file is read."""
    for command in (["attention", *SAMPLE_FILES], ["check", "missing.npz"],
                    ["backward", "--random", "1,1,4,2"], ["sweep", *SAMPLE_FILES]):
        result = osm(*command, *args)
        assert (result.exit_code, result.stdout) == (2, ""), result.stderr
        assert result.stderr.startswith(f"Usage: osm {command[0]} [OPTIONS]")
        last = result.stderr.rstrip().splitlines()[-1]
        assert last.startswith("Error: ") and words in last, last
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--head", "2"], "traced row (batch 0, head 2, query 0) is outside Q's (B, H, t) = (1, 2, 8)"),
    (["--query", "8"], "traced row (batch 0, head 0, query 8) is outside"),
    (["--batch", "1"], "traced row (batch 1, head 0, query 0) is outside"),
])
def test_bad_options(args, words):
    assert_one_error_line(osm("attention", *SAMPLE_FILES, *args), words=words)


@pytest.mark.parametrize(("mask", "words"), [
    (np.ones((8, 9), bool), "mask of shape (8, 9) does not broadcast to (B, H, t, s)"),
    (np.ones((3, 8, 8), bool), "does not broadcast"),
    (np.ones((8, 8), np.int64), "a mask is boolean (True = attend) or float (added)"),
    (np.full((8, 8), np.nan), "holds NaN"),
    (np.ones((8, 8), np.complex128), "complex"),
])
def test_bad_masks(tmp_path, mask, words):
    (path,) = write(tmp_path, m=mask)
    assert_one_error_line(osm("attention", *SAMPLE_FILES, "--mask", path), words=words)


def test_bad_files(tmp_path):
    np.savez(tmp_path / "other.npz", a=np.zeros(3), q=np.zeros((2, 2)))
    (tmp_path / "text.npy").write_text("not an array")
    cases = [
        (["samples/q.npy", "missing.npy", "samples/v.npy"], "missing.npy: no such file"),
        (["missing.npz"], "missing.npz: no such file"),
        ([tmp_path / "other.npz"], "has no array 'k'"),
        (["samples/q.npy", "samples/k.npy"], "got 2 files"),
        (["samples/q.npy"], "give Q K V as three .npy files, or one .npz with q, k, v"),
        (["samples/q.npy", "samples/k.npy", tmp_path / "text.npy"], "text.npy: "),
        ([*SAMPLE_FILES, "--mask", "missing.npy"], "missing.npy: no such file"),
        ([tmp_path], "is a directory"),
    ]
    for args, words in cases:
        assert_one_error_line(osm("attention", *args), words=words)


@pytest.mark.parametrize("args", [["--block-q", "0"], ["--block-k", "0"], ["--block-q", "-4"],
                                  ["--head", "-1"], ["--masked-lse", "nan"],
                                  ["--layout", "bshd"]])
def test_bad_option_values_exit_2(args):
    result = osm("attention", *SAMPLE_FILES, *args)
    assert result.exit_code == 2, result.stdout
    assert f"Invalid value for '{args[0]}'" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_no_files_is_a_usage_error():
    result = osm("attention")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("Usage: osm attention [OPTIONS] [files]...")
    assert result.stderr.rstrip().endswith(
        "Error: Invalid value for FILES: give Q K V as files (or one .npz), or --random B,H,N,d")
    assert "Traceback" not in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# Bugs found while writing these tests, now fixed: each test guards its fix


def test_no_keys_with_reference(tmp_path):
    paths = write(tmp_path, q=rand(4, 8, dtype=F32), k=np.zeros((0, 8), np.float32),
                  v=np.zeros((0, 3), np.float32))
    result = osm("attention", *paths)
    assert result.exit_code == 0, result.stderr
    assert "4 (output 0, LSE neg-inf)" in result.stdout


def test_zero_head_dim_is_not_an_internal_error(tmp_path):
    paths = write(tmp_path, q=np.zeros((4, 0), np.float32), k=np.zeros((6, 0), np.float32),
                  v=rand(6, 3, dtype=F32))
    assert_one_error_line(osm("attention", *paths), words="head dim d = 0")


def test_plus_inf_mask_is_refused(tmp_path):
    mask = np.zeros((8, 8))
    mask[0, 1] = np.inf
    (path,) = write(tmp_path, m=mask)
    # numpy's RuntimeWarnings stay warnings here (pytest makes them errors), so the test sees
    # what a user sees: the command's own exit code and stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = osm("attention", *SAMPLE_FILES, "--mask", path)
    assert_one_error_line(result, words="inf")


def test_lazy_and_reordered_run_is_compared_with_forward_eager():
    result = osm("attention", "samples/qkv.npz", "--rescale-threshold", "1", "--block-k", "2",
                 "--order", "reverse", "--query", "3")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert ("K/V tiles reverse, lazy rescale τ = 1 (natural log): 3 rescales, 19 forward and "
            "eager (16 saved)") in out
    assert "O vs the forward, eager run: max |difference| = 2.38e-07" in out
    # the traced row: tiles visited 3, 2, 1, 0; the last three pass m without moving it
    rows = [line.split() for line in out.splitlines() if " skip " in line]
    assert [r[0] for r in rows] == ["2", "1", "0"]


def test_naive_precision_run_is_one_shot_in_table_and_json(strict_json):
    result = osm("attention", "samples/qkv.npz", "--dtype", "fp16", "--precision", "naive")
    assert result.exit_code == 0, result.stderr
    assert "tiles                   none: plain attention computes all scores at once" in (
        result.stdout)
    assert "rescales" not in result.stdout.split("precision")[0]
    result = osm("attention", "samples/qkv.npz", "--dtype", "fp16", "--precision", "naive",
                 "--json")
    assert result.exit_code == 0, result.stderr
    doc = strict_json(result.stdout)
    assert (doc["mask"], doc["tiles_total"], doc["tiles_computed"]) == ("none", 0, 0)


@pytest.mark.parametrize("option", [("--order", "reverse"), ("--order", "shuffle"),
                                    ("--rescale-threshold", "0.5")])
def test_naive_precision_refuses_tile_options(option):
    """Plain attention has no K/V tiles to reorder or rescale lazily: refused like --splits,
    not run and reported as 0 difference from itself."""
    result = osm("attention", "samples/qkv.npz", "--dtype", "fp16", "--precision", "naive", *option)
    assert_one_error_line(result, words=f"Error: {option[0]} needs the tiled run; --precision "
                                        "naive is one-shot attention")


def test_naive_precision_traced_row_out_of_range():
    result = osm("attention", "samples/qkv.npz", "--dtype", "fp16", "--precision", "naive",
                 "--query", "100")
    assert_one_error_line(result)
    assert result.stderr == ("Error: traced row (batch 0, head 0, query 100) is outside Q's "
                             "(B, H, t) = (1, 2, 8)\n")
