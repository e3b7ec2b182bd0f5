"""Kernel engineers' tensors (issue 13, items 7 and 8): .safetensors wherever .npy/.npz are read,
bf16 and fp8 mapped to ml_dtypes, by tensor name; raw 2-byte .npy values (|V2, how ml_dtypes
saves bfloat16) read with --input-dtype and otherwise refused with that advice; and `osm check
BUNDLE`, one file holding out, q, k, v and any of lse, do, dq, dk, dv (the gradients judged
as --dq, --dk, --dv are).

The bf16 kernel is samples/kernel_bf16.npz (PyTorch's FlashAttention-2, causal; its bf16 values
stored as float32), saved here as the bf16 tensors a kernel's test would write.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as stn

from conftest import osm, qkv, rand
from osm_cli.io import load_array, load_bundle, tensor_names

BF16 = np.dtype(ml_dtypes.bfloat16)


def write_safetensors(path, tensors: dict) -> None:
    """The format by hand (8-byte header length, JSON header, raw bytes), as PyTorch writes
    it, for the dtypes the package's numpy writer has no name for (F8_E4M3, F8_E5M2)."""
    names = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
             "float16": "F16", "float32": "F32", "bool": "BOOL"}
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype.name], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture
def kernel(tmp_path):
    """samples/kernel_bf16.npz as a bf16 .safetensors bundle (the LSE stays float32)."""
    z = np.load("samples/kernel_bf16.npz")
    path = tmp_path / "kernel.safetensors"
    stn.save_file({n: z[n] if n == "lse" else z[n].astype(BF16) for n in z.files}, str(path))
    return path


# ---------------------------------------------------------------------------------------------
# reading .safetensors


def test_safetensors_tensors_by_name_in_ml_dtypes(tmp_path, kernel):
    assert sorted(tensor_names(kernel)) == ["k", "lse", "out", "q", "v"]
    assert load_array(kernel, key="q").dtype == BF16
    assert load_array(kernel, key="lse").dtype == np.float32
    b = load_bundle(kernel, need=("out", "q", "k", "v"))
    assert list(b) == ["out", "q", "k", "v", "lse"]
    z = np.load("samples/kernel_bf16.npz")
    assert np.array_equal(b["out"].astype(np.float32), z["out"])  # bf16 values, exactly


def test_float8_safetensors_read_from_the_bytes(tmp_path):
    """safetensors' numpy path has no float8 (it asks numpy for float8_e4m3fn): osm reads the
    header and the bytes itself, memory-mapped."""
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    path = tmp_path / "f8.safetensors"
    write_safetensors(path, {"q": x.astype(ml_dtypes.float8_e4m3fn),
                             "k": x.astype(ml_dtypes.float8_e5m2), "v": x.astype(BF16)})
    q, k, v = (load_array(path, key=n) for n in "qkv")
    assert (q.dtype.name, k.dtype.name, v.dtype.name) == ("float8_e4m3fn", "float8_e5m2",
                                                          "bfloat16")
    assert np.array_equal(q.astype(np.float32), x.astype(ml_dtypes.float8_e4m3fn).astype(
        np.float32))


