"""A fresh set of hostile inputs at every run (hypothesis), of the kinds issue 19 lists: kernel
inputs of any finite magnitude, zero-size and big-endian tensors, malformed .safetensors
headers, outputs aimed at devices and folders, Python objects for the API, and outputs for
`osm check` from exact to garbage. Whatever comes, each run asserts: 0 tracebacks or internal
errors (one "Error: …" line, or success), 0 NaN or inf written or printed from finite input,
0 clobbered files or devices, 0 false PASS (docs/inputs.md)."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import osm_cli
from conftest import one_error, osm, snapshot

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
NO_COLUMNS = {"COLUMNS": None}  # piped: 100 columns, whatever the shell's COLUMNS
ANY_FINITE = st.floats(allow_nan=False, allow_infinity=False)  # 1e-300 … 1e308, both signs
OLD = b"old bytes"


def clean(result) -> bool:
    """True on success; on failure, asserts one Error line (no traceback, no internal error, no
    warning), exit 1. result: conftest's osm (which refuses a traceback or an internal error)."""
    assert "Warning" not in result.stderr
    if result.exit_code == 0:
        return True
    assert result.exit_code == 1, (result.exit_code, result.stderr)
    one_error(result.stderr)
    return False


def finite_or_masked(path: Path) -> None:
    x = np.load(path)
    assert not np.isnan(x).any() and not np.isposinf(x).any(), x


@st.composite
def tensors(draw, shape):
    """A tensor of `shape` in a float dtype of either byte order, moderate values."""
    dtype = draw(st.sampled_from(["<f4", ">f4", "<f8", ">f8", "<f2", ">f2"]))
    values = hnp.arrays(np.float64, shape, elements=st.floats(-4, 4, width=16))
    return draw(values).astype(dtype)


@st.composite
def qkv_problems(draw):
    """Q, K, V (B, H, t, d) with any dimension possibly 0, and one hostile kernel option."""
    b, h, t, s, d = (draw(st.integers(lo, hi)) for lo, hi in
                     ((0, 2), (0, 2), (0, 4), (0, 4), (0, 3)))
    q, k, v = draw(tensors((b, h, t, d))), draw(tensors((b, h, s, d))), draw(tensors((b, h, s,
                                                                                      d)))
    option = draw(st.sampled_from(["none", "sinks", "alibi", "softcap", "scale"]))
    value = None
    if option in ("sinks", "alibi"):
        value = draw(hnp.arrays(np.float64, (max(h, 1),), elements=ANY_FINITE))
    elif option == "softcap":
        value = draw(st.floats(min_value=0, exclude_min=True, allow_infinity=False))
    elif option == "scale":
        value = draw(ANY_FINITE)
    return q, k, v, option, value


@FUZZ
@given(problem=qkv_problems())
def test_attention_of_hostile_inputs(tmp_path_factory, problem):
    q, k, v, option, value = problem
    folder = tmp_path_factory.mktemp("fuzz")
    files = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(folder / f"{name}.npy", x)
        files.append(folder / f"{name}.npy")
    extra = []
    if option in ("sinks", "alibi"):
        np.save(folder / "x.npy", value)
        extra = [f"--{option}", folder / "x.npy"]
    elif option in ("softcap", "scale"):
        extra = [f"--{option}", repr(value)]
    out, lse = folder / "o.npy", folder / "lse.npy"
    out.write_bytes(OLD)
    before = snapshot(folder)
    ok = clean(osm("attention", *files, *extra, "--out", out, "--lse", lse, env=NO_COLUMNS))
    if ok:
        finite_or_masked(out)
        assert not np.isnan(np.load(lse)).any()
    else:
        assert snapshot(folder) == before  # nothing written, nothing left behind


@FUZZ
@given(scores=hnp.arrays(np.float64, st.integers(1, 12), elements=ANY_FINITE),
       block=st.one_of(st.integers(1, 16), st.integers(10**18, 10**40)),
       option=st.sampled_from([[], ["--softcap"], ["--sink"]]), value=ANY_FINITE)
