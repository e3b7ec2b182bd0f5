"""--kernel on the command line (issue 12): each command with each preset on the samples, the
defaults that follow --dtype, the summary's kernel line, JSON keys, FP8 descales, and bad input
as one line (an unknown kernel: exit 2 listing the presets; an option a preset does not take:
exit 1, one Error line naming both)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import osm
from osm_cli.cli.options import Mma

QKV = ["samples/q.npy", "samples/k.npy", "samples/v.npy"]
PRESET_NAMES = ("fa2", "fa4", "fa4-sm100")


def error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


def test_mma_choices_are_gpu_ops():
    from osm_cli.precision.gpu_ops import MMAS

    assert [m.value for m in Mma] == list(MMAS) == ["tensor-core", "blas"]


@pytest.mark.parametrize("dtype, kernel", [("bf16", "fa2"), ("fp16", "fa2"),
                                           ("e4m3", "fa4-sm100"), ("fp32", "tiles")])
def test_default_kernel_follows_dtype(dtype, kernel):
    r = osm("attention", *QKV, "--dtype", dtype, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kernel"] == kernel  # a preset's matmuls are its tensor cores' unless --mma blas
    assert doc["mma"] == ("blas" if kernel == "tiles" else "tensor-core")
    assert doc["masked_lse"] == ("pos-inf" if kernel == "fa2" else "neg-inf")


def test_plain_run_keeps_todays_summary():
    r = osm("attention", *QKV)
    assert r.exit_code == 0 and "kernel" not in r.stdout
    assert json.loads(osm("attention", *QKV, "--json").stdout)["kernel"] == "tiles"


@pytest.mark.parametrize("kernel", [*PRESET_NAMES, "tiles"])
@pytest.mark.parametrize("width", [80, 100])
def test_attention_each_kernel(kernel, width):
    r = osm("attention", *QKV, "--dtype", "bf16", "--kernel", kernel, width=width)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.stdout.split())
    assert f"kernel {kernel}: " in flat
    visits = "first to last" if kernel == "tiles" else "last to first"
    assert f"K/V tiles of 128 visited {visits}" in flat
    assert ("unverified on hardware (modelled from source)" in flat) == (kernel == "fa4-sm100")
    assert all(len(line) <= width for line in r.stdout.splitlines())
    assert "…" not in r.stdout  # no number cut


@pytest.mark.parametrize("mma, matmuls", [
    ([], "tensor cores' truncating accumulation"),
    (["--mma", "tensor-core"], "tensor cores' truncating accumulation"),
    (["--mma", "blas"], "matmuls by BLAS (--mma blas: within an ulp)")])
def test_fa2_kernel_line(mma, matmuls):
    r = osm("attention", *QKV, "--dtype", "bf16", *mma, width=200)
    flat = " ".join(r.stdout.split())
    assert (
        "kernel fa2: FlashAttention-2 forward (PyTorch's flash SDPA backend): K/V tiles of 128 "
        f"visited last to first; exp2 of S·c rounded, minus m·c; O·(1/l); {matmuls} tiles "
        "block_q 128") in flat


def test_trace_in_kernel_order():
    """samples/long.npz causal, block_k 32 given: fa2 visits the tiles last to first."""
    r = osm("attention", "samples/long.npz", "--causal", "--dtype", "bf16",
            "--block-k", "32", "--query", "300", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    tiles = [s["tile"] for s in doc["trace"]["steps"]]
    assert tiles == sorted(tiles, reverse=True) and len(tiles) > 2
    assert doc["block_k"] == 32
    text = osm("attention", "samples/long.npz", "--causal", "--dtype", "bf16",
               "--block-k", "32", "--query", "300", width=80)
    assert "(--block-k, not the kernel's own)" in " ".join(text.stdout.split())
    assert all(len(line) <= 80 for line in text.stdout.splitlines())


def test_unknown_kernel_is_usage_error():
    r = osm("attention", *QKV, "--kernel", "fa3")
    assert r.exit_code == 2
    assert "'fa2', 'fa4', 'fa4-sm100', 'tiles'" in r.output


@pytest.mark.parametrize("args, line", [
    (["--dtype", "bf16", "--order", "shuffle"],
     "Error: --order shuffle needs --kernel tiles; fa2 visits its K/V tiles last to first"),
    (["--dtype", "bf16", "--form", "merge", "--kernel", "fa4"],
     "Error: --form merge needs --kernel tiles; fa4 updates its state in the rescale form"),
    (["--dtype", "bf16", "--splits", "2"],
     "Error: --splits 2 needs --kernel tiles; fa2 chooses its split-KV ranges itself (FA2's "
     "heuristic)"),
    (["--dtype", "e4m3", "--kernel", "fa2"],
     "Error: kernel fa2 takes float16, bfloat16 inputs, not float8_e4m3fn (FP8: --kernel "
     "fa4-sm100); --kernel tiles runs any dtype in osm's own loop"),
    (["--kernel", "fa4"],
     "Error: --kernel fa4 models a kernel of float16 or bfloat16 inputs; give --dtype (e.g. "
     "--dtype bf16), or --kernel tiles for osm's own loop"),
    (["--dtype", "bf16", "--precision", "naive", "--kernel", "fa2"],
     "Error: --kernel fa2 models a tiled kernel; --precision naive is one-shot attention"),
    (["--dtype", "bf16", "--kernel", "tiles", "--mma", "tensor-core"],
     "Error: --mma tensor-core models a kernel preset's matmuls; --kernel tiles is osm's own "
     "loop"),
])
def test_attention_refusals(args, line):
    r = osm("attention", *QKV, *args)
    assert r.exit_code == 1 and r.stdout == ""
    assert error_line(r) == line


def test_tiles_keeps_order_form_splits():
    """--kernel tiles is osm's own loop, so it takes what the presets refuse: the K/V tiles in
    reverse (the traced row's tiles 6:8 first, the baseline names the order), two split-KV
    ranges merged (0:4 and 4:8) and the merge form (its bf16 state rounds otherwise than the
    rescale form's: the traced row's O differs from the same run in the rescale form)."""
    base = ("attention", *QKV, "--dtype", "bf16", "--kernel", "tiles", "--order", "reverse",
            "--splits", "2", "--block-k", "2", "--json")
    merge = json.loads(osm(*base, "--form", "merge", code=0).stdout)
    rescale = json.loads(osm(*base, "--form", "rescale", code=0).stdout)
    assert merge["kernel"] == "tiles" and merge["baseline"]["order"] == "reverse"
    assert [(s["start"], s["stop"]) for s in merge["trace"]["steps"]] == [
        (6, 8), (4, 6), (2, 4), (0, 2)]
    assert [(x["split"], x["start"], x["stop"]) for x in merge["splits"]] == [
        (0, 0, 4), (1, 4, 8)]
    assert merge["trace"]["out"] != rescale["trace"]["out"]
    assert [s["start"] for s in rescale["trace"]["steps"]] == [6, 4, 2, 0]
    text = osm(*base[:-1], "--form", "merge", code=0).stdout
    assert "K/V tiles reverse" in text and "split-KV (Flash-Decoding)" in text


def test_masked_lse_override():
    r = osm("attention", *QKV, "--dtype", "bf16", "--masked-lse", "zero", "--json")
    assert json.loads(r.stdout)["masked_lse"] == "zero"


def test_rescale_threshold_with_preset():
    r = osm("attention", "samples/long.npz", "--dtype", "bf16", "--kernel", "fa4",
            "--rescale-threshold", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["baseline"]["threshold"] == 2.0
    assert doc["baseline"]["rescales"] <= doc["baseline"]["rescales_eager"]


@pytest.mark.parametrize("command", ["attention", "backward", "check", "sweep"])
def test_mma_in_json_is_what_ran(command, tmp_path):
    """Each command's JSON names the matmuls that ran: the default (tensor-core) or --mma blas,
    never null where a model ran; sweep and check say null where none did."""
    files = {"attention": QKV, "backward": [*QKV, "samples/do.npy"],
             "sweep": [*QKV, "--blocks", "4,8"]}
    if command == "check":
        z = np.load("samples/qkv.npz")
        np.savez(tmp_path / "b.npz", q=z["q"], k=z["k"], v=z["v"],
                 out=json_out(z["q"], z["k"], z["v"]))
        files["check"] = [str(tmp_path / "b.npz")]
    for mma, want in (([], "tensor-core"), (["--mma", "blas"], "blas")):
        r = osm(command, *files[command], "--dtype", "bf16", *mma, "--json", code=0)
        assert json.loads(r.stdout)["mma"] == want
    if command in ("sweep", "check"):
        plain = ["--no-model", "--dtype", "bf16"] if command == "check" else []
        r = osm(command, *files[command], *plain, "--json", code=0)
        assert json.loads(r.stdout)["mma"] is None


def json_out(q, k, v):
    """softmax(QKᵀ/√d)·V in float32, rounded to bfloat16 values (a correct kernel's output)."""
    import ml_dtypes

    q, k, v = (np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
               for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    return o.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("kernel, mma, options, arithmetic", [
    ("fa2", [], [], "kernel"), ("fa4", [], [], "kernel"), ("fa2", ["--mma", "blas"], [], "osm"),
    ("fa4-sm100", [], [], "osm"), ("fa2", [], ["--alibi-slopes", "auto"], "osm")])
def test_backward_says_whose_arithmetic_ran(kernel, mma, options, arithmetic):
    """A preset's backward runs its kernel's own arithmetic only with the tensor cores and the
    options it models (precision/backward.py kernel_arithmetic); the summary and the JSON say
    which ran."""
    args = [*QKV, "samples/do.npy", "--dtype", "bf16", "--kernel", kernel, *mma, *options]
    doc = json.loads(osm("backward", *args, "--json", code=0).stdout)
    assert doc["backward_arithmetic"] == arithmetic
    flat = " ".join(osm("backward", *args, width=100, code=0).stdout.split())
    own = "its own arithmetic" if arithmetic == "kernel" else "osm's arithmetic, BLAS matmuls"
    assert f"the backward: {'FA4' if 'fa4' in kernel else 'FA2'}'s, {own}" in flat


# FP8 descales


def descale_files(tmp_path, shape=(1, 2), value=0.5):
    paths = []
    for n in "qkv":
        p = tmp_path / f"{n}_descale.npy"
        np.save(p, np.full(shape, value, dtype=np.float32))
        paths += [f"--{n}-descale", p]
    return paths


def test_descale_runs_fp8(tmp_path):
    r = osm("attention", *QKV, "--dtype", "e4m3", *descale_files(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kernel"] == "fa4-sm100"
    plain = json.loads(osm("attention", *QKV, "--dtype", "e4m3", "--json").stdout)
    assert doc["max_abs_err"] < 0.1 and doc["max_abs_err"] != plain["max_abs_err"]


@pytest.mark.parametrize("args, extra, line", [
    (["--dtype", "e4m3"], dict(shape=(2,)),
     "Error: --q-descale has shape (2,); it must be (B, Hkv) = (1, 2)"),
    (["--dtype", "e4m3"], dict(value=0.0),
     "Error: q_descale holds 0; a descale factor must be positive and a normal float32, from "
     "1.1754944e-38 to 3.4028235e+38"),
    (["--dtype", "bf16"], {},
     "Error: --q-descale, --k-descale and --v-descale scale FP8 inputs; kernel fa2 takes no "
     "FP8 (--kernel fa4-sm100 with --dtype e4m3 or e5m2)"),
    (["--dtype", "bf16", "--kernel", "fa4-sm100"], {},
     "Error: --q-descale, --k-descale and --v-descale scale FP8 inputs; use them with --dtype "
     "e4m3 or e5m2"),
])
def test_descale_errors(tmp_path, args, extra, line):
    r = osm("attention", *QKV, *args, *descale_files(tmp_path, **extra))
    assert r.exit_code == 1
    assert error_line(r) == line


def test_descale_needs_all_three(tmp_path):
    r = osm("attention", *QKV, "--dtype", "e4m3", *descale_files(tmp_path)[:2])
    assert error_line(r) == ("Error: give --q-descale, --k-descale and --v-descale together; "
                             "missing --k-descale, --v-descale")


def test_check_descale(tmp_path):
    """A bf16 kernel output of FP8 inputs with descales: judged, the model beside."""
    from osm_cli.precision.dtypes import DTYPES
    from osm_cli.precision.emulate import Descale
    from osm_cli.precision.kernels import run_flash
    from osm_cli.precision.model import model

    q, k, v = (np.load(p).astype(np.float32) for p in QKV)
    e4 = DTYPES["float8_e4m3fn"]
    q8, k8, v8 = (x.astype(e4).astype(np.float32) for x in (q, k, v))
    d = np.full((1, 2), 0.5, dtype=np.float32)
    res = run_flash(model("e4m3"), q8, k8, v8, kernel="fa4-sm100", trace_at=None,
                    descale=Descale(d, d, d))
    out = tmp_path / "out.npy"
    np.save(out, res.out)
    r = osm("check", out, *QKV, "--dtype", "e4m3", *descale_files(tmp_path), "--json")
    assert r.exit_code in (0, 1) and "Error" not in r.stderr, r.output
    doc = json.loads(r.stdout)
    assert doc["kernel"] == "fa4-sm100"
    assert doc["verdict"]["max_err_vs_fp64"] == pytest.approx(doc["model_max_err_vs_fp64"])


# check, backward, sweep


@pytest.mark.parametrize("bundle, kernel, extra", [
    ("sdpa_flash_bf16_causal", "fa2", ["--causal", "--causal-align", "top-left"]),
    ("sdpa_flash_fp16_noncausal", "fa2", []),
    ("fa4_plain_bf16", "fa4", ["--layout", "bnhd"]),
    ("fa4_causal_bf16", "fa4", ["--layout", "bnhd", "--causal"]),
    ("fa4_plain_bf16", "fa4-sm100", ["--layout", "bnhd"]),
    ("fa4_plain_bf16", "tiles", ["--layout", "bnhd", "--dtype", "bf16"]),
])
def test_check_each_kernel(bundle, kernel, extra):
    r = osm("check", f"samples/kernels/{bundle}.npz", "--kernel", kernel, *extra,
            "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kernel"] == kernel and doc["verdict"]["passed"]
    if kernel in ("fa2", "fa4"):  # the kernel's own model errs as the kernel does
        assert doc["model_max_err_vs_fp64"] == pytest.approx(doc["verdict"]["max_err_vs_fp64"],
                                                             rel=0.05)


def test_check_float32_bundle_note():
    r = osm("check", "samples/kernels/sdpa_flash_bf16_causal.npz", "--causal",
            "--causal-align", "top-left", "--kernel", "fa2")
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == ("note: --kernel fa2 takes 16-bit inputs; OUT, Q, K and V are "
                                "float32 holding bfloat16 values: judged as bfloat16 (--dtype "
                                "chooses)")


def test_check_unknown_kernel_and_fp8_on_fa2():
    r = osm("check", "samples/kernel_fp16.npz", "--causal", "--kernel", "fa9")
    assert r.exit_code == 2 and "'fa2', 'fa4', 'fa4-sm100', 'tiles'" in r.output
    r = osm("check", "samples/kernel_fp16.npz", "--causal", "--kernel", "fa2",
            "--dtype", "e5m2")
    assert r.exit_code == 1
    assert error_line(r).startswith("Error: kernel fa2 takes float16, bfloat16 inputs, not "
                                    "float8_e5m2")


@pytest.mark.parametrize("kernel", [*PRESET_NAMES, "tiles"])
@pytest.mark.parametrize("width", [80, 100])
def test_backward_each_kernel(kernel, width):
    r = osm("backward", *QKV, "samples/do.npy", "--dtype", "bf16", "--kernel", kernel,
            width=width)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.stdout.split())
    assert f"kernel {kernel}: " in flat and "its forward gave O and LSE" in flat
    assert all(len(line) <= width for line in r.stdout.splitlines())
    doc = json.loads(osm("backward", *QKV, "samples/do.npy", "--dtype", "bf16",
                         "--kernel", kernel, "--json").stdout)
    assert doc["kernel"] == kernel and doc["own_forward"]
    assert doc["mma"] == ("blas" if kernel == "tiles" else "tensor-core")


def test_backward_kernel_needs_dtype():
    r = osm("backward", *QKV, "samples/do.npy", "--kernel", "fa2")
    assert r.exit_code == 1 and error_line(r).startswith("Error: --kernel fa2 models a kernel")


@pytest.mark.parametrize("kernel", [*PRESET_NAMES, "tiles"])
def test_sweep_each_kernel(kernel):
    r = osm("sweep", *QKV, "--blocks", "2,4,8", "--dtype", "bf16", "--kernel", kernel,
            "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kernel"] == kernel and doc["dtype"] == "bfloat16"
    text = osm("sweep", *QKV, "--blocks", "2,4,8", "--dtype", "bf16", "--kernel",
               kernel, width=80)
    assert all(len(line) <= 80 for line in text.stdout.splitlines())


def test_sweep_refusals():
    r = osm("sweep", *QKV, "--kernel", "fa4")
    assert error_line(r) == "Error: --kernel fa4 models a 16-bit or FP8 kernel; give --dtype"
    r = osm("sweep", "samples/matrix.txt", "--kernel", "fa2")
    assert error_line(r).startswith("Error: --dtype, --kernel and --mma model a kernel on Q/K/V")


def test_api_kernel():
    from osm_cli import check
    from osm_cli.kernels import PRESETS, run_kernel
    from osm_cli.testing import KERNELS, assert_attention_close

    assert KERNELS == ("fa2", "fa4", "fa4-sm100", "tiles") and set(PRESETS) == set(KERNELS)
    z = np.load("samples/kernels/fa4_plain_bf16.npz")
    q, k, v, o = (z[n] for n in ("q", "k", "v", "out"))
    assert_attention_close(o, q, k, v, dtype="bf16", layout="bnhd", kernel="fa4")
    rep = check(q, k, v, o, dtype="bf16", layout="bnhd", kernel="fa4")
    assert rep.kernel == "fa4" and rep.passed
    res = run_kernel(q, k, v, kernel="fa4", dtype="bf16", layout="bnhd", trace_at=None)
    assert res.options.kernel == "fa4"
    with pytest.raises(ValueError, match="fa4-sm100"):
        assert_attention_close(o, q, k, v, dtype="bf16", kernel="fa3")


def test_default_kernel_takes_the_runs_options():
    """A defaulted kernel never refuses the run's own options: 16-bit with sinks is FA4's (FA2
    has none), a float mask or ALiBi with sinks osm's own loop."""
    from osm_cli.flash.options import ScoreOptions
    from osm_cli.precision.presets import default_kernel

    sinks = np.zeros(2, np.float32)
    assert default_kernel("bfloat16", ScoreOptions()) == "fa2"
    assert default_kernel("bfloat16", ScoreOptions(sinks=sinks)) == "fa4"
    assert default_kernel("float16", ScoreOptions(alibi_slopes=sinks)) == "fa2"
    assert default_kernel("bfloat16", ScoreOptions(alibi_slopes=sinks, sinks=sinks)) == "tiles"
    assert default_kernel("bfloat16", ScoreOptions(mask=np.zeros((2, 2)))) == "tiles"
    assert default_kernel("float8_e4m3fn", ScoreOptions(sinks=sinks)) == "fa4-sm100"
    assert default_kernel("float32", ScoreOptions()) == "tiles"


def test_check_of_a_sink_bundle_models_fa4():
    """FA4's sink capture judged as bf16 without --kernel: the model beside it is fa4's (fa2
    takes no sinks), bit for bit the kernel's error, and the gradients (dsink too) are judged."""
    r = osm("check", "samples/kernels/fa4_sink_bf16.npz", "--layout", "bnhd",
            "--dtype", "bf16", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kernel"] == "fa4"
    assert doc["model_max_err_vs_fp64"] == doc["verdict"]["max_err_vs_fp64"]  # the same bits
    assert doc["model_max_err_vs_fp64"] == pytest.approx(0.0011486410455561757, rel=1e-12)
    assert doc["passed"] is True
    # dQ, dK, dV and the sink's gradient, captured from the kernel beside them
    assert [g["gradient"] for g in doc["gradients"]] == ["dq", "dk", "dv", "dsink"]


def test_check_of_the_combo_bundle_with_its_gradients():
    """sink + softcap + GQA + causal + varlen, out and gradients, with the kernel named: every
    verdict PASS and the model row names fa4."""
    r = osm("check", "samples/kernels/fa4_combo_bf16.npz", "--causal", "--softcap", "30",
            "--kernel", "fa4")
    assert r.exit_code == 0, r.output
    assert "max |O − ref64|, osm's fa4 model   0.0155" in r.stdout
    assert "FAIL" not in r.stdout


FP8 = ["samples/fp8/q.npy", "samples/fp8/k.npy", "samples/fp8/v.npy", "--dtype", "e4m3",
       "--kernel", "fa4-sm100", "--q-descale", "samples/fp8/q_descale.npy", "--k-descale",
       "samples/fp8/k_descale.npy", "--v-descale", "samples/fp8/v_descale.npy"]


@pytest.mark.parametrize("width", [80, 100])
def test_fp8_trace_shows_the_saturating_p(width):
    """flash-attention #2716 as the trace shows it: with a lazy threshold of 8 log2 units
    (5.545 in natural log) m stays at tile 3's max, the largest P of tiles 2, 1, 0 grows to
    2^10, 2^12, 2^14 and 49, 111 and all 128 of the row's P saturate at 448; eagerly (the
    kernel's own τ = 0 for FP8) every tile's largest P is 2^8 and none saturates."""
    r = osm("attention", *FP8, "--rescale-threshold", "5.545", width=width)
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stdout.splitlines() if ln.rstrip().endswith(
        ("256", "1024 (49)", "4096 (111)", "16384 (128)"))]
    assert [ln.split()[0] for ln in lines] == ["3", "2", "1", "0"]
    assert all(len(ln) <= width for ln in r.stdout.splitlines())
    doc = json.loads(osm("attention", *FP8, "--json").stdout)
    assert [(s["p_max"], s["saturated"]) for s in doc["trace"]["steps"]] == [(256.0, 0)] * 4


@pytest.mark.parametrize("command, files", [
    ("attention", QKV), ("backward", [*QKV, "samples/do.npy"]),
    ("check", ["samples/kernel_bf16.safetensors"])])
@pytest.mark.parametrize("scale", ["-1", "0"])
def test_a_preset_refuses_a_scale_not_positive(command, files, scale):
    """A preset takes each row's max of the unscaled S and exp2 of (S − max)·c: with a scale ≤ 0
    its arithmetic is no softmax (it overflowed, two RuntimeWarnings and NaN); one Error line,
    and osm's own tiles still run it."""
    r = osm(command, *files, "--dtype", "bf16", "--scale", scale)
    assert r.exit_code == 1 and "Warning" not in r.stderr and r.stdout == ""
    assert r.stderr.splitlines()[-1] == (
        f"Error: --scale {scale}: kernel fa2 takes each row's max of the unscaled scores and "
        "exp2 of (S − max)·scale·log2 e, finite only for a positive scale; --kernel tiles runs "
        "it")
    r = osm(command, *files, "--dtype", "bf16", "--scale", scale, "--kernel", "tiles")
    assert "Warning" not in r.stderr and "nan" not in r.stdout and "Error" not in r.stderr
    # the captured kernel ran the default scale: judged against another one it FAILs
    assert r.exit_code == (1 if command == "check" else 0)