def test_attention_runs_a_bf16_or_fp8_kernel_in_its_own_dtype(tmp_path, kernel):
    """bf16 (or fp8) Q, K, V can only come from a kernel in that dtype: --dtype defaults to it."""
    r = osm("attention", kernel, "--causal", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["precision"]["dtype"] == "bfloat16" and doc["precision"]["verdict"]["passed"]
    x = rand(2, 16, 8, dtype=ml_dtypes.float8_e4m3fn)
    write_safetensors(tmp_path / "f8.safetensors", {"q": x, "k": x, "v": x})
    r = osm("attention", tmp_path / "f8.safetensors", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["precision"]["dtype"] == "float8_e4m3fn"
    r = osm("attention", kernel, "--causal", "--dtype", "fp32", "--json")
    assert json.loads(r.stdout)["precision"]["dtype"] == "float32"  # unless it says otherwise


def test_every_reader_takes_safetensors(tmp_path):
    """Scores, Q/K/V (three files or one), masks and split-KV partials."""
    rng = np.random.default_rng(3)
    s = rng.normal(0, 2, 10)
    stn.save_file({"s": s}, str(tmp_path / "s.safetensors"))
    r = osm("trace", tmp_path / "s.safetensors", "-b", "4", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["probabilities"] == pytest.approx(
        np.exp(s - s.max()) / np.exp(s - s.max()).sum())
    q, k, v = qkv(8, 8, 4, dtype=np.float32, seed=rng)  # drawn after s
    for n, a in zip("qkv", (q, k, v), strict=True):
        stn.save_file({n: a}, str(tmp_path / f"{n}.safetensors"))
    stn.save_file({"mask": np.tril(np.ones((8, 8), bool))}, str(tmp_path / "m.safetensors"))
    three = [tmp_path / f"{n}.safetensors" for n in "qkv"]
    with_mask = osm("attention", *three, "--mask", tmp_path / "m.safetensors", "--json")
    causal = osm("attention", *three, "--causal", "--json")
    assert with_mask.exit_code == 0, with_mask.output
    assert (json.loads(with_mask.stdout)["trace"]["out"]
            == json.loads(causal.stdout)["trace"]["out"])
    r = osm("sweep", *three, "--blocks", "2,4", "--json")
    assert r.exit_code == 0 and [b["block"] for b in json.loads(r.stdout)["blocks"]] == [2, 4]
    for n in ("o0", "lse0", "o1", "lse1"):
        stn.save_file({n: np.load(f"samples/partials/{n}.npy")}, str(tmp_path / f"{n}.st"))
        (tmp_path / f"{n}.st").rename(tmp_path / f"{n}.safetensors")
    parts = [tmp_path / f"{n}.safetensors" for n in ("o0", "lse0", "o1", "lse1")]
    r = osm("merge", *parts, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["row_lse"] == pytest.approx(np.log(4))


def test_backward_takes_a_safetensors_bundle_and_raw_npy(tmp_path):
    """osm backward's q, k, v, do (and o, lse) by name from one .safetensors, the same numbers
    as from the .npz; and its four .npy files as bf16 |V2 with --input-dtype."""
    z = dict(np.load("samples/backward_tiny.npz"))
    stn.save_file(z, str(tmp_path / "tiny.safetensors"))
    a = osm("backward", "samples/backward_tiny.npz", "--scale", "1", "--json")
    b = osm("backward", tmp_path / "tiny.safetensors", "--scale", "1", "--json")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    assert json.loads(a.stdout)["errors"] == json.loads(b.stdout)["errors"]
    for n, x in zip(("q", "k", "v", "do"), qkv(16, 16, 8, heads=(2, 2), dtype=BF16, do=True,
                                               seed=4, stream=True), strict=True):
        np.save(tmp_path / f"{n}.npy", x)
    files = [tmp_path / f"{n}.npy" for n in ("q", "k", "v", "do")]
    r = osm("backward", *files)
    assert r.exit_code == 1 and "pass --input-dtype bf16" in r.stderr
    r = osm("backward", *files, "--input-dtype", "bf16", "--json")
    assert r.exit_code == 0, r.output


def test_a_broken_safetensors_file_is_one_error_line(tmp_path, kernel):
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    r = osm("attention", tmp_path / "bad.safetensors")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith(f"Error: {tmp_path / 'bad.safetensors'}: not a valid "
                               ".safetensors file") and r.stderr.count("\n") == 1
    stn.save_file({"q": np.zeros((2, 2), np.float32)}, str(tmp_path / "q.safetensors"))
    r = osm("attention", tmp_path / "q.safetensors")
    assert r.exit_code == 1
    assert r.stderr == (f"Error: {tmp_path / 'q.safetensors'}: has no array 'k' (it has q; a "
                        "kernel's tensors are named out, q, k, v, lse, do, dq, dk, dv, dsink; k "
                        "may also be key, k_cache)\n")


# ---------------------------------------------------------------------------------------------
# raw 2-byte .npy values: --input-dtype


@pytest.fixture
def raw_npy(tmp_path):
    """kernel_bf16's out, q, k, v, lse saved by ml_dtypes: the bf16 ones read back as |V2."""
    z = np.load("samples/kernel_bf16.npz")
    for n in z.files:
        np.save(tmp_path / f"{n}.npy", z[n] if n == "lse" else z[n].astype(BF16))
    assert np.load(tmp_path / "q.npy").dtype.str == "|V2"
    return tmp_path


def test_raw_two_byte_values_say_what_to_pass(raw_npy):
    r = osm("attention", *(raw_npy / f"{n}.npy" for n in "qkv"))
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == (
        f"Error: {raw_npy / 'q.npy'}: holds raw 2-byte values (|V2), as ml_dtypes writes "
        "bfloat16 to .npy without its type; pass --input-dtype bf16 (or fp16) to read them as "
        "that, or save the file as .safetensors or float32\n")


def test_input_dtype_reads_them(raw_npy):
    files = [raw_npy / f"{n}.npy" for n in ("out", "q", "k", "v")]
    r = osm("check", *files, "--lse", raw_npy / "lse.npy", "--causal",
               "--input-dtype", "bf16", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verdict"]["dtype"] == "bfloat16"  # OUT's own, as given
    r = osm("attention", *files[1:], "--causal", "--input-dtype", "bf16", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["precision"]["verdict"]["passed"]
    r = osm("sweep", *files[1:], "--causal", "--blocks", "64", "--input-dtype", "bf16")
    assert r.exit_code == 0, r.output
    np.save(raw_npy / "s.npy", np.array([2.0, 4.0, 1.0, 3.0]).astype(BF16))
    r = osm("trace", raw_npy / "s.npy", "--input-dtype", "bf16", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["l"] == pytest.approx(1.5530017928)
    r = osm("attention", *files[1:], "--input-dtype", "e4m3")
    assert r.exit_code == 1
    assert "holds raw 2-byte values (|V2); --input-dtype float8_e4m3fn is 1-byte" in r.stderr
    r = osm("attention", *files[1:], "--input-dtype", "fp7")
    assert r.exit_code == 2  # a bad option value


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_raw_one_byte_values_name_the_float8_formats(tmp_path, fp8):
    """ml_dtypes saves float8_e4m3fn with descr 'V1' and float8_e5m2 with 'f1', which np.load
    cannot even read: both come back as raw 1-byte values."""
    np.save(tmp_path / "s.npy", np.array([0.5, 1.0, 1.5, 2.0], getattr(ml_dtypes, fp8)))
    r = osm("trace", tmp_path / "s.npy")
    assert r.exit_code == 1 and "holds raw 1-byte values (|V1)" in r.stderr
    assert "--input-dtype e4m3 (or e5m2)" in r.stderr
    r = osm("trace", tmp_path / "s.npy", "--input-dtype", fp8, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["m"] == 2.0


# ---------------------------------------------------------------------------------------------
# osm check BUNDLE


@pytest.mark.parametrize("tag", ["fp16", "bf16"])
def test_check_bundle_npz(tag):
    """samples/kernel_*.npz hold out, q, k, v and lse: one argument judges both."""
    r = osm("check", f"samples/kernel_{tag}.npz", "--causal",
               *(["--dtype", "bf16"] if tag == "bf16" else []))  # bf16 stored as float32
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"samples/kernel_{tag}.npz: out: shape (1, 2, 256, 64)")
    assert "LSE rule" in r.stdout


def test_check_bundle_safetensors_in_one_command(kernel):
    """A kernel's bf16 tensors in a .safetensors file to a verdict: no --dtype needed."""
    r = osm("check", kernel, "--causal")
    assert r.exit_code == 0, r.output
    assert "judged as bfloat16" in r.stdout and "LSE rule" in r.stdout
    assert "verdict                            PASS" in r.stdout


def test_check_bundle_fails_a_corrupt_row(tmp_path):
    z = dict(np.load("samples/kernel_fp16.npz"))
    z["out"] = z["out"].copy()
    z["out"][0, 1, 200] *= np.float16(1.05)
    np.savez(tmp_path / "bad.npz", **z)
    r = osm("check", tmp_path / "bad.npz", "--causal")
    assert r.exit_code == 1 and r.stderr.startswith("FAIL: ")
    assert "1 of 512 rows over the bound" in r.stderr


def test_check_out_and_one_qkv_safetensors(tmp_path, kernel):
    z = np.load("samples/kernel_fp16.npz")
    np.save(tmp_path / "o.npy", z["out"])
    stn.save_file({n: z[n] for n in "qkv"}, str(tmp_path / "qkv.safetensors"))
    r = osm("check", tmp_path / "o.npy", tmp_path / "qkv.safetensors", "--causal", code=0)
    # Q, K, V read by name from the one .safetensors: the out of the bundle judged alike
    assert " ".join(r.stdout.split()).startswith(
        f"{tmp_path / 'o.npy'}: shape (1, 2, 256, 64), judged as float16 against the float64 "
        "reference of the float16-rounded Q, K, V")
    assert "verdict                            PASS" in r.stdout
    bundle = osm("check", "samples/kernel_fp16.npz", "--causal", code=0).stdout
    row = [ln.split() for ln in r.stdout.splitlines() if ln.startswith(" out ")]
    assert row == [ln.split() for ln in bundle.splitlines() if ln.startswith(" out ")]
    assert row == [["out", "0.000977", "0.00586", "PASS"]]


def test_check_bundle_errors(tmp_path):
    z = dict(np.load("samples/kernel_fp16.npz"))
    np.savez(tmp_path / "no_out.npz", **{n: z[n] for n in "qkv"})
    r = osm("check", tmp_path / "no_out.npz")
    assert r.exit_code == 1
    assert r.stderr.startswith(f"Error: {tmp_path / 'no_out.npz'}: has no array 'out' (it has "
                               "q, k, v;")
    r = osm("check", "samples/kernel_fp16.npz", "--lse", "samples/partials/lse0.npy")
    assert r.exit_code == 1 and "holds its own lse; --lse gives another" in r.stderr
    r = osm("check", "samples/q.npy")
    assert r.exit_code == 1 and "check takes BUNDLE" in r.stderr
    r = osm("check", "samples/q.npy", "samples/k.npy", "samples/v.npy")
    assert r.exit_code == 1 and "got 3 files" in r.stderr


def test_check_bundle_judges_its_gradients(tmp_path):
    """do, dq, dk, dv in a bundle are judged as --do, --dq, --dk, --dv are: the float64
    gradients cast to fp16 pass; dQ off by 5 % in one row fails, and says which gradient."""
    from osm_cli import attention_reference

    z = dict(np.load("samples/kernel_fp16.npz"))
    do = rand(*z["q"].shape, seed=5, dtype=np.float16)
    grads = attention_reference(z["q"], z["k"], z["v"], dout=do, causal=True).grads
    dq, dk, dv = (g.astype(np.float16) for g in grads)
    np.savez(tmp_path / "fwd_bwd.npz", **z, do=do, dq=dq, dk=dk, dv=dv)
    r = osm("check", tmp_path / "fwd_bwd.npz", "--causal")
    assert r.exit_code == 0, r.output
    assert "dQ rule" in r.stdout and "dV rule" in r.stdout
    dq[0, 1, 9] *= np.float16(1.05)
    stn.save_file({**z, "do": do, "dq": dq, "dk": dk, "dv": dv},
                  str(tmp_path / "fwd_bwd.safetensors"))
    r = osm("check", tmp_path / "fwd_bwd.safetensors", "--causal")
    assert r.exit_code == 1 and r.stderr.startswith("FAIL: ") and "dQ" in r.stderr
    r = osm("check", tmp_path / "fwd_bwd.npz", "--dq", tmp_path / "x.npy")
    assert r.exit_code == 1 and "holds its own dq; --dq gives another" in r.stderr
    np.savez(tmp_path / "bad_grad.npz", **z, do=do, dq=np.zeros(z["q"].shape, complex))
    r = osm("check", tmp_path / "bad_grad.npz", "--causal")
    assert r.exit_code == 1 and "dq: holds complex numbers" in r.stderr
