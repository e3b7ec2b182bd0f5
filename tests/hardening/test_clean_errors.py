"""Hostile but fair input: every case ends in a clean "Error: …" (or usage error), never a
traceback, and never a half-written output; the numerics never produce NaN from finite input."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import stat
import struct
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import osm_cli
from conftest import osm

TEMP_TAG = ".osm-tmp-"
HUGE = "1000000000000000000000000000000"  # 1e30 keys: past every key there is
QKV3 = ("samples/q.npy", "samples/k.npy", "samples/v.npy")
PARTIALS = tuple(f"samples/partials/{n}.npy" for n in ("o0", "lse0", "o1", "lse1"))


# ---------------------------------------------------------------------------------------------
# files the cases create in tmp_path: name -> writer(path)

Writer = Callable[[Path], None]


def npy(arr: np.ndarray) -> Writer:
    return lambda path: np.save(path, arr)


def raw(data: bytes) -> Writer:
    return lambda path: path.write_bytes(data)


def corrupt_npy(path: Path) -> None:
    """A .npy with a valid magic and version whose header dict is garbage."""
    header = b"{garbage: [( }"
    total = 64 - 10  # the header pads magic (6) + version (2) + length (2) + dict to 64 bytes
    header = header + b" " * (total - len(header) - 1) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)


def npz_member(data: bytes | str) -> Writer:
    """A one-member .npz whose member "x.npy" holds data (text, a pickle) instead of an array."""
    def write(path: Path) -> None:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("x.npy", data)
    return write


BF16 = npy(np.ones((2, 8, 4), dtype=ml_dtypes.bfloat16))  # reads back from .npy as |V2
BF16_VEC = npy(np.ones(4, dtype=ml_dtypes.bfloat16))
PAIR = [("a", "f4"), ("b", "f4")]
STRUCT = npy(np.zeros((2, 8, 4), dtype=PAIR))
STRUCT_VEC = npy(np.zeros(4, dtype=PAIR))
TEXT_NPZ = npz_member("hello")
PICKLE_NPZ = npz_member(pickle.dumps({"a": 1}))
OLD = raw(b"old bytes, not an array")


# ---------------------------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Case:
    """`osm *args` ("{t}" is tmp_path) after writing `files` into tmp_path: exit `code`, and
    `words` in the error (exit 1, 2) or on stderr (exit 0). `absent`: outputs that must not
    exist afterwards. `same_as`: args whose --json document this run's must equal, but for the
    keys `ignore` (the options echoed back)."""

    id: str
    args: tuple[str, ...]
    code: int
    words: tuple[str, ...] = ()
    files: dict[str, Writer] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    same_as: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()


def case(id, args, code, words=(), **kw) -> Case:
    words = (words,) if isinstance(words, str) else tuple(words)
    return Case(id, tuple(args), code, words, **kw)


NOT_NPY = "not a valid .npy/.npz"
NOT_MEMBER = "is not an .npy array"
V2 = ("|V2", "bfloat16")
STRUCT_WORDS = "[('a', '<f4'), ('b', '<f4')]"

NO_KEYS = {"q.npy": npy(np.ones((1, 1, 1, 1), np.float32)),
           "k.npy": npy(np.ones((1, 1, 0, 1), np.float32))}

CASES = [
    # a scale past float32's largest finite value, with no key to make a score of (the fuzzer's
    # example: Q·scale overflowed in the cast before any score was judged)
    case("scale-past-float32-no-keys", ["attention", "{t}/q.npy", "{t}/k.npy", "{t}/k.npy",
                                        "--scale", "3.4028235677973366e+38"], 1,
         ["scale 3.4028236e+38 does not fit in float32"], files=NO_KEYS),
    case("scale-past-float32", ["attention", *QKV3, "--scale", "1e39"], 1,
         ["does not fit in float32"]),
    # sizes
    case("cost-sram-too-large", ["cost", "--sram", "1e400KiB"], 2, "too large"),
    case("sweep-sram-too-large", ["sweep", "--values", "1,2", "--sram", "1e400KiB"], 2,
         "too large"),
    case("cost-sram-one-byte", ["cost", "--sram", "1B"], 1, ["--sram", "--dtype-bytes"]),
    # a garbage .npy header
    *[case(f"corrupt-npy-{name}", args, 1, NOT_NPY, files={"corrupt.npy": corrupt_npy})
      for name, args in [
          ("trace", ["trace", "{t}/corrupt.npy"]),
          ("attention", ["attention", "{t}/corrupt.npy", "samples/k.npy", "samples/v.npy"]),
          ("check", ["check", "{t}/corrupt.npy", "samples/qkv.npz", "--dtype", "fp16"]),
          ("merge", ["merge", "{t}/corrupt.npy", "samples/partials/lse0.npy"]),
      ]],
    # bfloat16 saved by ml_dtypes reads back as |V2; a structured dtype
    case("bf16-attention", ["attention", "{t}/q.npy", "{t}/k.npy", "{t}/v.npy"], 1, V2,
         files={"q.npy": BF16, "k.npy": BF16, "v.npy": BF16}),
    case("bf16-sweep", ["sweep", "{t}/q.npy", "{t}/k.npy", "{t}/v.npy"], 1, V2,
         files={"q.npy": BF16, "k.npy": BF16, "v.npy": BF16}),
    case("bf16-check-out", ["check", "{t}/o.npy", *QKV3], 1, V2, files={"o.npy": BF16}),
    case("bf16-check-qkv", ["check", "samples/q.npy", "{t}/q.npy", "{t}/k.npy", "{t}/v.npy"],
         1, V2, files={"q.npy": BF16, "k.npy": BF16, "v.npy": BF16}),
    case("bf16-trace", ["trace", "{t}/s.npy"], 1, V2, files={"s.npy": BF16_VEC}),
    case("struct-attention", ["attention", "{t}/q.npy", "samples/k.npy", "samples/v.npy"], 1,
         STRUCT_WORDS, files={"q.npy": STRUCT}),
    case("struct-trace", ["trace", "{t}/s.npy"], 1, STRUCT_WORDS, files={"s.npy": STRUCT_VEC}),
    # a one-member .npz whose member is text or a pickle
    *[case(f"{kind}-npz-{name}", args, 1, NOT_MEMBER, files={"bad.npz": writer})
      for kind, writer in [("text", TEXT_NPZ), ("pickle", PICKLE_NPZ)]
      for name, args in [
          ("trace", ["trace", "{t}/bad.npz"]),
          ("merge-o", ["merge", "{t}/bad.npz", "samples/partials/lse0.npy"]),
          ("merge-lse", ["merge", "samples/partials/o0.npy", "{t}/bad.npz"]),
          ("check-out", ["check", "{t}/bad.npz", "samples/qkv.npz"]),
          ("attention-mask", ["attention", "samples/qkv.npz", "--mask", "{t}/bad.npz"]),
      ]],
    # --window
    case("window-past-every-key", ["attention", "samples/qkv.npz", "--window", f"{HUGE},{HUGE}",
                                   "--json"], 0,
         same_as=("attention", "samples/qkv.npz", "--json"), ignore=("window",)),
    case("window-negative", ["attention", "samples/qkv.npz", "--window", "-5,-5"], 2,
         "-1 for unbounded"),
    # --scale
    *[case(f"scale-{label}-{name}", [*args, *option], 2, "finite")
      for label, option in [("nan", ["--scale", "nan"]), ("inf", ["--scale", "inf"]),
                            ("neg-inf", ["--scale=-inf"])]
      for name, args in [
          ("attention", ["attention", "samples/qkv.npz"]),
          ("sweep", ["sweep", *QKV3]),
          ("check", ["check", "samples/q.npy", "samples/qkv.npz"]),
      ]],
    case("scale-zero-attention", ["attention", "samples/qkv.npz", "--scale", "0"], 0,
         "note: --scale 0"),
    # overflow-demo
    case("overflow-demo-plus-inf", ["overflow-demo", "inf"], 1, "+inf"),
    case("overflow-demo-all-masked", ["overflow-demo", "-inf", "-inf"], 0),
    # finite inputs whose scores overflow
    case("scores-overflow-float64",
         ["attention", "{t}/q.npy", "{t}/k.npy", "{t}/v.npy", "--out", "{t}/o.npy",
          "--lse", "{t}/l.npy"], 1, "scores overflow float64",
         files={n: npy(np.full((1, 2, 16, 4), 1e200)) for n in ("q.npy", "k.npy", "v.npy")},
         absent=("o.npy", "l.npy")),
    case("scores-overflow-float32", ["attention", "{t}/q.npy", "{t}/k.npy", "{t}/v.npy"], 1,
         "scores overflow float32",
         files={"q.npy": npy(np.full((16, 4), 1e20, np.float32)),
                "k.npy": npy(np.full((16, 4), 1e20, np.float32)),
                "v.npy": npy(np.ones((16, 4), np.float32))}),
    case("scores-overflow-by-scale",
         ["attention", "{t}/q.npy", "{t}/k.npy", "{t}/v.npy", "--scale", "1e308"], 1,
         "scores overflow float64",
         files={n: npy(np.ones((16, 4))) for n in ("q.npy", "k.npy", "v.npy")}),
    # writes: all or none
    case("attention-lse-missing-folder",
         ["attention", "samples/qkv.npz", "--out", "{t}/o.npy", "--lse", "{t}/missing_dir/l.npy"],
         1, "missing_dir", files={"o.npy": OLD}, absent=("missing_dir",)),
    case("attention-out-lse-same-file",
         ["attention", "samples/qkv.npz", "--out", "{t}/x.npy", "--lse", "{t}/x.npy"], 1,
         "same file", absent=("x.npy",)),
    case("attention-csv-directory", ["attention", "samples/qkv.npz", "--csv", "{t}/adir"], 1,
         "is a directory", files={"adir/keep.txt": raw(b"keep")}),
    case("attention-plot-directory", ["attention", "samples/qkv.npz", "--plot", "{t}/adir"], 1,
         "is a directory", files={"adir/keep.txt": raw(b"keep")}),
    case("merge-lse-missing-folder",
         ["merge", *PARTIALS, "--out", "{t}/o.npy", "--lse", "{t}/missing_dir/l.npy"], 1,
         "missing_dir", absent=("o.npy", "missing_dir")),
    case("trace-csv-missing-folder",
         ["trace", "samples/scores.txt", "--csv", "{t}/missing_dir/s.csv"], 1, "missing_dir",
         absent=("missing_dir",)),
]


def _fill(args, tmp_path):
    return [a.replace("{t}", str(tmp_path)) for a in args]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_hostile_input(tmp_path, c: Case):
    if "--plot" in c.args:
        pytest.importorskip("matplotlib")
    for name, write in c.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    result = osm(*_fill(c.args, tmp_path))

    assert result.exit_code == c.code, (result.exit_code, result.stdout, result.stderr)
    if c.code == 1:
        assert result.stdout == ""
        assert result.stderr.startswith("Error: "), result.stderr
        assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    elif c.code == 2:
        assert result.stdout == ""
        assert result.stderr.startswith("Usage: "), result.stderr
        assert "Error:" in result.stderr
    else:
        assert result.stdout
        assert all(line.startswith("note: ") for line in result.stderr.splitlines())
    for word in c.words:
        assert word in result.stderr, (word, result.stderr)

    # nothing half-written: files present before keep their bytes, no output appeared
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for path, data in before.items():
        assert after.get(path) == data, path
    for name in c.absent:
        assert not (tmp_path / name).exists(), name
    if c.code != 0:
        assert set(after) == set(before), sorted(map(str, set(after) - set(before)))

    if c.same_as is not None:
        other = osm(*_fill(c.same_as, tmp_path))
        assert other.exit_code == 0, other.stderr
        mine, theirs = json.loads(result.stdout), json.loads(other.stdout)
        for key in c.ignore:
            del mine[key], theirs[key]
        assert mine == theirs


def test_window_past_every_key_writes_the_same_arrays(tmp_path):
    for name, window in [("a", []), ("b", ["--window", f"{HUGE},{HUGE}"])]:
        result = osm("attention", "samples/qkv.npz", "--no-reference", *window,
                     "--out", str(tmp_path / f"{name}.npy"),
                     "--lse", str(tmp_path / f"l{name}.npy"))
        assert result.exit_code == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "la.npy"), np.load(tmp_path / "lb.npy"))


# ---------------------------------------------------------------------------------------------
# how outputs are written


@pytest.fixture
def umask():
    """umask(m) sets the process umask for the test; the old one is put back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_output_modes(tmp_path, umask, mask):
    umask(mask)
    new, existing = tmp_path / "new.npy", tmp_path / "existing.npy"
    existing.write_bytes(b"old")
    existing.chmod(0o640)
    for path in (new, existing):
        result = osm("attention", "samples/qkv.npz", "--no-reference", "--out",
                     str(path))
        assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640
    assert np.load(existing).shape == (2, 8, 4)  # replaced, not left as it was


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if TEMP_TAG in p.name)


