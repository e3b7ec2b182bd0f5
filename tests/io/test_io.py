"""Loading and validating inputs, atomic writing, strict JSON."""

from __future__ import annotations

import io as stdio
import math
import pickle
import sys

import numpy as np
import pytest

from osm_cli.errors import InputError, OsmError
from osm_cli.io import (
    check_scores,
    load_array,
    load_partials,
    load_scores,
    parse_text,
    save_npy,
    save_text,
)
from osm_cli.io import load as osm_io
from osm_cli.present.json import dumps, jsonable


def _err(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, OsmError)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# parse_text


@pytest.mark.parametrize(
    "text",
    ["1 2 5 3", "1,2,5,3", "1, 2, 5, 3\n", "1;2 ,5\t3", "  1 2 5 3  \n\n", "1\n2\n5\n3\n"],
)
def test_parse_vector_any_separator(text):
    """Spaces, commas, semicolons, tabs; one line or one number per line: a vector."""
    v = parse_text(text, "x")
    assert v.dtype == np.float64 and v.shape == (4,)
    assert v.tolist() == [1, 2, 5, 3]


def test_parse_matrix_one_row_per_line():
    m = parse_text("2 4 1 3\n1,2,5,3\n", "x")
    assert m.shape == (2, 4)
    assert m.tolist() == [[2, 4, 1, 3], [1, 2, 5, 3]]


def test_parse_infinities_and_exponents():
    v = parse_text("-inf inf -Infinity 1e3 -2.5E-1", "x")
    assert v.tolist() == [-math.inf, math.inf, -math.inf, 1000.0, -0.25]


def test_parse_comments_and_blank_lines():
    text = "# scores of query 0\n\n2 4 # first row\n   \n1 3  # second\n# end\n"
    assert parse_text(text, "x").tolist() == [[2, 4], [1, 3]]


def test_parse_bad_token_names_line_and_column():
    msg = _err(parse_text, "1 2 3\n4 five 6\n", "scores.txt")
    assert msg == "scores.txt: line 2, column 3: 'five' is not a number"


def test_parse_bad_token_column_counts_from_one_after_separators():
    msg = _err(parse_text, "1,2,x", "--values")
    assert msg == "--values: line 1, column 5: 'x' is not a number"
    assert _err(parse_text, "1\n2\n7x # c", "f") == "f: line 3, column 1: '7x' is not a number"


def test_parse_ragged_rows():
    msg = _err(parse_text, "1 2 3\n4 5 6\n7 8\n", "m.txt")
    assert msg.startswith("m.txt: line 3 has 2 numbers but line 1 has 3")
    assert "same length" in msg


def test_parse_ragged_rows_counts_source_lines():
    """Line numbers are those of the file, comments and blank lines included."""
    msg = _err(parse_text, "# header\n1 2\n\n3\n", "m.txt")
    assert msg.startswith("m.txt: line 4 has 1 numbers but line 2 has 2")


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here\n", "   ,  ;  "])
def test_parse_empty(text):
    assert _err(parse_text, text, "e.txt") == "e.txt: no numbers found (the input is empty)"


# ---------------------------------------------------------------------------------------------
# check_scores


