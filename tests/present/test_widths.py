"""Every table of every command, printed at 80 and 100 columns (COLUMNS, piped), keeps its
numbers whole (issue 13, item 4): no line is wider than the terminal, no '…' touches a number
(the only '…' left are a list's ", …]" and a range's "a … b"), and the numbers the command's
--json holds are on the screen, each to the digits it shows. The tables give up digits, columns
(O[:3], naive p, the files of merge, the values of a block), the "before →" of m and l, and
split into several tables (overflow-demo's values) to fit; none of that may cut a number.

The inputs are the samples and larger random tensors with wide values (scores up to ±1e5,
Q/K/V of σ = 3 and 30), made here.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from rich.cells import cell_len

from conftest import osm, rand
from osm_cli.studies.overflow import DEMO_DTYPES, overflow_demo

WIDTHS = (80, 100)
NUMBER = re.compile(r"(?<![\w.])-?(?:inf|nan|\d+(?:\.\d*)?(?:e[+-]?\d+)?)(?![\w.])")
CUT = re.compile(r"[\w.+\-]…|…[\w.+\-]")  # '…' against a number's digit, sign or point


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Wide-valued scores and tensors: long rows, masked entries, big magnitudes."""
    d = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(1)
    s = rng.normal(0, 30, (3, 5000))
    s[:, ::7] = -np.inf
    np.save(d / "scores.npy", s)
    np.save(d / "huge.npy", rng.normal(0, 1e5, 2000))
    for name, shape, sigma in (("big", (2, 4, 300, 64), 3.0), ("wide", (1, 2, 100, 128), 30.0)):
        q, k, v = (rng.normal(0, sigma, shape).astype(np.float32) for _ in range(3))
        np.savez(d / f"{name}.npz", q=q, k=k, v=v)
    z = np.load("samples/kernel_bf16.npz")
    np.save(d / "out.npy", z["out"])
    np.save(d / "lse.npy", z["lse"])
    np.savez(d / "qkv.npz", q=z["q"], k=z["k"], v=z["v"])
    return d


def fits(text: str, width: int) -> None:
    """Every line within the width, and no number cut short with '…'."""
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= width
    cut = [line for line in lines if CUT.search(line)]
    assert cut == [], f"cut at {width} columns:\n" + "\n".join(cut)


def _tolerance(token: str) -> Decimal:
    """Half a unit in the last digit the token shows."""
    mantissa, _, exp = token.lower().lstrip("-").partition("e")
    decimals = len(mantissa.partition(".")[2])
    return Decimal(5).scaleb(int(exp or 0) - decimals - 1)


def shown(text: str, value) -> bool:
    """value is on the screen as some number, to the digits that number shows (compared as
    decimals: 1.798e+308, float64's largest rounded up, is no float)."""
    value = float(value)  # strict JSON's "inf", "-inf", "nan" too
    for token in NUMBER.findall(text):
        if token in ("inf", "-inf", "nan"):
            if token == "nan" and math.isnan(value) or float(token) == value:
                return True
            continue
        if math.isfinite(value) and abs(Decimal(token) - Decimal(value)) <= _tolerance(token):
            return True
    return False


def present(text: str, values, what: str) -> None:
    missing = [v for v in values if v is not None and not shown(text, v)]
    assert missing == [], f"{what}: not on the screen: {missing}"


def _visible(steps: list, n_shown: int = 5) -> list:
    """The steps a long table shows: the first and last five."""
    return steps if len(steps) <= 12 else steps[:n_shown] + steps[-n_shown:]