def test_no_temporary_left_after_success(tmp_path):
    (tmp_path / "o.npy").write_bytes(b"old")  # one replaced, one new
    result = osm("attention", "samples/qkv.npz", "--out", str(tmp_path / "o.npy"),
                 "--lse", str(tmp_path / "l.npy"), "--csv", str(tmp_path / "s.csv"))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.npy", "o.npy", "s.csv"]
    assert _temps(tmp_path) == []


def test_no_temporary_left_after_refused_write(tmp_path):
    (tmp_path / "o.npy").write_bytes(b"old")
    result = osm("attention", "samples/qkv.npz", "--out", str(tmp_path / "o.npy"),
                 "--lse", str(tmp_path / "missing_dir" / "l.npy"))
    assert result.exit_code == 1
    assert (tmp_path / "o.npy").read_bytes() == b"old"
    assert _temps(tmp_path) == []


def test_no_temporary_left_after_failed_rename(tmp_path, monkeypatch):
    """The second file's rename fails (an I/O error): the first is put back, temporaries go."""
    real = os.replace
    renames = []

    def flaky(src, dst, *args, **kw):
        name = os.path.basename(src)
        if TEMP_TAG in name and f"{TEMP_TAG}old-" not in name:  # a new file, not a rollback
            renames.append(dst)
            if len(renames) == 2:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, *args, **kw)

    monkeypatch.setattr(os, "replace", flaky)
    (tmp_path / "o.npy").write_bytes(b"old o")
    (tmp_path / "l.npy").write_bytes(b"old l")
    result = osm("attention", "samples/qkv.npz", "--out", str(tmp_path / "o.npy"),
                 "--lse", str(tmp_path / "l.npy"))
    assert len(renames) == 2
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert "cannot be replaced" in result.stderr
    assert (tmp_path / "o.npy").read_bytes() == b"old o"
    assert (tmp_path / "l.npy").read_bytes() == b"old l"
    assert _temps(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# properties: finite input never gives NaN

SPECIAL = [0.0, -0.0, 1e300, -1e300, 1.5e300, -1.5e300, 1e-300, -1e-300, 5e-324]
finite = st.one_of(st.sampled_from(SPECIAL), st.floats(-4, 4),
                   st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False))


