"""osm check (and --dtype on attention, trace, overflow-demo): verdicts and exit codes.

Exit 0: the kernel passes FlashAttention's rule. Exit 1: it fails ("FAIL: …" on stderr, the
report on stdout) or the input is bad ("Error: …" on stderr, nothing on stdout). Exit 2: a bad
option value. The kernel outputs are samples/kernel_fp16.npz and kernel_bf16.npz (PyTorch's
FlashAttention-2 on an H200, causal, see tests/precision/test_model.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import osm, qkv
from osm_cli.errors import OsmError
from osm_cli.precision.check import check
from osm_cli.precision.dtypes import DTYPES


def _files(tmp_path, tag="fp16", corrupt=None, lse_shift=0.0):
    """OUT Q K V and LSE of a kernel sample as .npy files; corrupt(o) edits O in place."""
    z = np.load(f"samples/kernel_{tag}.npz")
    o = z["out"].copy()
    if corrupt is not None:
        corrupt(o)
    paths = {}
    for name, arr in (("out", o), ("q", z["q"]), ("k", z["k"]), ("v", z["v"]),
                      ("lse", z["lse"] + np.float32(lse_shift))):
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], arr)
    return paths


def _args(p, *extra):
    return ["check", p["out"], p["q"], p["k"], p["v"], "--lse", p["lse"], "--causal", *extra]


def _scale_row(o):
    o[0, 1, 200] *= o.dtype.type(1.05)  # one row 5 % off


# ---------------------------------------------------------------------------------------------
# The Python API


def test_check_passes_the_real_kernel():
    z = np.load("samples/kernel_fp16.npz")
    rep = check(z["out"], z["q"], z["k"], z["v"], DTYPES["float16"], lse=z["lse"],
                  causal=True, top=3)
    v = rep.verdict
    assert v.passed and rep.rows_over == 0 and rep.total_rows == 512
    assert (v.rule.err, v.rule.pt_err, v.rule.rounding) == (2.0**-10, 2.0**-9, 2.0**-10)
    assert v.rule.bound == 0.005859375
    assert v.err == 0.0008381565434376625
    assert rep.model_err == v.err  # osm's FA2-schedule model errs exactly as the kernel did
    assert v.lse.passed and v.lse.err < 1e-6
    assert len(rep.rows) == 3 and rep.rows[0].ulps <= 1


def test_check_fails_a_corrupted_row_and_names_it():
    z = np.load("samples/kernel_fp16.npz")
    o = z["out"].copy()
    _scale_row(o)
    rep = check(o, z["q"], z["k"], z["v"], DTYPES["float16"], causal=True, with_model=False)
    assert not rep.verdict.passed and rep.rows_over == 1
    worst = rep.rows[0]
    assert (worst.batch, worst.head, worst.query) == (0, 1, 200)
    assert rep.heads[0].head == 1 and rep.heads[0].rows_over == 1
    assert rep.model_err is None


def test_check_accepts_flashattention_lse_layout_for_bnhd():
    z = np.load("samples/kernel_fp16.npz")
    q, k, v, o = (z[n].transpose(0, 2, 1, 3) for n in ("q", "k", "v", "out"))  # (B, N, H, d)
    rep = check(o, q, k, v, DTYPES["float16"], lse=z["lse"], layout="bnhd", causal=True,
                  with_model=False)  # LSE stays (B, H, N), as FlashAttention returns it
    assert rep.verdict.passed and rep.verdict.lse.err < 1e-6


# ---------------------------------------------------------------------------------------------
# The command: exit codes


def test_cli_pass_exit_0(tmp_path):
    r = osm(*_args(_files(tmp_path), "--dtype", "fp16", "--top", "2"))
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    text = " ".join(r.stdout.split())  # the table wraps long lines
    assert "judged as float16" in text
    assert "max|out − ref| = 0.000977 ≤ 2·0.00195 + 2·0.000977 = 0.00586 PASS" in text
    assert "rows over the bound 0 of 512" in text
    assert "worst 2 rows" in r.stdout


def test_cli_fail_exit_1_with_a_verdict_line(tmp_path):
    r = osm(*_args(_files(tmp_path, corrupt=_scale_row)))
    assert r.exit_code == 1
    assert r.stderr.startswith("FAIL: max|out − ref| = ")
    assert "> 2·0.00195 + 2·0.000977 = 0.00586 (float16); 1 of 512 rows over the bound" in r.stderr
    assert "Error" not in r.stderr
    assert "verdict" in r.stdout and "FAIL" in r.stdout


def test_cli_fail_on_lse_alone(tmp_path):
    r = osm(*_args(_files(tmp_path, lse_shift=0.01), "--no-model"))
    assert r.exit_code == 1
    assert r.stderr.startswith("FAIL: max|lse − ref| = 0.01 > 2·0.000401 + 2·2.38e-07 = 0.000803")


def test_cli_bf16_output_saved_as_float32_gets_a_hint(tmp_path):
    """Without --dtype a float32 OUT is judged as float32, and bfloat16 kernels then fail."""
    p = _files(tmp_path, "bf16")
    r = osm(*_args(p, "--no-model"))
    assert r.exit_code == 1
    assert "every value of OUT fits bfloat16: was it a bfloat16 kernel? Judge it with --dtype " \
           "bfloat16" in r.stderr
    assert osm(*_args(p, "--dtype", "bf16", "--no-model")).exit_code == 0


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(out="missing.npy"), "Error: missing.npy: no such file\n"),
    (lambda p: np.save(p["out"], np.zeros((1, 2, 256, 32), np.float16)),
     "Error: OUT has shape (1, 2, 256, 32); attention of Q (1, 2, 256, 64), K (1, 2, 256, 64), "
     "V (1, 2, 256, 64) gives (1, 2, 256, 64)\n"),
    (lambda p: np.save(p["lse"], np.zeros((2, 256), np.float32)),
     "Error: LSE has shape (2, 256); attention of these Q, K, V gives (1, 2, 256)\n"),
    (lambda p: np.save(p["out"], np.zeros((1, 2, 256, 64), np.int32)),
     "has dtype int32; give --dtype"),
])
def test_cli_bad_input_exit_1_with_error(tmp_path, edit, message):
    p = _files(tmp_path)
    edit(p)
    r = osm(*_args(p))
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: ") and message in r.stderr
    assert "FAIL" not in r.stderr and r.stdout == ""


def test_cli_bad_dtype_exit_2(tmp_path):
    r = osm(*_args(_files(tmp_path), "--dtype", "fp7"))
    assert r.exit_code == 2
    assert "unknown dtype 'fp7'" in r.stderr


def test_cli_rule_model_without_the_model(tmp_path):
    """--rule model with --no-model: one Error line naming the two flags (it named a
    --with-model flag that does not exist); the library names its parameters."""
    r = osm(*_args(_files(tmp_path), "--rule", "model", "--no-model"))
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == ("Error: --rule model judges against osm's model of the kernel, which "
                        "--no-model skips: give one of them\n")
    with np.load("samples/kernel_fp16.npz") as z:
        out, q, k, v = (z[n] for n in ("out", "q", "k", "v"))
    with pytest.raises(OsmError, match=r"^`rule` model judges .*, which `with_model` False "
                                       r"skips: give one of them$"):
        check(out, q, k, v, "fp16", rule="model", with_model=False)


def test_cli_json(tmp_path, strict_json):
    r = osm(*_args(_files(tmp_path), "--json", "--top", "1"))
    assert r.exit_code == 0
    doc = strict_json(r.stdout)
    assert doc["verdict"]["passed"] is True and doc["verdict"]["dtype"] == "float16"
    assert doc["verdict"]["out"]["bound"] == 0.005859375
    assert doc["rows"] == 512 and doc["rows_over_bound"] == 0 and len(doc["worst_rows"]) == 1


def test_every_new_command_has_help():
    r = osm("check", "--help")
    assert r.exit_code == 0 and "FlashAttention" in r.stdout and "--dtype" in r.stdout


# ---------------------------------------------------------------------------------------------
# --dtype on attention, trace and overflow-demo


def test_attention_dtype_verdict_json(tmp_path, strict_json):
    z = np.load("samples/kernel_bf16.npz")
    paths = []
    for n in ("q", "k", "v"):
        paths.append(str(tmp_path / f"{n}.npy"))
        np.save(paths[-1], z[n])
    r = osm("attention", *paths, "--causal", "--dtype", "bf16", "--json")
    assert r.exit_code == 0, r.output
    doc = strict_json(r.stdout)["precision"]
    assert (doc["dtype"], doc["precision"], doc["accum"]) == ("bfloat16", "flash", "float32")
    assert [i["changed"] for i in doc["inputs"]] == [0, 0, 0]
    v = doc["verdict"]
    assert v["passed"] is True and v["out"]["passed"] and v["lse"]["passed"]
    assert v["max_err_vs_fp64"] == pytest.approx(0.00713, abs=5e-4)
    assert v["plain_max_err_vs_fp64"] > v["max_err_vs_fp64"]


def test_attention_dtype_text():
    r = osm("attention", "samples/qkv.npz", "--dtype", "fp16", "--causal")
    assert r.exit_code == 0, r.output
    assert "FlashAttention test rule" in r.stdout and "PASS" in r.stdout
    assert "max |O − ref64|, plain float16" in r.stdout


def test_attention_precision_needs_dtype():
    r = osm("attention", "samples/qkv.npz", "--precision", "naive")
    assert r.exit_code == 1 and r.stderr == "Error: --precision and --accum need --dtype\n"


def test_trace_dtype_json(strict_json):
    r = osm("trace", "samples/scores.txt", "-b", "2", "--dtype", "bf16",
            "--precision", "naive", "--json")
    assert r.exit_code == 0, r.output
    doc = strict_json(r.stdout)
    assert doc["dtype"] == "bfloat16" and doc["precision"] == "naive"
    assert [s["l"] for s in doc["steps"]] == [1.1328125, 1.546875]
    assert doc["probabilities"] == [0.087890625, 0.64453125, 0.0322265625, 0.2373046875]


def test_trace_dtype_marks_overflow():
    r = osm("trace", "--values", "2,4,70000", "-b", "2", "--dtype", "fp16")
    assert r.exit_code == 0, r.output
    assert "overflow → inf" in r.stdout and "1 overflowed to inf" in r.stdout


def test_overflow_demo_dtype():
    r = osm("overflow-demo", "--dtype", "e4m3", "--dtype", "fp16")
    assert r.exit_code == 0, r.output
    assert "float8_e4m3fn" in r.stdout and "bfloat16" not in r.stdout
    assert "x as each dtype holds it" in r.stdout


def test_check_with_no_keys_judges_the_all_masked_output():
    """No keys: every row is fully masked, so the right output is 0 (and a 1 is wrong); the
    FA2 schedule runs one empty key range instead of failing."""
    from osm_cli import check

    q = np.ones((4, 8), np.float16)
    k, v = np.zeros((0, 8), np.float16), np.zeros((0, 3), np.float16)
    assert check(q, k, v, np.zeros((4, 3), np.float16), dtype="fp16").verdict.passed
    assert not check(q, k, v, np.ones((4, 3), np.float16), dtype="fp16").verdict.passed


def test_check_float64_error_on_an_all_zero_row_is_quiet():
    """Row 0 sees no key (output 0); an output of 1 there is an error of inf ulps of 0 — said
    without a RuntimeWarning (warnings are errors in this suite)."""
    from osm_cli import check

    q, k, v = np.ones((2, 4)), np.ones((3, 4)), np.ones((3, 2))
    mask = np.array([[False] * 3, [True] * 3])
    rep = check(q, k, v, np.ones((2, 2)), dtype="fp64", attn_mask=mask)
    assert not rep.verdict.passed


# ---------------------------------------------------------------------------------------------
# Gradients (osm check --do --dq --dk --dv)


def _flash_case(dtype="bfloat16", seed=5, shape=(1, 4, 160, 64), **opts):
    """A faithful kernel: osm's flash model of FA2's forward and backward on random inputs."""
    from osm_cli.precision.backward import flash_backward
    from osm_cli.precision.dtypes import DTYPES, round_inputs
    from osm_cli.precision.kernels import run_flash
    from osm_cli.precision.model import model

    b, h, n, d = shape
    m = model(dtype)
    drawn = qkv(n, n, d, heads=(h, h), b=b, dtype=np.float32, seed=seed, stream=True, do=True)
    arrays = dict(zip(("Q", "K", "V", "dO"), drawn, strict=True))
    (q, k, v, do), _ = round_inputs(arrays, DTYPES[dtype])
    f = run_flash(m, q, k, v, trace_at=None, kernel="fa2", **opts)
    b = flash_backward(m, q, k, v, do, f.out, f.lse, trace_at=None, **opts)
    return dict(out=f.out, q=q, k=k, v=v, lse=f.lse, do=do, dq=b.dq, dk=b.dk, dv=b.dv)


def _judge(c, dtype="bfloat16", **kw):
    from osm_cli.precision.check import check

    return check(c["out"], c["q"], c["k"], c["v"], dtype, lse=c["lse"], do=c["do"], dq=c["dq"],
                 dk=c["dk"], dv=c["dv"], **kw)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_faithful_gradients_pass_and_planted_bugs_fail(dtype):
    c = _flash_case(dtype, causal=True)
    rep = _judge(c, dtype, causal=True)
    assert rep.passed and [g.name for g in rep.grads] == ["dq", "dk", "dv"]
    for g in rep.grads:
        assert g.rule.err <= g.rule.bound and g.model_err == pytest.approx(g.err64)
    dq5 = c["dq"].copy()
    dq5[0, 1] *= 5  # one head's dQ five times too large
    bad = _judge({**c, "dq": dq5}, dtype, causal=True)
    assert not bad.passed and bad.worst_grad.name == "dq"
    assert bad.worst_grad.heads[0].head == 1 and bad.worst_grad.heads[0].rows_over > 0
    no_scale = _judge({**c, "dq": c["dq"] / 0.125}, dtype, causal=True)  # dQ without the scale
    assert not no_scale.passed


def test_gradients_need_do_and_the_right_shapes():
    from osm_cli.errors import OsmError

    c = _flash_case(shape=(1, 2, 16, 8))
    with pytest.raises(OsmError, match="needs dO"):
        _judge({**c, "do": None})
    with pytest.raises(OsmError, match="dK has shape"):
        _judge({**c, "dk": c["dk"][..., :4]})


def test_check_cli_judges_gradients(tmp_path, strict_json):
    c = _flash_case(shape=(1, 2, 40, 16))
    paths = {}
    for name, arr in c.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], arr)
    args = ["check", paths["out"], paths["q"], paths["k"], paths["v"], "--dtype", "bf16",
            "--do", paths["do"], "--dq", paths["dq"], "--dk", paths["dk"], "--dv", paths["dv"]]
    ok = osm(*map(str, args), "--json")
    assert ok.exit_code == 0, ok.stderr
    doc = strict_json(ok.stdout)
    assert [g["gradient"] for g in doc["gradients"]] == ["dq", "dk", "dv"] and doc["passed"]
    assert doc["gradients"][0]["rule"].startswith("max|dq - ref| <= 2*max|pt - ref| + 2*")
    dv = c["dv"].copy()
    dv[0, 0, :16] = 0  # one K/V tile's contribution lost: its dV rows zero
    np.save(paths["dv"], dv)
    bad = osm(*args)
    assert bad.exit_code == 1
    assert "FAIL: max|dV − ref|" in bad.stderr and "worst head 0 of batch 0" in bad.stderr
    assert "worst 5 rows of dV (nearest its bound)" in bad.stdout
