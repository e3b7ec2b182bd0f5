"""osm check on what a user has (issue 22): a bundle saved from flash_attn_func's outputs
(softmax_lse, S_dmask) judged without renaming, the arrays osm does not use listed on one
"ignored:" line or refused with --strict, the per-tensor verdict lines at 72, 80 and 100
columns, the JSON failures, and assert_attention_close saying which tensor failed.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from conftest import osm, qkv, rand, strict_json
from osm_cli.io import load_backward, load_bundle
from osm_cli.testing import assert_attention_close
from tests.kernels.planted import flash, planted

BF16 = ml_dtypes.bfloat16


def _bundle(path, bug=None, **extra):
    """What a user saves after out, softmax_lse, S_dmask = flash_attn_func(…,
    return_attn_probs=True): FlashAttention's names, float32 copies of the bf16 values."""
    q, k, v = qkv(192, 192, 32, heads=(4, 2), b=1, layout="bnhd", dtype=BF16,
                  seed=1, stream=True)
    out, lse = planted(bug)(q, k, v, causal=True)
    arrays = {"q": q, "k": k, "v": v, "out": out}
    np.savez(path, **{n: x.astype(np.float32) for n, x in arrays.items()},
             softmax_lse=lse, S_dmask=np.zeros((1, 4, 192, 192), np.float32), **extra)
    return path


def test_flash_attn_bundle_needs_no_renaming(tmp_path):
    p = _bundle(tmp_path / "fa.npz")
    r = osm("check", str(p), "--causal", "--layout", "bnhd", "--dtype", "bf16")
    assert r.exit_code == 0, r.output
    assert r.stderr == f"ignored: S_dmask ({p}: osm check does not use it)\n"
    assert "LSE rule" in r.stdout  # the softmax_lse was judged, not dropped


def test_base2_softmax_lse_fails_and_is_named(tmp_path):
    """The bug a bundle without osm's names used to PASS: FlashInfer's base-2 LSE."""
    p = _bundle(tmp_path / "fa.npz", "lse_base2")
    args = ["check", str(p), "--causal", "--layout", "bnhd", "--dtype", "bf16"]
    r = osm(*args)
    assert r.exit_code == 1
    fail = r.stderr.splitlines()[-1]
    assert fail.startswith("FAIL: max|lse − ref| = ")
    assert fail.endswith("probe: the kernel's LSE matches osm's in base 2 (max diff 6.5e-07): "
                         "pass --lse-base 2 if that is its convention")
    r2 = osm(*args, "--lse-base", "2")
    assert r2.exit_code == 0, r2.output


def test_strict_refuses_unused_arrays(tmp_path):
    p = _bundle(tmp_path / "fa.npz", rng_state=np.zeros(2, np.int64))
    before = p.read_bytes()
    r = osm("check", str(p), "--causal", "--layout", "bnhd", "--dtype", "bf16",
            "--strict")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == (f"Error: {p}: holds S_dmask, rng_state, which osm check does not use "
                        "(--strict refuses them)\n")
    assert p.read_bytes() == before


def test_out_qkv_lists_what_qkv_holds_beside_q_k_v(tmp_path):
    """OUT QKV reads only q, k, v from QKV: a softmax_lse saved there (a base-2 one) is not
    judged, so it is listed on the "ignored:" line, or refused with --strict, never dropped
    silently (it was: the check passed with no word)."""
    p = _bundle(tmp_path / "fa.npz", "lse_base2", cu_seqlens_q=np.array([0, 192], np.int32))
    with np.load(p) as z:
        arrays = dict(z)
    out = tmp_path / "out.npy"
    np.save(out, arrays.pop("out"))
    qkv_path = tmp_path / "qkv.npz"
    np.savez(qkv_path, **arrays)
    args = ["check", str(out), str(qkv_path), "--causal", "--layout", "bnhd", "--dtype", "bf16"]
    r = osm(*args)
    assert r.exit_code == 0, r.output
    assert r.stderr == (f"ignored: softmax_lse, S_dmask, cu_seqlens_q ({qkv_path}: OUT QKV reads "
                        "only q, k, v from it)\n")
    r = osm(*args, "--strict")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == (f"Error: {qkv_path}: holds softmax_lse, S_dmask, cu_seqlens_q, which osm "
                        "check does not use (--strict refuses them)\n")
    np.savez(qkv_path, q=arrays["q"], k=arrays["k"], v=arrays["v"])
    assert osm(*args).stderr == ""