TRACES = [
    ["samples/scores.txt", "-b", "2"],
    ["samples/masked.txt", "-b", "4"],
    ["--values", "1,2,5,3", "-b", "2", "--form", "merge"],
    ["samples/matrix.txt", "--row", "1", "--form", "both"],
    ["{d}/scores.npy", "-b", "512"],
    ["{d}/scores.npy", "-b", "3", "--form", "merge"],
    ["{d}/huge.npy", "-b", "7", "--rescale-threshold", "2.5"],
    ["{d}/huge.npy", "-b", "100", "--order", "shuffle"],
    ["samples/scores.txt", "-b", "2", "--dtype", "bf16"],
    ["{d}/scores.npy", "-b", "512", "--dtype", "fp16"],
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", TRACES, ids=lambda a: " ".join(a))
def test_trace_tables_keep_their_numbers(inputs, width, args):
    args = [a.format(d=inputs) for a in args]
    text = osm("trace", *args, width=width, code=0).stdout
    fits(text, width)
    d = json.loads(osm("trace", *args, "--json", code=0).stdout)
    row = d["row"]
    for key in ("steps", "merge_steps"):
        for s in _visible(d.get(key, [])):
            present(text, [s["m"], s["l"], s.get("block_max"), s.get("block_m"), s.get("block_l"),
                           s.get("block_weight")], f"block {s['block']}")
    final = [d[k][row] if isinstance(d[k], list) else d[k] for k in ("m", "l", "lse")]
    present(text, final, "final m, l, LSE")


ATTENTIONS = [
    ["samples/causal.npz", "--causal", "--head", "1", "--query", "2", "--block-q", "4",
     "--block-k", "2"],
    ["samples/qkv.npz"],
    ["{d}/big.npz", "--causal", "--batch", "1", "--head", "3", "--query", "250"],
    ["{d}/big.npz", "--causal", "--splits", "3", "--order", "shuffle", "--rescale-threshold",
     "3"],
    ["{d}/wide.npz", "--block-k", "16", "--all"],
    ["{d}/wide.npz", "--block-k", "16", "--form", "merge", "--dtype", "bf16",
     "--kernel", "tiles"],
    ["{d}/wide.npz", "--dtype", "fp16", "--precision", "naive"],
    ["samples/long.npz", "--causal", "--block-k", "32", "--query", "300"],
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", ATTENTIONS, ids=lambda a: " ".join(a))
def test_attention_tables_keep_their_numbers(inputs, width, args):
    """The trace's m, l and ‖O‖ (cut to "1.7…" at 80 columns before 0.2) and the summary."""
    args = [a.format(d=inputs) for a in args]
    text = osm("attention", *args, width=width, code=0).stdout
    fits(text, width)
    d = json.loads(osm("attention", *args, "--json", code=0).stdout)
    steps = d["trace"]["steps"]
    for s in steps if "--all" in args else _visible(steps):
        present(text, [s["m"], s["l"], None if s["skipped"] else s["o_norm"],
                       None if s["skipped"] else s["tile_max"]], f"tile {s['tile']}")
    present(text, [d["max_abs_err"], d["max_lse_err"]], "summary")


BACKWARDS = [
    ["samples/q.npy", "samples/k.npy", "samples/v.npy", "samples/do.npy", "--causal",
     "--block-q", "4", "--block-k", "4", "--key", "5", "--query", "6", "--head", "1"],
    ["samples/backward_tiny.npz", "--scale", "1", "--block-k", "1", "--dtype", "bf16"],
    ["{d}/bwd.npz", "--causal", "--block-q", "32", "--block-k", "16", "--query", "90",
     "--key", "20", "--all"],
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", BACKWARDS, ids=lambda a: " ".join(a))
def test_backward_tables_keep_their_numbers(inputs, width, args):
    """Both traces (key row J over the Q tiles, query row I over the K/V tiles)."""
    if "{d}/bwd.npz" in args and not (inputs / "bwd.npz").exists():
        z = np.load(inputs / "wide.npz")
        do = rand(*z["q"].shape, seed=2, dtype=np.float32)
        np.savez(inputs / "bwd.npz", q=z["q"], k=z["k"], v=z["v"], do=do)
    args = [a.format(d=inputs) for a in args]
    text = osm("backward", *args, width=width, code=0).stdout
    fits(text, width)
    d = json.loads(osm("backward", *args, "--json", code=0).stdout)
    for s in d["key_trace"] if "--all" in args else _visible(d["key_trace"]):
        present(text, [s["dk_norm"], s["dv_norm"], *([] if s["masked"] else [s["p_max"]])],
                f"Q tile {s['block']}")
    for s in d["query_trace"] if "--all" in args else _visible(d["query_trace"]):
        present(text, [s["dq_norm"], *([] if s["masked"] else [s["ds_sum"]])],
                f"K/V tile {s['block']}")


OVERFLOWS = [[], ["-inf", "-1", "2", "--dtype", "fp16"],
             ["1000", "2000", "3000", "4000", "--dtype", "e4m3", "--dtype", "e5m2"],
             [str(x) for x in range(1, 13)]]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", OVERFLOWS, ids=lambda a: " ".join(a) or "default")
def test_overflow_demo_keeps_its_numbers(width, args):
    """Many values split the exp and softmax tables in several, each fitting."""
    text = osm("overflow-demo", *args, width=width, code=0).stdout
    fits(text, width)
    xs = [float(a) for a in args if a not in ("--dtype", "fp16", "e4m3", "e5m2")] or None
    dtypes = tuple(a for i, a in enumerate(args) if i and args[i - 1] == "--dtype")
    from osm_cli.precision.names import canonical

    demo = overflow_demo(xs or [100.0, 102.0, 99.0],
                         tuple(canonical(t) for t in dtypes) or DEMO_DTYPES)
    for r in demo.rows:
        present(text, [r.max_finite, r.overflow_at, r.underflow_at, *r.exp], r.dtype)
        if r.fits:
            present(text, [*r.stable, *r.online], r.dtype)


def test_merge_keeps_its_numbers():
    files = [f"samples/partials/{n}.npy" for n in ("o0", "lse0", "o1", "lse1")]
    d = json.loads(osm("merge", *files, "--json", code=0).stdout)
    for width in WIDTHS:
        text = osm("merge", *files, width=width, code=0).stdout
        fits(text, width)
        for s in d["splits"]:
            present(text, [s["row_lse"], s["row_weight"], s["lse_min"], s["lse_max"]],
                       s["o"])
            # the files' names, in the table or above it
            assert Path(s["o"]).name in text and Path(s["lse"]).name in text
        present(text, [d["row_lse"], *d["row_out"]], "merged row")


SWEEPS = [["samples/long.npz", "--blocks", "16,32,64,128,256", "--causal"],
          ["{d}/big.npz", "--blocks", "16,32,64", "--accum", "float32"],
          ["{d}/scores.npy", "--blocks", "16,32,64,128,256,1024,4096"]]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("args", SWEEPS, ids=lambda a: " ".join(a))
def test_sweep_keeps_its_numbers(inputs, width, args):
    """At 80 columns the headers take two lines, not '…' (it was "bl…  ti…")."""
    args = [a.format(d=inputs) for a in args]
    text = osm("sweep", *args, width=width, code=0).stdout
    fits(text, width)
    for b in json.loads(osm("sweep", *args, "--json", code=0).stdout)["blocks"]:
        present(text, [b["block"], b["tiles"], b["rescales"], b["max_abs_error"],
                       b["max_lse_error"]], f"block {b['block']}")


@pytest.mark.parametrize("width", WIDTHS)
def test_cost_fits(width):
    for args in (["-n", "1024", "-d", "64", "--heads", "16", "--batch", "64"],
                 ["-n", "1048576", "-d", "256", "--heads", "128", "--batch", "1024"]):
        text = osm("cost", *args, width=width, code=0).stdout
        fits(text, width)
        d = json.loads(osm("cost", *args, "--json", code=0).stdout)
        assert str(d["block_k"]) in text and str(d["block_q"]) in text


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("corrupt", [False, True])
def test_check_keeps_its_numbers(inputs, width, corrupt):
    out = inputs / "out.npy"
    if corrupt:
        o = np.load(out)
        o[0, 1, 7] *= 1.05
        out = inputs / "bad.npy"
        np.save(out, o)
    args = [out, inputs / "qkv.npz", "--dtype", "bf16", "--lse", inputs / "lse.npy", "--causal",
            "--top", "8"]
    r = osm("check", *args, width=width)
    assert r.exit_code == int(corrupt), r.output
    fits(r.stdout, width)
    d = json.loads(osm("check", *map(str, args), "--json").stdout)
    v = d["verdict"]
    present(r.stdout, [v["out"]["max_err"], v["out"]["bound"], v["max_err_vs_fp64"]], "verdict")
    for w in d["worst_rows"]:
        present(r.stdout, [w["err"], w["ulps"], w["query"]], f"row {w['query']}")