@st.composite
def attention_inputs(draw):
    t, s, d = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    q = draw(hnp.arrays(np.float64, (t, d), elements=finite))
    k = draw(hnp.arrays(np.float64, (s, d), elements=finite))
    v = draw(hnp.arrays(np.float64, (s, d), elements=finite))
    mask = None
    if draw(st.booleans()):
        mask = draw(hnp.arrays(np.bool_, (t, s)))
        for row in draw(st.lists(st.integers(0, t - 1), max_size=t)):
            mask[row] = False  # fully masked rows
    return q, k, v, mask, draw(st.booleans())


@contextlib.contextmanager
def numpy_warnings_raise():
    """numpy's RuntimeWarnings (overflow, invalid value) raised, whatever pytest's filters."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


def _visible(t, s, mask, causal):
    """Which keys each query sees: the user's mask and the bottom-right causal mask."""
    seen = np.ones((t, s), bool) if mask is None else mask.copy()
    if causal:
        seen &= np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
    return seen


@settings(max_examples=40, deadline=None)
@given(attention_inputs())
def test_attention_never_nan(case):
    q, k, v, mask, causal = case
    try:
        with numpy_warnings_raise():
            res = osm_cli.attention(q, k, v, attn_mask=mask, causal=causal)
    except osm_cli.OsmError as exc:
        event("refused")
        assert str(exc)
        return
    event("checked")
    assert not np.isnan(res.out).any()
    assert not np.isnan(res.lse).any()
    assert np.isfinite(res.out).all()
    rows = _visible(q.shape[0], k.shape[0], mask, causal).any(axis=-1)
    assert np.isfinite(res.lse[rows]).all()
    assert (res.lse[~rows] == -np.inf).all()  # fully masked rows: LSE -inf, O 0
    assert (res.out[~rows] == 0).all()


