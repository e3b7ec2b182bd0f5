"""Many numbers as text at once, for a long trace's JSON and CSV: orjson writes a column of
numbers in one call, and numpy lays the values out row by row beside their keys, a chunk of
rows at a time, where one Python string per value would cost a microsecond each.

`numbers` turns a column into Tokens, the text of each value as a slice of one byte buffer;
`rows` writes n rows, each a fixed sequence of pieces (constant text, or the row's token of a
column), into one buffer; `joined` makes such rows the tokens of one column again, so that a
group of pieces that repeats from row to row (m, α between rescales) is laid out once per run.
Floats are written as orjson writes them: the shortest text that reads back to the same float64
(the digits of Python's repr), spelled 1e-7 where repr writes 1e-07 and 0.00001 where repr
writes 1e-05. Non-finite values become the texts given (JSON's strings "inf", "-inf", "nan");
orjson itself would write null.

Leaves out: what the rows say (json.py, csv.py), and small documents (json.dumps, csv).

Example: bytes(rows([b"{", numbers(np.array([1.5, 2.0])), b"}"], 2)) -> b"{1.5}{2.0}"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson
from numpy.lib.stride_tricks import as_strided

LONG = 1 << 20  # scores: a trace longer than this gets its JSON and CSV through this module
PAD = 64  # bytes past the end of every buffer, so that a window of any piece's width fits
JSON_NONFINITE = {"inf": b'"inf"', "-inf": b'"-inf"', "nan": b'"nan"'}
NONFINITE = ("inf", "-inf", "nan")


@dataclass(frozen=True)
class Tokens:
    """The texts of a column of values: value i is src[starts[i]:starts[i] + lengths[i]]."""

    src: np.ndarray  # uint8, PAD bytes longer than the text it holds
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def width(self) -> int:
        return int(self.lengths.max()) if len(self) else 0

    def take(self, index) -> Tokens:
        """The tokens at `index` (a slice or an index array): the same buffer, no copy of it."""
        return Tokens(self.src, self.starts[index], self.lengths[index])


def _buffer(*parts: bytes) -> np.ndarray:
    return np.frombuffer(b"".join((*parts, bytes(PAD))), dtype=np.uint8)


def _window(buf: np.ndarray, width: int) -> np.ndarray:
    """Every `width` consecutive bytes of buf as one item: item k is buf[k:k + width] (a view;
    numpy copies such void items faster than rows of a 2-D byte array)."""
    return np.ndarray((len(buf) - width + 1,), np.dtype((np.void, width)), buf, strides=(1,))


def _split(text: bytes, extra: bytes = b"") -> Tokens:
    """The values of orjson's text of a flat list, "[a,b,c]", as tokens; `extra` is kept after
    the text in the same buffer."""
    src = _buffer(text, extra)
    if len(text) == 2:  # "[]"
        return Tokens(src, np.zeros(0, np.int64), np.zeros(0, np.int64))
    ends = np.flatnonzero(src[:len(text)] == ord(","))
    starts = np.concatenate([[1], ends + 1])
    return Tokens(src, starts, np.concatenate([ends, [len(text) - 1]]) - starts)


POW10 = 10 ** np.arange(1, 19, dtype=np.int64)


def _ints(x: np.ndarray) -> Tokens:
    """Tokens of int64 values; for values that count up from 0 or more (block, start, stop),
    their lengths follow from where they pass each power of ten, not from the text."""
    text = orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)
    if len(x) < 2 or x[0] < 0 or np.any(x[1:] < x[:-1]):
        return _split(text)
    passes = np.searchsorted(x, POW10)  # where the values get a 2nd, 3rd, … digit
    lengths = np.repeat(np.arange(1, 20), np.diff(np.concatenate([[0], passes, [len(x)]])))
    starts = np.empty(len(x), np.int64)
    starts[0] = 1
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    starts[1:] += 1
    return Tokens(_buffer(text), starts, lengths)


def choices(*texts: bytes) -> Tokens:
    """Tokens of a column that takes one of a few texts: .take(k) picks texts[k] per row."""
    lengths = np.array([len(t) for t in texts], np.int64)
    return Tokens(_buffer(*texts), np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)


BOOLS = choices(b"false", b"true")


def runs(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(heads, index) of the runs of rows where every column keeps its bits (−0.0 is not 0.0):
    heads are the first row of each run, index[i] the run of row i."""
    n = len(cols[0])
    change = np.zeros(n, bool)
    change[0] = True
    for c in cols:
        c = np.ascontiguousarray(c)
        b = c.view(f"u{c.itemsize}")  # the bits, as one unsigned integer per value
        change[1:] |= b[1:] != b[:-1]
    return np.flatnonzero(change), np.cumsum(change) - 1


def numbers(x: np.ndarray, nonfinite: Mapping[str, bytes] = JSON_NONFINITE, *,
            repeats: bool = False) -> Tokens:
    """The text of each value of the 1-D array x: bools as true/false, integers as orjson
    writes them, floats (any float dtype, as float64) in orjson's shortest form, non-finite
    ones as nonfinite["inf"], ["-inf"] or ["nan"]. repeats: the column repeats its values in
    runs (m and α of a trace), so only the first value of each run is written."""
    x = np.asarray(x)
    if x.dtype == bool:
        return BOOLS.take(x.astype(np.intp))
    if x.dtype.kind in "iu":
        return _ints(np.ascontiguousarray(x, dtype=np.int64))
    x = np.ascontiguousarray(x, dtype=np.float64)
    if repeats:
        heads, index = runs(x)
        return numbers(x[heads], nonfinite).take(index)
    extra = b"".join(nonfinite[k] for k in NONFINITE)
    tok = _split(orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY), extra)
    bad = ~np.isfinite(x)
    if bad.any():
        at = len(tok.src) - PAD - len(extra)
        starts, lengths = tok.starts.copy(), tok.lengths.copy()
        for name, where in zip(NONFINITE, (np.isposinf(x), np.isneginf(x), np.isnan(x)),
                               strict=True):
            starts[where], lengths[where] = at, len(nonfinite[name])
            at += len(nonfinite[name])
        tok = Tokens(tok.src, starts, lengths)
    return tok


