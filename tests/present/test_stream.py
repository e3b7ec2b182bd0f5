"""A long trace's --json and --csv (present/stream.py, present/bulk.py): written from step
columns and array pieces through orjson, they must say what the small path (json.dumps, csv)
says, value for value. The long path is forced here on small inputs by lowering the length
above which it is taken, so that both paths can be compared on the same report.

The long path is compact (no spaces) and may spell numbers differently (orjson's 1e-7 for repr's
1e-07), never write different numbers: floats are compared through Decimal(text), the exact
decimal value written.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import osm
from osm_cli.io.behind import Behind
from osm_cli.present import bulk
from osm_cli.present import csv as export
from osm_cli.present import json as documents
from osm_cli.present.json import dumps, trace_doc
from osm_cli.present.stream import step_rows, write_json
from osm_cli.reports.trace import trace_report


def _exact(text: str):
    """JSON text parsed with every float as the Decimal it spells (sign of zero kept)."""
    return json.loads(text, parse_float=Decimal, parse_constant=lambda c: pytest.fail(c))


def streamed(doc) -> str:
    parts: list = []
    write_json(doc, parts.append)
    return b"".join(bytes(p) for p in parts).decode()


@pytest.fixture
def long_path(monkeypatch):
    """Every trace counts as long: its JSON and CSV take the streamed path."""
    monkeypatch.setattr(documents, "STREAM_ABOVE", 0)
    monkeypatch.setattr(bulk, "LONG", 0)


def _reports():
    rng = np.random.default_rng(7)
    vec = rng.standard_normal(1001)
    mat = rng.standard_normal((3, 257)) * 30
    mat[1] = -np.inf  # a fully masked row
    mat[2, ::3] = -np.inf
    big = np.array([1000.0, 2.0, -1e300, 710.0, 0.5, -np.inf, 3.0])  # naive overflows: nan
    tiny = rng.standard_normal(300) * 1e-300
    return {
        "vector": trace_report(vec, 2),
        "vector kept ends": trace_report(vec, 3, keep=5),
        "matrix row 2": trace_report(mat, 4, row=2, keep=5),
        "merge": trace_report(vec, 5, "merge", keep=5),
        "both forms": trace_report(mat, 16, "both", row=0),
        "lazy": trace_report(vec, 4, threshold=1.0),
        "order": trace_report(vec, 7, order="shuffle", seed=3),
        "overflowing naive": trace_report(big, 2, keep=2),
        "tiny": trace_report(tiny, 1, keep=5),
        "bf16": trace_report(vec[:200], 8, dtype="bf16"),
    }


REPORTS = _reports()


@pytest.mark.parametrize("name", list(REPORTS))
def test_streamed_json_says_what_dumps_says(name, monkeypatch, strict_json):
    rep = REPORTS[name]
    small = _exact(dumps(trace_doc(rep), indent=None))
    monkeypatch.setattr(documents, "STREAM_ABOVE", 0)
    text = streamed(trace_doc(rep))
    strict_json(text)  # RFC 8259: no NaN or Infinity literals
    assert "\n" not in text
    assert _exact(text) == small


@pytest.mark.parametrize("shape", [(1, 50), (50,), (3, 20), (40, 3)])
def test_streamed_arrays_in_pieces_of_rows(shape, monkeypatch):
    """Rows longer than a piece (reports.trace.CHUNK) come in parts, and pieces in sub-pieces
    (stream.SUBV): the lists still close where they should."""
    from osm_cli.present import stream
    from osm_cli.reports import trace as reports

    monkeypatch.setattr(reports, "CHUNK", 7)
    monkeypatch.setattr(stream, "SUBV", 3)
    s = np.random.default_rng(3).standard_normal(shape)
    rep = trace_report(s, 4, row=np.atleast_2d(s).shape[0] - 1, keep=2)
    small = _exact(dumps(trace_doc(rep), indent=None))
    monkeypatch.setattr(documents, "STREAM_ABOVE", 0)
    assert _exact(streamed(trace_doc(rep))) == small


@pytest.mark.parametrize("name", ["vector kept ends", "matrix row 2", "both forms", "lazy",
                                  "merge"])
def test_streamed_csv_says_what_csv_says(name, monkeypatch):
    rep = REPORTS[name]
    small = "".join(export.trace_csv_chunks(rep))
    monkeypatch.setattr(bulk, "LONG", 0)
    big = b"".join(bytes(p) for p in export.trace_csv_chunks(rep)).decode()

    def cells(text):
        return [[Decimal(c) if c[:1].isdigit() or c[:1] == "-" and c != "-inf" else c
                 for c in row] for row in csv.reader(io.StringIO(text))]

    assert cells(big) == cells(small)


def test_step_rows_are_step_docs():
    """One chunk of step columns as text is the list of step_doc dicts of its records."""
    rep = REPORTS["both forms"]
    for t, lazy in ((0, False), (1, False)):
        cols = next(rep.iter_columns(t))
        rows, close = step_rows(cols, lazy)
        text = "[" + (bytes(rows) + close)[1:].decode() + "]"
        want = [documents.step_doc(cols.step(i), lazy) for i in range(len(cols))]
        assert _exact(text) == _exact(dumps(want, indent=None))


def test_cli_streams_a_long_trace(tmp_path, long_path, strict_json):
    """osm trace --json on the long path: one line of strict JSON with every step, and the
    CSV beside it, from the CLI."""
    s = np.random.default_rng(1).standard_normal(5001)
    path = tmp_path / "s.npy"
    np.save(path, s)
    r = osm("trace", str(path), "-b", "2", "--json", "--csv",
            str(tmp_path / "t.csv"))
    assert r.exit_code == 0, r.stderr
    doc = strict_json(r.stdout)
    assert r.stdout.count("\n") == 1
    assert len(doc["steps"]) == 2501 and doc["steps"][-1]["stop"] == 5001
    assert len(doc["probabilities"]) == 5001
    assert abs(sum(doc["probabilities"]) - 1) < 1e-12
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert len(lines) == 2502 and lines[0].startswith("form,step,block")


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 1e-5, 1e-4, 9.999999e-5, 1e16, 1e15, 5e-324, 1.5e-7]),
)


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(floats, min_size=1, max_size=80))
def test_numbers_are_the_values(xs):
    """Each token reads back to its float exactly: the same decimal as repr (so the same
    shortest digits), -0.0 kept; inf, -inf, nan as the texts given."""
    x = np.array(xs)
    tok = bulk.numbers(x)
    text = bytes(bulk.rows([tok, b"|"], len(x))).decode().split("|")[:-1]
    for t, v in zip(text, xs, strict=True):
        if np.isnan(v):
            assert t == '"nan"'
        elif np.isinf(v):
            assert t == ('"inf"' if v > 0 else '"-inf"')
        else:
            assert Decimal(t) == Decimal(repr(v)) and t.startswith("-") == repr(v).startswith("-")


@settings(max_examples=100, deadline=None)
@given(cols=st.lists(st.lists(st.integers(0, 30), min_size=6, max_size=6), min_size=1,
                     max_size=6), seps=st.lists(st.binary(min_size=0, max_size=5), min_size=7,
                                                max_size=7))
def test_rows_lay_out_what_join_would(cols, seps):
    """rows() against b"".join per row, for tokens of any lengths (a long one last in a row
    included, whose copy would reach into the next row)."""
    rng = np.random.default_rng(len(cols))
    toks, texts = [], []
    for lengths in cols:
        words = [bytes(rng.integers(48, 58, k, dtype=np.uint8)) if k else b"" for k in lengths]
        toks.append(bulk.choices(*words))
        texts.append(words)
    pieces = [seps[0]]
    for j, t in enumerate(toks):
        pieces += [t.take(np.arange(6)), seps[j + 1] if j + 1 < len(seps) else b""]
    want = b"".join(seps[0] + b"".join(
        texts[j][i] + (seps[j + 1] if j + 1 < len(seps) else b"") for j in range(len(toks)))
        for i in range(6))
    assert bytes(bulk.rows(pieces, 6)) == want
    joined = bulk.joined(pieces, 6)
    assert bytes(bulk.rows([joined], 6)) == want


def test_rows_with_a_short_token_last_in_its_buffer():
    """The widest token is copied whole for every row: a short one at the very end of its
    buffer is read past its end, which must stay inside the buffer."""
    tok = bulk.choices(b"x" * 200, b"y").take(np.array([0, 1, 1]))
    assert bytes(bulk.rows([tok, b"|" * 250], 3)) == b"x" * 200 + b"|" * 250 + (
        b"y" + b"|" * 250) * 2


def test_joined_fixed_is_joined():
    """Integers that count up past powers of ten, laid out in runs of one width."""
    k = np.arange(95, 1205, dtype=np.int64)
    pieces = [b"{", bulk.numbers(k), b", ", bulk.numbers(2 * k), b"}"]
    fixed = bulk.joined_fixed(pieces, len(k))
    assert bytes(bulk.rows([fixed], len(k))) == b"".join(
        b"{%d, %d}" % (i, 2 * i) for i in k.tolist())


def test_runs():
    heads, index = bulk.runs(np.array([1.0, 1.0, -0.0, 0.0, 0.0]), np.array([1, 1, 1, 1, 2]))
    assert heads.tolist() == [0, 2, 3, 4]
    assert index.tolist() == [0, 0, 1, 2, 3]


def test_behind_writes_in_order_and_raises_the_writers_failure():
    got = []
    b = Behind(got.append, depth=1)
    for piece in (b"a", b"b" * 70_000, b"c", b"d"):
        b.write(piece)
    b.close()
    assert b"".join(got) == b"a" + b"b" * 70_000 + b"cd"

    def fail(_):
        raise OSError(28, "No space left on device")

    b = Behind(fail)
    b.write(b"x" * 70_000)
    with pytest.raises(OSError, match="No space"):
        b.close()