score = st.one_of(finite, st.just(-np.inf))


@settings(max_examples=40, deadline=None)
@given(scores=st.integers(1, 4).flatmap(
           lambda r: st.integers(1, 8).flatmap(
               lambda n: hnp.arrays(np.float64, (r, n), elements=score))),
       block=st.integers(1, 4), form=st.sampled_from(["rescale", "merge"]))
def test_online_softmax_never_nan(scores, block, form):
    with numpy_warnings_raise():
        tr = osm_cli.online_softmax(scores, block=block, form=form)
    p, lse = np.asarray(tr.probabilities), np.asarray(tr.lse)
    assert not np.isnan(p).any()
    assert not np.isnan(lse).any()
    live = np.isfinite(scores).any(axis=-1)
    np.testing.assert_allclose(p[live].sum(axis=-1), 1.0, rtol=1e-12)
    assert np.isfinite(lse[live]).all()
    assert (p[~live] == 0).all() and (lse[~live] == -np.inf).all()


# ---------------------------------------------------------------------------------------------
# cases the properties above found


@pytest.mark.parametrize(("k", "v"), [
    (np.array([[1e308, -1e308]]), np.array([[1.0]])),  # the only key's score is 0
    (np.array([[0.0, 0.0], [1e308, -1e308]]), np.array([[0.0], [1.0]])),  # would drop a key
])
def test_cancelling_products_are_refused(k, v):
    """Terms of q·k that overflow though they cancel (the score is 0) are refused, not run to
    NaN or to a silently dropped key: a kernel's sum would overflow on the way too."""
    with numpy_warnings_raise(), pytest.raises(osm_cli.OsmError,
                                               match=r"scores overflow float64: \|scale\|"):
        osm_cli.attention(np.array([[4.0, 4.0]]), k, v, softmax_scale=1.0)


def test_trace_norm_of_a_huge_output():
    """‖O‖ of the trace is computed without overflow on the way."""
    with numpy_warnings_raise():
        res = osm_cli.attention(np.zeros((1, 1)), np.zeros((1, 1)), np.full((1, 1), 1e300))
    assert res.trace.steps[-1].o_norm == pytest.approx(1e300)