def rows(pieces: Sequence[bytes | Tokens], n: int) -> memoryview:
    """n rows of text one after the other, row i the pieces in order: a bytes piece as it is,
    a Tokens piece its token i (see _layout)."""
    out, _, total = _layout(pieces, n)
    return memoryview(out)[:total]


def joined(pieces: Sequence[bytes | Tokens], n: int) -> Tokens:
    """The n rows of `pieces` (as rows() writes them) as the tokens of one column."""
    out, off, _ = _layout(pieces, n)
    return Tokens(out, off[:-1], np.diff(off))


def joined_fixed(pieces: Sequence[bytes | Tokens], n: int) -> Tokens:
    """joined(pieces, n) for pieces whose tokens keep their lengths over long runs of rows
    (integers that count up): each run is laid out as rows of one width by plain strided
    copies, cheaper than copying each token to its own place (else it is joined)."""
    toks = [p for p in pieces if not isinstance(p, bytes)]
    if n == 0 or not toks:
        return joined(pieces, n)
    heads, _ = runs(*(t.lengths for t in toks))
    if len(heads) > 8 + n // 256:
        return joined(pieces, n)
    counts = np.diff(np.append(heads, n))
    widths = sum(len(p) for p in pieces if isinstance(p, bytes)) + sum(
        t.lengths[heads] for t in toks)
    base = np.concatenate([[0], np.cumsum(widths * counts)])
    out = np.empty(int(base[-1]) + PAD, np.uint8)
    for a, k, w, at in zip(heads.tolist(), counts.tolist(), widths.tolist(), base.tolist(),
                           strict=False):
        _grid(out[at:at + k * w].reshape(k, w), pieces, a, a + k)
    row = np.arange(n) - np.repeat(heads, counts)  # the row's place in its run
    per = np.repeat(widths, counts)
    return Tokens(out, np.repeat(base[:-1], counts) + row * per, per)


def _grid(grid: np.ndarray, pieces, a: int, b: int) -> None:
    """Rows a..b-1 of `pieces`, whose tokens all have one length each there, into grid: the
    constant text as one row copied to every row, then each token column (read with a stride
    where its tokens lie evenly spaced, as orjson writes equally long integers)."""
    template, col, toks = np.zeros(grid.shape[1], np.uint8), 0, []
    for p in pieces:
        k = len(p) if isinstance(p, bytes) else int(p.lengths[a])
        if isinstance(p, bytes):
            template[col:col + k] = np.frombuffer(p, np.uint8)
        elif k:
            toks.append((col, k, p.starts[a:b], p.src))
        col += k
    grid[:] = template
    for col, k, starts, src in toks:
        step = int(starts[1] - starts[0]) if len(starts) > 1 else k
        if np.all(np.diff(starts) == step):
            text = as_strided(src[starts[0]:], shape=(len(starts), k), strides=(step, 1))
        else:
            text = _window(src, k)[starts].view(np.uint8).reshape(-1, k)
        grid[:, col:col + k] = text


def _layout(pieces, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(buffer, row offsets with the end appended, total bytes) of rows(pieces, n).

    Each column's tokens are copied with the width of its longest, in order of the pieces: the
    bytes past a shorter token are written over by the pieces after it in its row. Where they
    could reach past the row's end (more than the shortest rest of a row can hold), that column
    is copied exactly, one length at a time."""
    lens = [len(p) if isinstance(p, bytes) else p.lengths for p in pieces]
    shortest = [ln if isinstance(ln, int) else int(ln.min(initial=0)) for ln in lens]
    row_len = np.zeros(n, np.int64)
    for ln in lens:
        row_len += ln
    ends = np.zeros(n + 1, np.int64)
    np.cumsum(row_len, out=ends[1:])
    total = int(ends[-1])
    out = np.empty(total + PAD, dtype=np.uint8)
    off = ends[:-1]
    for j, (p, ln) in enumerate(zip(pieces, lens, strict=True)):
        if isinstance(p, bytes):
            if p:
                _window(out, len(p))[off] = np.frombuffer(p, np.dtype((np.void, len(p))))[0]
        elif n:
            _copy(out, off, p, sum(shortest[j + 1:]))
        if j + 1 < len(pieces):
            off = off + ln
    return out, ends, total


def _copy(out: np.ndarray, off: np.ndarray, tok: Tokens, room: int) -> None:
    """Token i of tok to out[off[i]:]; room: the fewest bytes any row has after it, which are
    written later."""
    w = tok.width
    if w == 0:
        return
    if w - int(tok.lengths.min()) <= room:
        src = tok.src
        if int(tok.starts.max()) + w > len(src):  # a short token near the end: read past it
            src = np.concatenate([src, np.zeros(w, np.uint8)])
        _window(out, w)[off] = _window(src, w)[tok.starts]
        return
    for k in np.unique(tok.lengths).tolist():  # exact widths: nothing written past a token
        at = tok.lengths == k
        if k:
            _window(out, k)[off[at]] = _window(tok.src, k)[tok.starts[at]]


__all__ = ["BOOLS", "JSON_NONFINITE", "LONG", "Tokens", "choices", "joined", "joined_fixed",
           "numbers", "rows", "runs"]