def test_a_cut_short_or_foreign_bundle_is_said_so(tmp_path):
    """A BUNDLE cut short (a copy or download interrupted) or not an array file at all is one
    Error line saying so, not "one array; check takes BUNDLE …" (what a lone .npy gets)."""
    whole = _bundle(tmp_path / "fa.npz").read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(whole[: len(whole) // 2])
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not an array file")
    lone = tmp_path / "out.npy"
    np.save(lone, np.zeros(3, np.float32))
    for path, said in ((cut, "not a valid .npz file (a zip archive without its directory: "
                             "truncated?)"),
                       (junk, "not a valid .npy/.npz file (it has no NPY header)"),
                       (lone, "one array; check takes BUNDLE")):
        r = osm("check", str(path))
        assert r.exit_code == 1 and r.stdout == ""
        assert r.stderr.startswith(f"Error: {path}: {said}") and r.stderr.count("\n") == 1


def test_two_names_of_one_tensor_refused(tmp_path):
    q, k, v = qkv(192, 192, 32, heads=(4, 2), b=1, layout="bnhd", dtype=BF16,
                  seed=1, stream=True)
    p = tmp_path / "two.npz"
    np.savez(p, q=q.astype(np.float32), k=k.astype(np.float32), v=v.astype(np.float32),
             out=q.astype(np.float32), lse=np.zeros(3), softmax_lse=np.zeros(3))
    with pytest.raises(Exception, match="holds both 'lse' and 'softmax_lse', two names of lse"):
        load_bundle(p, need=("out", "q", "k", "v"))


def test_pytorch_names(tmp_path):
    """query/key/value, o and dout (SDPA's and FlashAttention's backward names)."""
    q, k, v = qkv(192, 192, 32, heads=(4, 2), b=1, layout="bnhd", dtype=BF16,
                  seed=1, stream=True)
    p = tmp_path / "torch.npz"
    np.savez(p, query=q.astype(np.float32), key=k.astype(np.float32),
             value=v.astype(np.float32), o=q.astype(np.float32), dout=q.astype(np.float32))
    b = load_bundle(p, need=("out", "q", "k", "v"))
    assert sorted(b) == ["do", "k", "out", "q", "v"]
    assert sorted(load_backward([str(p)])) == ["do", "k", "out", "q", "v"]


@pytest.mark.parametrize("width", [72, 80, 100])
def test_verdict_lines_fit(tmp_path, width):
    """Per-tensor verdicts and the tile map, at 72, 80 and 100 columns: every line fits, the
    failing tensor's row says where."""
    q, k, v = qkv(256, 256, 32, heads=(2, 2), b=1, layout="bnhd", dtype=BF16, seed=2)
    out, lse = planted("double_count")(q, k, v)
    p = tmp_path / "dc.npz"
    np.savez(p, q=q.astype(np.float32), k=k.astype(np.float32), v=v.astype(np.float32),
             out=out.astype(np.float32), softmax_lse=lse)
    r = osm("check", str(p), "--layout", "bnhd", "--dtype", "bf16", width=width)
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    text = " ".join(r.stdout.split())
    assert "verdicts (rule fa)" in text
    assert "every other Q tile of 64 rows (tiles 1, 3, …)" in text
    assert "   1 #..." in r.stdout and "   0 ...." in r.stdout
    assert "the first K/V tile of 64 rows explains the error" in text


def test_json_failures(tmp_path):
    p = _bundle(tmp_path / "fa.npz", "scale_1_over_d")
    r = osm("check", str(p), "--causal", "--layout", "bnhd", "--dtype", "bf16",
            "--json")
    assert r.exit_code == 1
    doc = strict_json(r.stdout)
    assert doc["passed"] is False and doc["rule"] == "fa"
    assert [t["tensor"] for t in doc["tensors"]] == ["out", "lse"]
    f = doc["failures"][0]
    assert f["tensor"] == "out" and f["rule"] == "fa" and f["max_error"] > f["bound"]
    assert f["where"]["heads"] == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert f["probe"][0]["option"] == {"name": "softmax_scale", "value": 1 / 32}
    assert f["probe"][0]["message"].startswith("the kernel's output fits the scale 1/d = 0.03125")


def test_assert_names_the_failing_gradient():
    """Only dQ fails: the message opens with dQ, not with the output."""
    q, k, v = qkv(128, 128, 32, heads=(4, 4), b=1, layout="bnhd", dtype=BF16,
                  seed=1, stream=True)
    kern = planted("dq_head")
    out, lse = kern(q, k, v, causal=True)
    dout = rand(*out.shape, seed=3, dtype=BF16)
    dq, dk, dv = kern.osm_backward(q, k, v, out, lse, dout, causal=True)
    with pytest.raises(AssertionError) as info:
        assert_attention_close(out, q, k, v, lse=lse, do=dout, dq=dq, dk=dk, dv=dv,
                               causal=True, layout="bnhd")
    first = str(info.value).splitlines()[0]
    assert first.startswith("dQ fails FlashAttention's rule: max|dq − ref| = ")
    assert "where: 50 of 128 query rows, in every Q tile of 128 rows (1); head 0 of 4" in first
    assert "dQ in head 0 of batch 0 is 1.1× osm's" in first


def test_assert_takes_checks_keywords():
    """softcap, varlen, rule and lse_base reach check: a correct varlen softcapped kernel
    passes; its LSE read in base 2 fails."""
    cu = np.array([0, 50, 128], np.int32)
    q, k, v = qkv(128, 128, 32, heads=(2, 2), layout="bnhd", dtype=BF16, seed=6,
                  stream=True)  # packed (total, H, d)
    out, lse = flash(q, k, v, causal=True, softcap=10.0, cu_seqlens_q=cu, cu_seqlens_k=cu)
    kw = {"causal": True, "softcap": 10.0, "cu_seqlens_q": cu, "cu_seqlens_k": cu}
    assert_attention_close(out, q, k, v, lse=lse, rule="model", **kw)
    with pytest.raises(AssertionError, match="LSE fails"):
        assert_attention_close(out, q, k, v, lse=lse * np.float32(1 / math.log(2) + 0.1),
                               lse_base="2", **kw)


def test_planted_samples_are_the_kernels_output():
    """samples/planted/*.npz (docs/check.md's examples) are what make.py writes from the
    planted kernels: the inputs bit for bit, out and softmax_lse up to the float32 matmul's
    summation order, which numpy's BLAS picks by CPU (OpenBLAS's Haswell and SkylakeX kernels
    differ in a handful of elements): out within one bfloat16 step and no more than 1 element
    in 1000 differing at all, the LSE within 4 float32 ulps."""
    import importlib.util

    import ml_dtypes

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("make", ROOT / "samples/planted/make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    for name, case in make.CASES.items():
        want = make.arrays(*case)
        with np.load(ROOT / "samples/planted" / name) as z:
            assert sorted(z.files) == sorted(want)
            for n, x in want.items():
                got = z[n]
                if n in ("q", "k", "v"):
                    assert np.array_equal(got, x), (name, n)
                    continue
                step = (np.spacing(np.abs(x).astype(ml_dtypes.bfloat16)).astype(np.float32)
                        if n == "out" else 4 * np.spacing(np.abs(x)))
                assert np.all(np.abs(got - x) <= step), (name, n)
                if n == "out":
                    assert np.count_nonzero(got != x) <= x.size // 1000, (name, n)
