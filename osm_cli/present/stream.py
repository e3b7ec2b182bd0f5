"""--json documents written as they are computed: a long trace's steps from StepColumns, a
chunk at a time, and its arrays a piece at a time, through orjson and bulk.py, so that neither
the document nor one Python object per value is ever made.

A small document is json.dumps's text (json.dumps, indented under 100 kB). A long one is
compact JSON on one line, as orjson writes it: no spaces after "," and ":", numbers spelled as
orjson spells them (the same shortest round-trip digits as Python's repr; 1e-7 for repr's 1e-07,
see bulk.py). Its size is what costs: at 10⁷ scores in blocks of 2 it is 1.7 GB, and each
pass over it, even the kernel's copy into a file, takes about a second.
Leaves out: what the documents hold (json.py), the layout of many values (bulk.py).

Example: write_json({"x": Pieces((3,), lambda: [(0, 1, 0, 3, np.ones((1, 3)))])}, out.write)
writes b'{"x":[1.0,1.0,1.0]}'
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import orjson

from . import bulk
from .json import Pieces, StepChunks, dumps, jsonable

SUB = 1 << 14  # steps laid out at once: their text, about 3.5 MB, stays in the CPU's L3 cache
SUBV = 1 << 16  # array values written at once (their text is about 1.3 MB)
BIG = 4096  # values: a plain array larger than this in a long document is written by orjson


def write_json(obj, write: Callable[[bytes], object], indent: int | None = 2) -> None:
    """obj as strict JSON through write(bytes): dumps(obj) when obj holds no StepChunks or
    Pieces; else written as it is computed, on one line."""
    if not _streams(obj):
        write(dumps(obj, indent).encode())
        return
    _write(obj, write)


def _streams(obj) -> bool:
    if isinstance(obj, (StepChunks, Pieces)):
        return True
    if isinstance(obj, dict):
        return any(_streams(v) for v in obj.values())
    return False


def _write(obj, write) -> None:
    if isinstance(obj, dict):
        write(b"{")
        for n, (key, value) in enumerate(obj.items()):
            write(f"{',' if n else ''}{json.dumps(key)}:".encode())
            _write(value, write)
        write(b"}")
    elif isinstance(obj, StepChunks):
        _write_steps(obj, write)
    elif isinstance(obj, Pieces):
        _write_pieces(obj, write)
    elif isinstance(obj, np.ndarray) and obj.size > BIG and obj.dtype.kind == "f":
        write(array_text(obj))
    else:
        write(_compact(obj))


def _compact(obj) -> bytes:
    return json.dumps(jsonable(obj), allow_nan=False, separators=(",", ":")).encode()


def _write_steps(obj: StepChunks, write) -> None:
    """The steps as a list of step_doc objects (json.py), SUB steps a time."""
    write(b"[")
    first = True
    for cols in obj.make():
        for a in range(0, len(cols), SUB):
            text, close = step_rows(cols.take(slice(a, a + SUB)), obj.lazy)
            write(text[1:] if first else text)  # the first step has no "," before it
            write(close)
            first = False
    write(b"]")


def step_rows(cols, lazy: bool = False) -> tuple[memoryview, bytes]:
    """",{step_doc}" for each step of cols (core.record.StepColumns), keys in step_doc's order,
    as two pieces of text: all but the end of the last step, and that.

    Each step is laid out as seven pieces. What repeats from step to step is made once per run:
    the flags that close one step (true}) with block, start and stop that open the next (their
    lengths change only at powers of ten), and m_prev, m and α (which change only at a
    rescale); l_prev is the previous step's l, written once."""
    num = bulk.numbers
    n = len(cols)
    ends = _ends(cols, lazy)
    opening = bulk.joined_fixed([ends.take(np.arange(-1, n - 1)), b',{"block":',
                                 num(cols.block), b',"start":', num(cols.start), b',"stop":',
                                 num(cols.stop), b',"block_max":'], n)
    heads, index = bulk.runs(cols.m_prev, cols.m, cols.alpha)
    state = bulk.joined([b',"m_prev":', num(cols.m_prev[heads]), b',"m":', num(cols.m[heads]),
                         b',"scale":', num(cols.alpha[heads]), b',"l_prev":'],
                        len(heads)).take(index)
    l_prev, l = _shifted(cols.l_prev, cols.l)
    text = bulk.rows([opening, num(cols.block_max), state, l_prev, b',"l":', l, b',"rescaled":'],
                     n)
    return text, bytes(bulk.rows([ends.take(slice(n - 1, n))], 1))