def test_trace_of_hostile_scores(scores, block, option, value):
    values = ",".join(repr(float(x)) for x in scores)
    args = ["trace", "--values", values, "-b", block, "--json", *option,
            *([repr(abs(value) or 1.0) if option == ["--softcap"] else repr(value)]
              if option else [])]
    result = osm(*args, env=NO_COLUMNS)
    if clean(result):
        doc = json.loads(result.stdout)
        doc.pop("naive", None)  # the textbook formula's NaN once exp overflows: shown on purpose
        assert "nan" not in json.dumps(doc)  # nothing else NaN from finite scores


@st.composite
def safetensors_files(draw) -> bytes:
    """A .safetensors header with fields of any type and any value, and some data bytes."""
    dtypes = st.sampled_from(["F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F64", "I8", "X", 5])
    ints = st.one_of(st.integers(-4, 64), st.integers(2**31, 2**66), st.integers(-(2**66), -1))
    field = st.one_of(ints, st.text(max_size=3), st.lists(ints, max_size=3), st.none())
    entry = st.one_of(
        st.fixed_dictionaries({"dtype": dtypes, "shape": st.one_of(st.lists(ints, max_size=3),
                                                                   field)},
                              optional={"data_offsets": st.one_of(st.lists(ints, min_size=2,
                                                                           max_size=2), field)}),
        field)
    header = draw(st.dictionaries(st.sampled_from(["q", "k", "v", "__metadata__", "x"]), entry,
                                  max_size=3))
    depth = draw(st.integers(0, 3))
    raw = json.dumps(header).encode()
    if depth == 3:
        raw = b"[" * 20000 + b"]" * 20000
    data = draw(st.binary(max_size=80))
    return len(raw).to_bytes(8, "little") + raw + data


@FUZZ
@given(blob=safetensors_files())
def test_safetensors_of_any_header(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("st") / "x.safetensors"
    path.write_bytes(blob)
    for command in (["trace", path], ["attention", path]):
        clean(osm(*command, env=NO_COLUMNS))


TARGETS = ["/dev/null", "/dev/full", "link-to-null", "folder", "missing/o.npy", "regular"]


@FUZZ
@given(target=st.sampled_from(TARGETS), flag=st.sampled_from(["--out", "--lse"]),
       also=st.sampled_from([None, "regular", "/dev/full"]))
def test_outputs_aimed_anywhere(tmp_path_factory, target, flag, also):
    folder = tmp_path_factory.mktemp("out")
    (folder / "folder").mkdir()
    (folder / "link-to-null").symlink_to("/dev/null")
    (folder / "regular").write_bytes(OLD)
    (folder / "other").write_bytes(OLD)

    def where(name):
        return name if name.startswith("/dev/") else folder / name

    args = ["attention", "samples/q.npy", "samples/k.npy", "samples/v.npy", "--no-reference",
            flag, where(target)]
    if also is not None:
        args += ["--lse" if flag == "--out" else "--out",
                 where("other" if also == "regular" else also)]
    before = snapshot(folder)
    ok = clean(osm(*args, env=NO_COLUMNS))
    for dev in ("/dev/null", "/dev/full"):
        assert stat.S_ISCHR(os.stat(dev).st_mode)
    assert os.readlink(folder / "link-to-null") == "/dev/null"
    if not ok:
        assert snapshot(folder) == before
    assert not [p for p in os.listdir(folder) if ".osm-tmp-" in p]


PY_VALUES = st.recursive(
    st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False,
                                                    width=32),
              st.booleans(), st.text(max_size=4), st.none(), st.complex_numbers(max_magnitude=2)),
    lambda inner: st.lists(inner, max_size=4), max_leaves=8)


