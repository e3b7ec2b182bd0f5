"""Hostile but fair input, round 2 (issue 19), through the command line: each class of the
issue ends in its documented exit code and one "Error: …" line (or silence, for a broken
pipe), never a traceback, a RuntimeWarning, a clobbered file or device, a NaN written
silently, or a PASS for garbage. docs/inputs.md holds the decisions these tests check."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, no_leftovers, one_error, osm, osm_process, qkv, rand, snapshot

HUGE = "1000000000000000000000000000000"  # 1e30: no C long holds it
QKV = ("samples/q.npy", "samples/k.npy", "samples/v.npy")
DEVICES = [p for p in ("/dev/null", "/dev/full") if Path(p).exists()]


def is_device(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


def stdout_link_intact() -> None:
    """/dev/stdout is still what the system made it: a link (to /proc/self/fd/1) or a device."""
    mode = os.lstat("/dev/stdout").st_mode
    assert stat.S_ISLNK(mode) or stat.S_ISCHR(mode), oct(mode)


# ---------------------------------------------------------------------------------------------
# 1. special files are written in place, never replaced


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flag", ["--out", "--lse"])
def test_attention_output_to_a_device_stays_a_device(device, flag):
    r = osm("attention", *QKV, flag, device, "--no-reference")
    assert is_device(device)
    if device == "/dev/full":
        assert r.exit_code == 1
        assert one_error(r.stderr) == "/dev/full: cannot write (No space left on device)"
    else:
        assert r.exit_code == 0, r.stderr


def test_a_plot_and_a_screen_export_to_dev_null():
    r = osm("trace", "samples/scores.txt", "--svg", "/dev/null")
    assert r.exit_code == 0, r.stderr
    assert is_device("/dev/null")


def test_csv_to_dev_stdout_goes_to_stdout_and_leaves_the_link(tmp_path):
    before = snapshot(tmp_path)
    r = osm_process("trace", "samples/scores.txt", "--csv", "/dev/stdout")
    assert r.returncode == 0, r.stderr
    stdout_link_intact()
    text = r.stdout.decode()
    assert text.startswith("form,step,block,start,stop") or "form,step,block" in text
    assert "\nrescale,0,0,0,2," in text
    assert b"wrote /dev/stdout (step table, CSV)" in r.stderr
    assert snapshot(tmp_path) == before


def test_csv_to_dev_stdout_redirected_to_a_file_appends_to_that_file(tmp_path):
    """A shell's `> file`: osm's table and the CSV both reach the file, nothing is truncated."""
    target = tmp_path / "all.txt"
    with open(target, "wb") as fh:
        r = osm_process("trace", "samples/scores.txt", "--csv", "/dev/stdout", stdout=fh,
                        stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    stdout_link_intact()
    text = target.read_text()
    assert "form,step,block" in text and "final: m = " in text


def test_dev_full_on_a_plot_output():
    r = osm("trace", "samples/scores.txt", "--csv", "/dev/full")
    assert r.exit_code == 1
    assert one_error(r.stderr) == "/dev/full: cannot write (No space left on device)"
    assert is_device("/dev/full") and r.stdout == ""


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = osm("trace", "samples/scores.txt", "--csv", str(fifo))
    reader.join(timeout=30)
    assert r.exit_code == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"form,step,block")
    assert no_leftovers(tmp_path) == []


def test_a_link_to_a_device_writes_the_device(tmp_path):
    link = tmp_path / "sink.npy"
    link.symlink_to("/dev/null")
    r = osm("attention", *QKV, "--out", str(link), "--no-reference")
    assert r.exit_code == 0, r.stderr
    assert os.readlink(link) == "/dev/null" and is_device("/dev/null")


def test_a_link_to_a_regular_file_is_replaced_and_its_target_kept(tmp_path):
    """Today's behaviour for a link to a regular file: the link becomes the new file."""
    target = tmp_path / "target.npy"
    target.write_bytes(b"old")
    link = tmp_path / "o.npy"
    link.symlink_to(target)
    r = osm("attention", *QKV, "--out", str(link), "--no-reference")
    assert r.exit_code == 0, r.stderr
    assert not link.is_symlink() and np.load(link).shape == (2, 8, 4)
    assert target.read_bytes() == b"old"