def test_check_scores_past_the_first_chunk():
    """The check runs a chunk at a time: NaN and +inf are found in the last chunk, in a long
    row and in a Fortran-ordered matrix, with the same message."""
    from osm_cli.io.load import CHECK_CHUNK

    v = np.zeros(CHECK_CHUNK + 5)
    v[-1] = np.nan
    assert _err(check_scores, v, "v") == (
        f"v: NaN at index {CHECK_CHUNK + 4}; softmax of NaN is undefined")
    m = np.asfortranarray(np.zeros((3, CHECK_CHUNK // 2)))
    m[2, 0] = np.inf
    assert _err(check_scores, m, "m").startswith("m: +inf at index (2, 0)")
    assert check_scores(np.array([-np.inf, 1.0]), "ok").tolist() == [-np.inf, 1.0]


def test_check_scores_nan_index_vector_and_matrix():
    assert _err(check_scores, np.array([1.0, 2.0, np.nan]), "v") == (
        "v: NaN at index 2; softmax of NaN is undefined"
    )
    assert _err(check_scores, np.array([[1.0, 2.0], [3.0, np.nan]]), "m").startswith(
        "m: NaN at index (1, 1)"
    )


def test_check_scores_plus_inf_index():
    msg = _err(check_scores, np.array([0.0, -np.inf, np.inf]), "v")
    assert msg.startswith("v: +inf at index 2;")
    assert "-inf" in msg  # says how to mask instead


def test_check_scores_accepts_minus_inf_and_converts():
    out = check_scores(np.array([1, 2], dtype=np.int32), "v")
    assert out.dtype == np.float64 and out.tolist() == [1.0, 2.0]
    out = check_scores(np.array([-np.inf, 0.5], dtype=np.float16), "v")
    assert out.dtype == np.float64 and out.tolist() == [-math.inf, 0.5]


@pytest.mark.parametrize(
    "arr, words",
    [
        (np.array(3.0), "single number (0-d)"),
        (np.zeros((2, 2, 2)), "3 dimensions (2, 2, 2)"),
        (np.zeros((0,)), "empty"),
        (np.zeros((3, 0)), "empty"),
        (np.array([True, False]), "boolean"),
        (np.array([1j]), "complex"),
        (np.array(["a"]), "numeric"),
        (np.array([1.0, "x"], dtype=object), "Python objects"),
    ],
)
def test_check_scores_refuses(arr, words):
    msg = _err(check_scores, arr, "a.npy")
    assert msg.startswith("a.npy: ")
    assert words in msg


# ---------------------------------------------------------------------------------------------
# load_array


def test_load_npy_memory_mapped(tmp_path):
    p = tmp_path / "s.npy"
    np.save(p, np.array([1.0, 2.0, 5.0, 3.0]))
    arr = load_array(p)
    assert isinstance(arr, np.memmap)
    assert arr.tolist() == [1, 2, 5, 3]
    assert not isinstance(load_array(p, mmap=False), np.memmap)


def test_load_npz_single_array(tmp_path):
    p = tmp_path / "s.npz"
    np.savez(p, scores=np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert load_array(p).tolist() == [[1, 2], [3, 4]]


def test_load_npz_many_arrays(tmp_path):
    p = tmp_path / "two.npz"
    np.savez(p, a=np.zeros(2), b=np.ones(3))
    msg = _err(load_array, p)
    assert msg == f"{p}: holds 2 arrays (a, b); expected exactly one"
    assert load_array(p, key="b").tolist() == [1, 1, 1]
    assert "has no array 'c'" in _err(load_array, p, key="c")


def test_load_npz_empty(tmp_path):
    p = tmp_path / "none.npz"
    np.savez(p)
    assert "holds 0 arrays" in _err(load_array, p)


def test_load_object_npy_refused(tmp_path):
    p = tmp_path / "obj.npy"
    np.save(p, np.array([1.0, "x", None], dtype=object), allow_pickle=True)
    msg = _err(load_array, p)
    assert msg == f"{p}: holds Python objects (a pickle); osm only reads plain numeric arrays"


def test_plain_pickle_named_npy_refused(tmp_path):
    p = tmp_path / "pickled.npy"
    p.write_bytes(pickle.dumps([1.0, 2.0]))
    msg = _err(load_array, p)
    assert msg.startswith(f"{p}: ") and "pickle" in msg


def test_text_file_named_npy_refused(tmp_path):
    p = tmp_path / "text.npy"
    p.write_text("1 2 3\n")
    assert _err(load_array, p).startswith(f"{p}: ")


def test_text_file_named_npy_is_not_called_a_pickle(tmp_path):
    p = tmp_path / "text.npy"
    p.write_text("1 2 3\n")
    msg = _err(load_array, p)
    assert "pickle" not in msg and "Python objects" not in msg


def test_truncated_npy_refused(tmp_path):
    p = tmp_path / "cut.npy"
    np.save(p, np.arange(100.0))
    p.write_bytes(p.read_bytes()[:90])
    assert _err(load_array, p).startswith(f"{p}: ")
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    assert _err(load_array, empty).startswith(f"{empty}: not a valid .npy/.npz file")


def test_load_array_missing_and_directory(tmp_path):
    assert _err(load_array, tmp_path / "nope.npy") == f"{tmp_path / 'nope.npy'}: no such file"
    assert _err(load_array, tmp_path) == f"{tmp_path}: is a directory, not a file"


# ---------------------------------------------------------------------------------------------
# load_scores


def test_load_scores_sources(tmp_path, monkeypatch):
    txt = tmp_path / "s.txt"
    txt.write_text("2 4 1 3\n")
    s, name = load_scores(str(txt))
    assert s.tolist() == [2, 4, 1, 3] and name == str(txt)

    s, name = load_scores(None, "1,2,5,3")
    assert s.tolist() == [1, 2, 5, 3] and name == "--values"

    monkeypatch.setattr(sys, "stdin", stdio.StringIO("1 2\n3 4\n"))
    s, name = load_scores("-")
    assert s.tolist() == [[1, 2], [3, 4]] and name == "<stdin>"

    npy = tmp_path / "s.npy"
    np.save(npy, np.array([[1.0, -np.inf], [0.0, 2.0]], dtype=np.float32))
    s, _ = load_scores(str(npy))
    assert s.dtype == np.float64 and s.tolist() == [[1, -math.inf], [0, 2]]

    csv = tmp_path / "s.csv"
    csv.write_text("1,2\n3,4\n")
    assert load_scores(str(csv))[0].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    "arr, words",
    [(np.array(1.0), "0-d"), (np.zeros((1, 2, 3)), "3 dimensions"), (np.array([1, np.nan]),
                                                                       "NaN at index 1")],
)
def test_load_scores_npy_validated(tmp_path, arr, words):
    p = tmp_path / "a.npy"
    np.save(p, arr)
    msg = _err(load_scores, str(p))
    assert msg.startswith(f"{p}: ") and words in msg


def test_load_scores_errors(tmp_path):
    assert _err(load_scores, None).startswith("no scores given")
    assert "not both" in _err(load_scores, "x.txt", "1,2")
    assert _err(load_scores, str(tmp_path / "missing.txt")).endswith("no such file")
    assert "is a directory" in _err(load_scores, str(tmp_path))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert _err(load_scores, str(empty)) == f"{empty}: no numbers found (the input is empty)"
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    assert "not a text file" in _err(load_scores, str(binary))


def test_csv_with_byte_order_mark(tmp_path):
    p = tmp_path / "excel.csv"
    p.write_bytes("1,2,5,3\n".encode("utf-8-sig"))
    assert load_scores(str(p))[0].tolist() == [1, 2, 5, 3]


# ---------------------------------------------------------------------------------------------
# Writing


def test_save_npy_atomic(tmp_path):
    target = tmp_path / "out.npy"
    save_npy(target, np.array([1.0, -np.inf]))
    assert np.load(target).tolist() == [1.0, -math.inf]
    save_npy(target, np.arange(3.0)[::-1])  # overwrite; a non-contiguous view is fine
    assert np.load(target).tolist() == [2, 1, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]  # no temp files left


def test_save_npy_failure_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.npy"
    save_npy(target, np.array([7.0]))
    with pytest.raises(ValueError):
        save_npy(target, np.array([1, "x"], dtype=object))  # pickles are refused mid-write
    assert np.load(target).tolist() == [7.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]


def test_save_into_missing_folder_or_onto_directory(tmp_path):
    missing = tmp_path / "no" / "such" / "out.npy"
    msg = _err(save_npy, missing, np.zeros(2))
    assert msg.startswith(str(missing)) and "does not exist" in msg
    assert "is a directory" in _err(save_npy, tmp_path, np.zeros(2))
    assert list(tmp_path.iterdir()) == []


def test_save_text_atomic(tmp_path):
    target = tmp_path / "t.json"
    save_text(target, "α → β\n")
    assert target.read_text(encoding="utf-8") == "α → β\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


# ---------------------------------------------------------------------------------------------
# JSON


def test_dumps_is_strict_json(strict_json):
    doc = {
        "v": np.array([1.0, np.inf, -np.inf, np.nan]),
        "m": np.array([[0.5, -np.inf]]),
        "f32": np.float32(2.5),
        "i": np.int64(3),
        "b": np.bool_(True),
        "x": float("nan"),
        "t": (np.float64(-np.inf), 1),
        "s": "text",
        "none": None,
    }
    text = dumps(doc)
    assert "NaN" not in text and "Infinity" not in text
    back = strict_json(text)
    assert back == {
        "v": [1.0, "inf", "-inf", "nan"],
        "m": [[0.5, "-inf"]],
        "f32": 2.5,
        "i": 3,
        "b": True,
        "x": "nan",
        "t": ["-inf", 1],
        "s": "text",
        "none": None,
    }


def test_dumps_finite_floats_round_trip_exactly(strict_json):
    x = np.array([0.1, 1 / 3, 1.5530017927759192, 5e-324, 1.7976931348623157e308])
    assert strict_json(dumps({"x": x}))["x"] == x.tolist()
    assert jsonable(np.float64(0.1)) == 0.1 and type(jsonable(np.float64(0.1))) is float


def test_strict_parser_really_refuses_constants(strict_json):
    with pytest.raises(ValueError):
        strict_json('{"x": NaN}')
    with pytest.raises(ValueError):
        strict_json("[Infinity]")


@pytest.mark.parametrize("o_dtypes, l_dtype, expect", [
    (("float32", "float32"), "float32", ("float32", "float32")),
    (("float16", "float32"), "float16", ("float32", "float16")),
    (("int32", "float32"), "float64", ("float64", "float64")),
])
def test_load_partials_reads_each_file_once_and_keeps_the_dtypes(
        tmp_path, monkeypatch, o_dtypes, l_dtype, expect):
    """The merged O and LSE are written in the inputs' common float (O's and LSE's apart), known
    from the one load that also checks them: each file is read once."""
    paths = []
    for n, dt in enumerate(o_dtypes):
        np.save(tmp_path / f"o{n}.npy", np.ones((2, 3), dtype=dt))
        np.save(tmp_path / f"l{n}.npy", np.zeros(2, dtype=l_dtype))
        paths += [tmp_path / f"o{n}.npy", tmp_path / f"l{n}.npy"]
    loaded = []
    real = osm_io.load_array
    monkeypatch.setattr(osm_io, "load_array", lambda p, **kw: loaded.append(p) or real(p, **kw))
    outs, lses, dtypes = load_partials(paths)
    assert loaded == paths
    assert all(a.dtype == np.float64 for a in (*outs, *lses))
    assert tuple(str(d) for d in dtypes) == expect