def _ends(cols, lazy: bool) -> bulk.Tokens:
    """What ends each step after ',"rescaled":' (its flag, the merge form's block_m,
    block_l and block_weight, lazy's "skipped", and "}") as tokens, with an empty one
    appended (what comes before the first step)."""
    flags = [cols.rescaled]
    pieces: list = [None]
    if cols.block_l is not None:
        flags += [cols.block_m, cols.block_l, cols.block_weight]
        pieces += [b',"block_m":', None, b',"block_l":', None, b',"block_weight":', None]
    if lazy:
        flags.append(cols.lazy_skipped)
        pieces += [b',"skipped":', None]
    heads, index = bulk.runs(*flags)
    values = iter(flags)
    pieces = [bulk.numbers(next(values)[heads]) if p is None else p for p in pieces]
    made = bulk.joined([*pieces, b"}"], len(heads))
    empty = len(heads)  # joined's buffer ends at the last text: an empty token there
    return bulk.Tokens(made.src, np.append(made.starts, made.starts[-1] + made.lengths[-1]),
                       np.append(made.lengths, 0)).take(np.append(index, empty))


def _shifted(prev: np.ndarray, cur: np.ndarray) -> tuple[bulk.Tokens, bulk.Tokens]:
    """Tokens of prev and cur, written once when prev is cur a step late (l_prev and l)."""
    both = np.concatenate([prev[:1], cur])
    b = both.view(f"u{both.itemsize}")
    if np.array_equal(np.ascontiguousarray(prev).view(b.dtype), b[:-1]):
        t = bulk.numbers(both)
        return t.take(slice(0, -1)), t.take(slice(1, None))
    return bulk.numbers(prev), bulk.numbers(cur)


def array_text(x: np.ndarray) -> bytes:
    """A float array (1-D or 2-D) as a compact JSON list (of row lists), as orjson writes it
    but for non-finite values, which are "inf", "-inf", "nan" (orjson writes null)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    text = orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)
    bad = ~np.isfinite(x)
    if bad.any():
        kinds = [k for k, f in (("inf", np.isposinf), ("-inf", np.isneginf), ("nan", np.isnan))
                 if f(x).any()]
        if len(kinds) > 1:  # orjson writes null for each: which was which is lost
            return _compact(x)
        text = text.replace(b"null", bulk.JSON_NONFINITE[kinds[0]])
    return text


def _write_pieces(obj: Pieces, write) -> None:
    """A 1-D array as one list; a 2-D one as a list of row lists (pieces of whole rows, or of
    one row), SUBV values at a time."""
    flat = len(obj.shape) == 1
    n = obj.shape[-1]
    write(b"[")
    for r0, r1, a, b, values in obj.make():
        if not flat and a == 0 and b == n:  # whole rows
            per = max(1, SUBV // max(n, 1))
            for i in range(0, r1 - r0, per):
                if r0 + i:
                    write(b",")
                write(memoryview(array_text(values[i:i + per]))[1:-1])
            continue
        if not flat and a == 0:
            write(b",[" if r0 else b"[")
        for i in range(0, b - a, SUBV):
            if a + i:
                write(b",")
            write(memoryview(array_text(values[0, i:i + SUBV]))[1:-1])
        if not flat and b == n:
            write(b"]")
    write(b"]")


__all__ = ["array_text", "step_rows", "write_json"]