def test_a_failed_write_to_a_device_leaves_the_regular_files_untouched(tmp_path):
    """--out to a file, --lse to /dev/full: the device fails first, the file is not written."""
    out = tmp_path / "o.npy"
    out.write_bytes(b"old")
    r = osm("attention", *QKV, "--out", str(out), "--lse", "/dev/full",
            "--no-reference")
    assert r.exit_code == 1
    one_error(r.stderr)
    assert out.read_bytes() == b"old" and no_leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 7. streams and encodings


def test_closed_stdout_is_one_error_line():
    r = osm_process("trace", "samples/scores.txt", preexec_fn=lambda: os.close(1),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 1
    assert one_error(r.stderr).startswith("standard output is closed")


def test_closed_stdin_is_one_error_line():
    r = osm_process("trace", "-", preexec_fn=lambda: os.close(0))
    assert r.returncode == 1
    assert one_error(r.stderr).startswith("standard input is closed")


def test_stdin_that_is_not_text():
    r = osm_process("trace", "-", input=b"\xff\xfe\x00 1 2")
    assert r.returncode == 1
    assert one_error(r.stderr) == "standard input is not UTF-8 text"


@pytest.mark.parametrize("extra", [["--json"], []])
def test_a_broken_pipe_ends_silently_with_141(extra, tmp_path):
    scores = tmp_path / "long.txt"
    np.savetxt(scores, np.linspace(-3, 3, 1500)[None])
    with subprocess.Popen([sys.executable, "-m", "osm_cli", "trace", str(scores), "--all",
                           *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=ROOT) as proc:
        proc.stdout.read(100)
        proc.stdout.close()
        stderr = proc.stderr.read()
        assert proc.wait(timeout=120) == 141
    assert stderr == b""


def test_stdout_on_a_full_disk():
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "wb") as full:
        r = osm_process("trace", "samples/scores.txt", stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 1
    assert one_error(r.stderr) == "cannot write to standard output (No space left on device)"
    assert is_device("/dev/full")


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
                                  "PYTHONIOENCODING": None}])
def test_an_ascii_terminal_gets_ascii_spellings(env):
    r = osm_process("trace", "samples/scores.txt", env=env)
    assert r.returncode == 0, r.stderr
    text = r.stdout.decode("ascii")  # every byte ASCII
    assert "alpha = exp(m_old - m), l = l*alpha + sum exp(s - m)" in text
    r = osm_process("trace", "samples/missing−file.txt", env=env)
    assert r.returncode == 1
    if "PYTHONUTF8" in env:  # the name's bytes, undecodable in C, come back as they were
        assert r.stderr == "Error: samples/missing−file.txt: no such file\n".encode()
    else:
        assert one_error(r.stderr) == "samples/missing-file.txt: no such file"


def test_ascii_spelling_of_the_kth_step():
    from osm_cli.cli.streams import ascii_spelled

    assert ascii_spelled("m⁽ᵏ⁾ = max(m⁽ᵏ⁻¹⁾, …), α ≤ 1", "ascii") == (
        "m(k) = max(m(k-^1), ...), alpha <= 1")
    assert ascii_spelled("α", "utf-8") == "α"


# ---------------------------------------------------------------------------------------------
# 8. COLUMNS that is no width


@pytest.mark.parametrize("columns", ["0", "1", "-3", "19", "1000001", HUGE])
def test_columns_that_is_no_width_is_unset(columns, tmp_path):
    r = osm("trace", "samples/missing.txt", env={"COLUMNS": columns})
    assert r.exit_code == 1
    assert one_error(r.stderr) == "samples/missing.txt: no such file"
    csv = tmp_path / "t.csv"
    r = osm("trace", "samples/scores.txt", "--csv", str(csv), env={"COLUMNS": columns})
    assert r.exit_code == 0
    assert f"wrote {csv} (step table, CSV)" in r.stderr
    r = osm("overflow-demo", env={"COLUMNS": columns})
    assert r.stdout == osm("overflow-demo").stdout  # as piped: 100 columns