@FUZZ
@given(value=st.one_of(PY_VALUES, st.text(max_size=8), hnp.arrays(
    st.sampled_from([np.int8, np.int64, np.uint16, np.bool_]), st.integers(1, 5)),
    hnp.arrays(np.float32, st.integers(1, 5), elements=st.floats(-2.0**100, 2.0**100, width=32))))
def test_python_api_takes_numbers_or_refuses(value):
    """Finite numbers in any container numpy reads give finite probabilities; anything else is
    an OsmError (InputError), never numpy's own exception."""
    try:
        t = osm_cli.online_softmax(value)
    except osm_cli.OsmError:
        return
    assert np.isfinite(np.asarray(t.lse)).all() or np.isneginf(np.asarray(t.lse)).any()
    assert not np.isnan(np.asarray(t.probabilities)).any()


# ---------------------------------------------------------------------------------------------
# no false PASS: `osm check` never passes an output further from the float64 reference than a
# finite bound it prints


@st.composite
def judged_outputs(draw):
    """fp16 Q, K, V (their Q·K sometimes past fp16's range) and an output from exact to
    garbage: the reference plus noise of a chosen size, a constant, NaN or inf somewhere."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t, d = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    big = draw(st.sampled_from([1.0, 30.0, 300.0]))
    q = (big + rng.standard_normal((1, 2, t, d))).astype(np.float16)
    k = (big + rng.standard_normal((1, 2, t, d))).astype(np.float16)
    v = rng.standard_normal((1, 2, t, d)).astype(np.float16)
    kind = draw(st.sampled_from(["noise", "constant", "nan", "inf"]))
    size = draw(st.sampled_from([0.0, 1e-4, 1e-3, 1e-2, 1.0]))
    return q, k, v, kind, size, draw(st.floats(-8, 8)), rng


@FUZZ
@given(case=judged_outputs(), causal=st.booleans())
def test_check_never_passes_beyond_its_bound(case, causal):
    from osm_cli.flash.reference import reference

    q, k, v, kind, size, fill, rng = case
    ref64, ref_lse = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               causal=causal)
    out = ref64 + size * rng.standard_normal(ref64.shape)
    if kind == "constant":
        out = np.full(ref64.shape, fill)
    elif kind in ("nan", "inf"):
        out.flat[int(rng.integers(out.size))] = np.nan if kind == "nan" else np.inf
    out = out.astype(np.float16)
    lse = (ref_lse + size * rng.standard_normal(ref_lse.shape)).astype(np.float32)
    rep = osm_cli.check(q, k, v, out, lse=lse, dtype="fp16", causal=causal)
    err64 = float(np.max(np.abs(out.astype(np.float64) - ref64)))
    slack = float(np.max(np.abs(ref64.astype(np.float16).astype(np.float64) - ref64)))
    for rule in (rep.verdict.rule, rep.verdict.lse):
        if rule.passed:
            assert math.isfinite(rule.bound) and rule.err <= rule.bound, rule
    if rep.verdict.rule.passed:
        assert err64 <= rep.verdict.rule.bound + slack
    if kind in ("nan", "inf"):
        assert not rep.passed


@pytest.mark.parametrize("seed", range(3))
def test_check_cli_never_passes_garbage(tmp_path, seed):
    """Through the command line: a constant output of fp16 inputs whose plain attention
    overflows (the issue's case) FAILs with a finite bound, whatever the constant."""
    rng = np.random.default_rng(seed)
    shape = (1, 2, 6, 4)
    for name, x in (("q", 300 + rng.standard_normal(shape)), ("k", 300 + rng.standard_normal(
            shape)), ("v", rng.standard_normal(shape)), ("o", np.full(shape, rng.normal()))):
        np.save(tmp_path / f"{name}.npy", x.astype(np.float16))
    result = osm("check", *(tmp_path / f"{n}.npy" for n in "oqkv"), "--json", env=NO_COLUMNS)
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and doc["verdict"]["passed"] is False
    assert math.isfinite(doc["verdict"]["out"]["bound"])