# ---------------------------------------------------------------------------------------------
# 10. the first round's inputs, again


def test_a_block_longer_than_any_input_is_one_block():
    r = osm("trace", "--values", "1,2,3", "-b", HUGE)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("--values: 3 scores in 1 block of 3\n")


def test_sweep_of_a_block_longer_than_any_input():
    r = osm("sweep", "--values", "1,2,3", "--blocks", f"2,{HUGE}", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [row["block"] for row in doc["blocks"]] == [2, 3]


@pytest.mark.parametrize("lse", [-np.inf, np.inf])
def test_merge_of_empty_partials_writes_no_nan(tmp_path, lse, strict_json):
    files = []
    for n in range(2):
        np.save(tmp_path / f"o{n}.npy", np.ones((3, 4)))
        np.save(tmp_path / f"l{n}.npy", np.full(3, lse))
        files += [str(tmp_path / f"o{n}.npy"), str(tmp_path / f"l{n}.npy")]
    r = osm("merge", *files, "--json")
    assert r.exit_code == 0, r.stderr
    assert "nan" not in r.stdout.lower()
    doc = strict_json(r.stdout)
    split = doc["splits"][0]
    assert split["empty_rows"] == 3 and split["lse_min"] is None
    assert split["weight_mean"] is None


# ---------------------------------------------------------------------------------------------
# 2. check never PASSes against a bound that is not finite


def overflowing_fp16(folder: Path, seed: int = 0) -> list[str]:
    """fp16 Q, K, V whose plain same-dtype attention overflows (Q·K ≈ 1.8e5 > 65504)."""
    rng = np.random.default_rng(seed)
    q = (300 + rng.standard_normal((1, 2, 8, 4))).astype(np.float16)
    k = (300 + 3 * rng.standard_normal((1, 2, 8, 4))).astype(np.float16)
    v = rng.standard_normal((1, 2, 8, 4)).astype(np.float16)
    names = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(folder / f"{name}.npy", x)
        names.append(str(folder / f"{name}.npy"))
    return names


@pytest.mark.parametrize("fill", [0.0, 7.0])
def test_check_fails_garbage_where_plain_attention_overflows(tmp_path, fill, strict_json):
    qkv = overflowing_fp16(tmp_path)
    np.save(tmp_path / "o.npy", np.full((1, 2, 8, 4), fill, dtype=np.float16))
    r = osm("check", str(tmp_path / "o.npy"), *qkv)
    assert r.exit_code == 1
    fail = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(fail) == 1 and fail[0].startswith("FAIL: max|out − ref| = ")
    assert "(model)" in fail[0]
    assert "plain same-dtype attention overflowed (max|pt − ref| = nan), so it is" in (
        " ".join(r.stdout.split()))
    r = osm("check", str(tmp_path / "o.npy"), *qkv, "--json")
    rule = strict_json(r.stdout)["verdict"]["out"]
    assert rule["passed"] is False and rule["baseline_from"] == "model"
    # one key dominates every row: O is that key's V exactly, and PyTorch's FA2 (its exp2 of a
    # rounded S·c minus m·c: the top key gets exp2(0) = 1) reproduces it with no error at all
    assert 0 <= rule["bound"] < 0.01 and rule["max_err"] > 0.5


def test_check_passes_a_faithful_kernel_where_plain_attention_overflows(tmp_path,
                                                                         strict_json):
    qkv = overflowing_fp16(tmp_path, seed=1)
    o, lse = tmp_path / "o.npy", tmp_path / "lse.npy"
    r = osm("attention", *qkv, "--dtype", "fp16", "--out", str(o), "--lse",
            str(lse), "--no-reference")
    assert r.exit_code == 0, r.stderr
    r = osm("check", str(o), *qkv, "--lse", str(lse), "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    doc = strict_json(r.stdout)
    for rule in (doc["verdict"]["out"], doc["verdict"]["lse"]):
        assert rule["passed"] and np.isfinite(rule["bound"]) and rule["max_err"] <= rule["bound"]


def test_a_baseline_that_overflowed_without_a_model_is_the_rounding():
    from osm_cli.precision.rule import _rule

    r = _rule(0.01, float("nan"), 0.001)
    assert (r.bound, r.passed, r.stand_in) == (0.004, False, "rounding")
    r = _rule(0.001, float("inf"), 0.001, model_err=0.002)
    assert (r.bound, r.passed, r.stand_in, r.baseline) == (0.006, True, "model", 0.002)
    assert _rule(0.1, 0.01, float("inf")).bound == 0.02  # a rounding term past the range: 0


def test_check_of_garbage_gradients_where_plain_backward_overflows(tmp_path):
    qkv = overflowing_fp16(tmp_path)
    np.save(tmp_path / "do.npy", rand(1, 2, 8, 4, seed=3, dtype=np.float16))
    np.save(tmp_path / "dq.npy", np.full((1, 2, 8, 4), 7.0, dtype=np.float16))
    o = tmp_path / "o.npy"
    osm("attention", *qkv, "--dtype", "fp16", "--out", str(o), "--no-reference")
    r = osm("check", str(o), *qkv, "--do", str(tmp_path / "do.npy"), "--dq",
            str(tmp_path / "dq.npy"), "--json")
    assert r.exit_code == 1
    grad = json.loads(r.stdout)["gradients"][0]
    assert grad["passed"] is False and np.isfinite(grad["bound"])


# ---------------------------------------------------------------------------------------------
# 3. finite inputs that would overflow inside are refused up front


def kernel_input_cases(folder: Path) -> dict[str, tuple[list, str]]:
    """name -> (osm arguments, what the Error line must say)."""
    np.save(folder / "sinks.npy", np.array([1e39, 0.0]))
    np.save(folder / "alibi.npy", np.array([1e38, -1e38]))
    fp8 = "samples/fp8"
    for name, value in (("tiny", 1e-45), ("huge", 3e38)):
        np.save(folder / f"{name}.npy", np.full((1, 1), value, dtype=np.float32))
    ok = [f"{fp8}/{n}_descale.npy" for n in "qkv"]
    fp8_args = ["attention", f"{fp8}/q.npy", f"{fp8}/k.npy", f"{fp8}/v.npy", "--dtype", "e4m3"]
    np.save(folder / "lse.npy", np.full((2, 8), -1e30))
    return {
        "sinks": ([*("attention", *QKV), "--sinks", folder / "sinks.npy"],
                  "sinks holds 1e+39, past float32's largest 3.4028235e+38"),
        "alibi": ([*("attention", *QKV), "--alibi", folder / "alibi.npy"],
                  "alibi_slopes holds 1e+38: times a distance of up to 8 keys"),
        "softcap": ([*("attention", *QKV), "--softcap", "1e300"],
                    "softcap 1e+300 is past float32's largest"),
        "softcap-tiny": ([*("attention", *QKV), "--softcap", "1e-300"],
                         "softcap 1e-300 is below float32's smallest normal"),
        "scale": ([*("attention", *QKV), "--scale", "1e39"],
                  "the scale 1e+39 does not fit in float32"),
        "descale-tiny": ([*fp8_args, "--q-descale", folder / "tiny.npy", "--k-descale", ok[1],
                          "--v-descale", ok[2]], "q_descale holds 1.4013e-45"),
        "descale-huge": ([*fp8_args, "--q-descale", folder / "huge.npy", "--k-descale",
                          folder / "huge.npy", "--v-descale", ok[2]],
                         "q_descale·k_descale·scale·log2(e) is inf to inf in float32"),
        "lse": (["backward", *QKV, "samples/do.npy", "--o", "samples/v.npy", "--lse",
                 folder / "lse.npy"], "an LSE of -1e+30 is below its row's largest score"),
    }


@pytest.mark.parametrize("case", ["sinks", "alibi", "softcap", "softcap-tiny", "scale",
                                  "descale-tiny", "descale-huge", "lse"])
def test_inputs_that_overflow_inside_are_refused(tmp_path, case):
    args, words = kernel_input_cases(tmp_path)[case]
    out = tmp_path / "out.npy"
    out.write_bytes(b"old")
    before = snapshot(tmp_path)
    flag = "--out" if args[0] == "attention" else "--dq"
    r = osm(*map(str, args), flag, str(out))
    assert r.exit_code == 1, r.stdout
    assert words in one_error(r.stderr)
    assert snapshot(tmp_path) == before


def test_the_refusals_are_the_library_s(tmp_path):
    """Validation once, in the library: the API refuses what the CLI refuses."""
    from osm_cli import InputError
    from osm_cli.flash.options import ScoreOptions
    from osm_cli.precision.descale import Descale

    with pytest.raises(InputError, match="sinks holds 1e"):
        ScoreOptions(sinks=np.array([1e39]))
    with pytest.raises(InputError, match="past float32"):
        ScoreOptions(softcap=1e300)
    with pytest.raises(InputError, match="k_descale holds"):
        Descale(np.ones((1, 1)), np.full((1, 1), 1e-45), np.ones((1, 1)))


# ---------------------------------------------------------------------------------------------
# 4. zero-size dimensions: computed or refused, as docs/inputs.md#zero-size-inputs decides


def zero_file(folder: Path, name: str, shape: tuple) -> str:
    np.save(folder / name, np.zeros(shape, dtype=np.float32))
    return str(folder / name)


NO_ROWS = "Q has no query rows to trace: (B, H, t) = {}; give at least one (or trace_at=None " \
    "for an empty result)"


@pytest.mark.parametrize(("shape", "words"), [
    ((1, 0, 4, 4), "Q has 0 heads and K/V 0; attention needs at least one head"),
    ((0, 2, 4, 4), NO_ROWS.format((0, 2, 4))),
    ((1, 2, 0, 4), NO_ROWS.format((1, 2, 0))),
])
@pytest.mark.parametrize("command", ["attention", "backward", "sweep", "check"])
def test_zero_size_dimensions(tmp_path, shape, words, command):
    x = zero_file(tmp_path, "x.npy", shape)
    args = {"attention": [x, x, x], "sweep": [x, x, x], "backward": [x, x, x, x],
            "check": [x, x, x, x]}[command]
    r = osm(command, *args)
    if command == "sweep" and 0 in shape[:3:2]:  # no rows: the sweep is computed, empty
        assert r.exit_code == 0, r.stderr
        return
    if command == "check" and 0 in shape[:3:2]:
        words = f"OUT is empty {shape}: there is nothing to judge"
    assert r.exit_code == 1
    assert one_error(r.stderr) == words


def test_no_keys_is_every_row_masked(tmp_path, strict_json):
    q = tmp_path / "q.npy"
    np.save(q, np.ones((1, 1, 3, 4)))
    k = zero_file(tmp_path, "k.npy", (1, 1, 0, 4))
    out, lse = tmp_path / "o.npy", tmp_path / "lse.npy"
    r = osm("attention", str(q), k, k, "--out", str(out), "--lse", str(lse))
    assert r.exit_code == 0, r.stderr
    assert np.array_equal(np.load(out), np.zeros((1, 1, 3, 4)))
    assert np.isneginf(np.load(lse)).all()


def test_a_paged_cache_of_empty_pages(tmp_path):
    k = zero_file(tmp_path, "k.npy", (5, 0, 1, 4))
    r = osm("attention", "samples/paged/q.npy", k, k, "--layout", "bnhd",
            "--page-table", "samples/paged/page_table.npy", "--seqused-k",
            "samples/paged/seqused_k.npy")
    assert r.exit_code == 1
    assert one_error(r.stderr) == ("the paged K/V cache has 5 pages of 0 keys; a cache needs at "
                                   "least one page of at least one key")


def test_zero_heads_from_a_safetensors_bundle(tmp_path):
    from safetensors.numpy import save_file

    x = np.zeros((1, 0, 4, 4), dtype=np.float32)
    save_file({"out": x, "q": x, "k": x, "v": x}, str(tmp_path / "b.safetensors"))
    r = osm("check", str(tmp_path / "b.safetensors"))
    assert r.exit_code == 1
    assert one_error(r.stderr) == "Q has 0 heads and K/V 0; attention needs at least one head"


# ---------------------------------------------------------------------------------------------
# 5. malformed .safetensors: every header field validated before any read, for every dtype


def safetensors_bytes(header, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def f8(shape, offsets=None) -> dict:
    entry = {"dtype": "F8_E4M3", "shape": shape}
    if offsets is not None:
        entry["data_offsets"] = offsets
    return entry


MALFORMED = {
    "nested": (b"[" * 50000 + b"]" * 50000, b""),
    "string entry": ({"q": "hello"}, b""),
    "int entry": ({"q": 5}, b""),
    "f8 without offsets": ({"q": f8([2])}, b"\x01\x02"),
    "shape as a string": ({"q": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}},
                          b"\x00" * 8),
    "byte count overflows": ({"q": f8([2**32, 2**32], [0, 0])}, b""),
    "negative offsets": ({"q": f8([2], [-8, -6])}, b"\x01\x02"),
    "overlapping f8": ({"q": f8([2], [0, 2]), "k": f8([2], [1, 3])}, b"\x01\x02\x03"),
    "past the end": ({"q": f8([4], [0, 4])}, b"\x01\x02"),
    "metadata nested": ({"__metadata__": {"a": {"b": 1}}, "q": f8([2], [0, 2])}, b"\x01\x02"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_safetensors(tmp_path, case):
    header, data = MALFORMED[case]
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    r = osm("trace", str(path))
    assert r.exit_code == 1
    assert one_error(r.stderr).startswith(f"{path}: not a valid .safetensors file (")


def test_a_0d_float8_tensor_stays_0d(tmp_path):
    from osm_cli.io.tensorfile import tensor

    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors_bytes({"q": f8([], [0, 1])}, b"\x38"))
    x = tensor(path)
    assert x.shape == () and float(x) == 1.0


# ---------------------------------------------------------------------------------------------
# 6. big-endian inputs: native order, precision kept


def test_big_endian_float64_is_computed_in_float64(tmp_path, strict_json):
    files = []
    for name, x in zip("qkv", qkv(6, 6, 4, heads=(2, 2), b=1, dtype=">f8", seed=4, stream=True),
                       strict=True):
        np.save(tmp_path / f"{name}.npy", x)
        files.append(str(tmp_path / f"{name}.npy"))
    out = tmp_path / "o.npy"
    r = osm("attention", *files, "--json", "--out", str(out))
    assert r.exit_code == 0, r.stderr
    assert strict_json(r.stdout)["max_abs_err"] < 1e-15
    assert np.load(out).dtype == np.float64
    np.save(tmp_path / "obe.npy", np.load(out).astype(">f8"))
    r = osm("check", str(tmp_path / "obe.npy"), *files)
    assert r.exit_code == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# 9. the Python API takes sequences and integers, refuses strings


def test_online_softmax_of_plain_sequences_and_integers():
    from osm_cli import InputError, online_softmax

    want = online_softmax(np.array([1.0, 2.0, 5.0, 3.0]))
    for given in ([1, 2, 5, 3], (1, 2, 5, 3), np.array([1, 2, 5, 3]), [1.0, 2, 5, 3]):
        got = online_softmax(given)
        assert got.lse == want.lse and np.array_equal(got.probabilities, want.probabilities)
    assert online_softmax(np.arange(4)).lse == pytest.approx(3.4401896985611953, abs=1e-15)
    for bad in ("1,2,3", b"123", [True, False], [1 + 2j]):
        with pytest.raises(InputError):
            online_softmax(bad)
