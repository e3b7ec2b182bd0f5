"""The interactive page of `--html FILE` (trace, attention, backward): one self-contained HTML
file, for slides and self-study, made from the records the tables show.

Each builder turns a report into a document (plain JSON: strings and numbers) of steps, and
`page` writes it into the page's template with its script and style inline (assets/): no
network, no library, works from file://. A step holds everything shown while it is the current
one, as text made here: the tile or block it lights, the running state (m, α, l, O), its
arithmetic (the lines of `--explain`, reports/explain.py) and the HBM/SRAM bytes moved so far
by FA1's tiled loop (studies/costmodel.py). The script only chooses which step to show, from the
buttons, the arrow keys and the address's #step=K (1 to N, as step mode counts).

Leaves out: writing the file (io/save.py, through the CLI), the terminal's own copy of the
screen (the caller passes it as an HTML fragment, shown at the foot of the page).
"""

from __future__ import annotations

import html
import json
import math
import re
from importlib import resources

import numpy as np

from osm_cli.core.notebook import arrow
from osm_cli.reports.explain import (
    ATTENTION_NOTE,
    BACKWARD_NOTE,
    attention_heading,
    attention_step_lines,
    backward_key_lines,
    backward_query_lines,
    g,
    trace_heading,
    trace_lines,
)
from osm_cli.studies import costmodel

from .console import as_text
from .format import bytes_text
from .plot import source_title
from .rows import queries_text
from .trace import final_line, form_line, sink_line, trace_heads

CELLS = 1024  # a trace's scores drawn one cell each up to this many (more: one cell a block)
MATRIX = 48  # attention's matrix drawn entry by entry up to this many rows and keys (more: tiles)
TILES = 96  # at most this many Q tiles and K/V tiles drawn
TEXT_UP_TO = 16  # entries carry their value as text up to this many keys


def page(doc: dict, screen: str = "") -> str:
    """The page: the template with its style, its script and the document inline, filled in
    one pass (nothing a document holds is read as a placeholder). Every "<" in the JSON is
    written \\u003c, so that no string in it can end the script element."""
    assets = resources.files("osm_cli.present") / "assets"
    blob = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    parts = {
        "title": html.escape(doc["title"]),
        "style": (assets / "page.css").read_text(encoding="utf-8"),
        "script": (assets / "page.js").read_text(encoding="utf-8"),
        "data": blob.replace("<", "\\u003c"),
        "screen": screen,
    }
    template = (assets / "page.html").read_text(encoding="utf-8")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], template)


def _bytes(read: int, written: int, end: int, note: str) -> dict:
    return {"read": int(read), "written": int(written), "end": int(end),
            "text": [f"read from HBM so far: {bytes_text(read)}",
                     f"written to HBM so far: {bytes_text(written)}",
                     f"moved so far: {bytes_text(read + written)} of {bytes_text(end)}", note]}


def trace_doc(rep, name: str) -> dict:
    """`osm trace`'s page: the traced row's scores, one step a block."""
    t = rep.trace
    scores = np.asarray(rep.rows[rep.row], dtype=np.float64)
    n, nb = scores.shape[-1], -(-scores.shape[-1] // rep.block)
    p = np.asarray(rep.piece("probabilities", rep.row, rep.row + 1, 0, n)).ravel()
    by_cell = n <= CELLS
    if by_cell:
        cells = [g(x, 6) for x in scores]
        shade = [_shade(x) for x in p]
        groups = [[a, min(n, a + rep.block)] for a in range(0, n, rep.block)]
    else:  # one cell a block: its max
        cells = [g(scores[a:a + rep.block].max(), 6) for a in range(0, n, rep.block)]
        shade = [_shade(p[a:a + rep.block].sum()) for a in range(0, n, rep.block)]
        groups = [[b, b + 1] for b in range(nb)]
    size = int(scores.dtype.itemsize)
    steps = []
    for k, s in enumerate(t.steps):
        state = [["block max", g(s.block_max)], ["m", arrow(s.m_prev, s.m)],
                 ["α", g(s.alpha)], ["l", arrow(s.l_prev, s.l)]]
        if s.block_l is not None:
            state[1:1] = [["m⁽ᵏ⁾", g(s.block_m)], ["l⁽ᵏ⁾", g(s.block_l)]]
        sections = [{"title": f"form {tr.form}" if len(rep.traces) > 1 else "",
                     "lines": trace_lines(tr.steps[k], tr.form)} for tr in rep.traces]
        read = s.stop * size if rep.order is None else sum(
            (x.stop - x.start) for x in t.steps[:k + 1]) * size
        steps.append({
            "title": trace_heading(s), "lit": [s.start, s.stop] if by_cell else [s.block,
                                                                                s.block + 1],
            "state": state, "sections": sections,
            "bytes": _bytes(read, 0, n * size, f"on chip: the block and (m, l), "
                            f"{bytes_text((s.stop - s.start + 2) * size)}; a three-pass softmax "
                            f"(max, sum, divide) reads the row 3 times and writes p: "
                            f"{bytes_text(4 * n * size)}"),
        })
    if rep.sink is not None:  # the sink joins the denominator after the last block
        st = rep.sink_steps[0]
        steps.append({**steps[-1], "title": f"the sink σ = {g(rep.sink)}", "lit": None,
                      "state": [["σ", g(rep.sink)], ["m", arrow(st.m_prev, st.m)],
                                ["α", g(st.alpha)], ["l", arrow(st.l_prev, st.l)]],
                      "sections": [{"title": "", "lines": as_text(sink_line(st, rep.sink),
                                                                  width=100).splitlines()}]})
    return {
        "kind": "trace", "unit": "block",
        "title": f"osm trace: {source_title(name, rep)}, block {rep.block}, form {rep.form}",
        "intro": [*as_text(_heads(rep, name), width=100).splitlines(),
                  *(form_line(tr.form) for tr in rep.traces)],
        "vector": {"cells": cells, "shade": shade, "groups": groups,
                   "about": "the traced row's scores" + ("" if by_cell else
                                                          " (one cell a block: its max)")
                   + "; shade: the final probability p"},
        "steps": steps,
        "bytes_about": (f"The row streamed once, block by block ({size} B a score): what an "
                        "online softmax reads; m and l stay on chip."),
        "final": [as_text(final_line(*(np.atleast_1d(x)[rep.row] for x in (t.m, t.l, t.lse))))],
    }


def _heads(rep, name):
    from rich.console import Group

    return Group(*trace_heads(rep, name))


def _shade(x) -> float | None:
    x = float(x)
    return None if not math.isfinite(x) else round(min(1.0, max(0.0, x)), 4)


def _head(q, k, opts, block_q: int, block_k: int):
    """(t, s, d, kinds): the traced head's queries, keys, head dim and tile kinds (the forward's
    own tile walk: "skip", "partial", "full", (n_q, n_k))."""
    from osm_cli.flash.shapes import as_bhnd
    from osm_cli.studies import tilemap

    q4, k4 = as_bhnd(np.asarray(q), opts.layout, "Q"), as_bhnd(np.asarray(k), opts.layout, "K")
    kinds = tilemap.kind_map(q, k, block_q=block_q, block_k=block_k, opts=opts)
    return q4.shape[2], k4.shape[2], q4.shape[3], kinds


def _matrix(q, k, opts, kinds, batch: int, head: int, block_q: int, block_k: int,
            queries, key: int | None = None) -> dict:
    """The traced head's P = softmax(S) entry by entry (a small head) or its tiles (a large
    one), the tile grid, the skipped tiles and the traced rows (and key): `row` the first,
    `traced_rows` all of them (in the drawing's units)."""
    from osm_cli.studies import tilemap

    queries = list(queries)
    n_q, n_k = kinds.shape
    doc = {"skip": (kinds[:TILES, :TILES] == "skip").tolist(),
           "partial": (kinds[:TILES, :TILES] == "partial").tolist()}
    hm = tilemap.head_probabilities(q, k, batch=batch, head=head, rows=MATRIX + 1,
                                    cols=MATRIX + 1, block_q=block_q, block_k=block_k,
                                    opts=opts)
    rows, cols = hm.p.shape
    if rows <= MATRIX and cols <= MATRIX:
        text = cols <= TEXT_UP_TO
        doc.update(level="entry", rows=rows, cols=cols, bq=block_q, bk=block_k, row=queries[0],
                   traced_rows=queries, col=key,
                   about="P = softmax(S) of the traced head, each row over all its "
                   "keys" + ("" if text else " (as shade)") + "; grey: a tile skipped",
                   cells=[[("" if hm.masked[i, j] else f"{hm.p[i, j]:.2f}") if text else ""
                           for j in range(cols)] for i in range(rows)],
                   shade=[[None if hm.masked[i, j] else _shade(hm.p[i, j]) for j in range(cols)]
                          for i in range(rows)])
        return doc
    drawn = f"; the first {TILES} drawn" if max(n_q, n_k) > TILES else ""
    doc.update(level="tile", rows=min(n_q, TILES), cols=min(n_k, TILES), bq=1, bk=1,
               row=queries[0] // block_q,
               traced_rows=sorted({x // block_q for x in queries}),
               col=None if key is None else key // block_k,
               about=f"the traced head's {n_q} × {n_k} tiles ({block_q} queries × {block_k} "
               f"keys each{drawn}); blue: computed, half blue: masked in part, grey: skipped",
               cells=None, shade=None)
    return doc


def _rows(res):
    """(queries, traces): every traced query row and its steps (one row: the record's own;
    res: an Attention or Backward record)."""
    i = res.trace.at[2]
    if len(res.trace.rows) <= 1:
        return (i,), (res.trace.steps,)
    return tuple(res.trace.queries), res.trace.rows


def _lit(m: dict, block_q: int, block_k: int, r0: int, r1: int, c0: int,
         c1: int) -> list[int] | None:
    """A tile's rectangle in the matrix's units (entries, or tiles); None off the drawing."""
    if m["level"] == "tile":
        r0, c0 = r0 // block_q, c0 // block_k
        r1, c1 = r0 + 1, c0 + 1
    if r0 >= m["rows"] or c0 >= m["cols"]:
        return None
    return [r0, min(r1, m["rows"]), c0, min(c1, m["cols"])]


def _dtype_bytes(rep, q) -> int:
    """Bytes an element: the precision model's dtype, else the inputs' own."""
    model = getattr(rep, "model", None)
    if model is not None:
        return int(np.dtype(model.dtype).itemsize)
    return int(np.asarray(q).dtype.itemsize) if np.asarray(q).dtype.kind == "f" else 8


def _o_text(s) -> str:
    return "[" + ", ".join(g(x, 7) for x in np.ravel(s.o)[:4]) + "]"


def _attention_state(steps) -> list:
    """The running state after one K/V tile: a (name, value) list for one row; for several
    rows a row each (query, tile max, m, α, l, O[:k], ‖O‖), the vectors of a Q tile."""
    if len(steps) == 1:
        s = steps[0]
        state = [["tile max", "skipped" if s.masked else g(s.block_max, 7)],
                 ["m", arrow(s.m_prev, s.m, 7)], ["α", g(s.alpha, 7)],
                 ["l", arrow(s.l_prev, s.l, 7)]]
        if s.o is not None:
            state.append([f"O[:{min(4, np.size(s.o))}]", _o_text(s)])
        if s.o_norm is not None:
            state.append(["‖O‖", g(s.o_norm, 7)])
        return state
    return [[str(s.query), "skipped" if s.masked else g(s.block_max, 7),
             arrow(s.m_prev, s.m, 7), g(s.alpha, 7), arrow(s.l_prev, s.l, 7),
             "" if s.o is None else _o_text(s), "" if s.o_norm is None else g(s.o_norm, 7)]
            for s in steps]


def _attention_sections(queries, traces, kk: int) -> list:
    if len(traces) == 1:
        return [{"title": "", "lines": attention_step_lines(traces[0], kk)}]
    if all(tr[kk].masked for tr in traces):
        return [{"title": "", "lines": ["skipped for every traced row: the mask hides these "
                                        "keys; m, l, O unchanged"]}]
    return [{"title": f"query {qi}", "lines": attention_step_lines(tr, kk)}
            for qi, tr in zip(queries, traces, strict=True)]


def _tiles_text(tiles) -> str:
    return f"Q tile {tiles[0]}" if len(tiles) == 1 else (
        "Q tiles " + ", ".join(map(str, tiles)))


def attention_doc(rep, q, k, opts) -> dict:
    """`osm attention`'s page: the traced rows' K/V tiles over the traced head's P (several
    rows, --query 0:4: each tile's state a row per query, its arithmetic a section each)."""
    res = rep.result
    b, h, _ = res.trace.at
    queries, traces = _rows(res)
    bq, bk = res.tiles.block_q, res.tiles.block_k
    t, n, d, kinds = _head(q, k, opts, bq, bk)
    m = _matrix(q, k, opts, kinds, b, h, bq, bk, queries)
    tiles = sorted({x // bq for x in queries})
    iq = tiles[-1]  # the bytes moved once the last traced row's Q tile has met the tile
    first = traces[0]
    order = [s.block for s in first if not s.sink]
    read, written = costmodel.fa1_traffic(t, n, d, bq, bk, kinds == "skip", order=order)
    size = _dtype_bytes(rep, q)
    end = int(read[-1, -1] + written[-1, -1]) * size
    standard = costmodel.hbm_bytes_standard(n, d, dtype_bytes=size, n_q=t)
    sram = costmodel.tile_bytes(bq, bk, d, size, max(4, size))
    on_chip = (f"on chip: one tile, {bytes_text(sram)}; standard attention (S and P through "
               f"HBM) moves {bytes_text(standard)}")
    q0, q1 = tiles[0] * bq, min(t, (tiles[-1] + 1) * bq)
    steps, at = [], 0
    for kk in range(min(map(len, traces))):
        s = first[kk]
        if not s.sink:
            at = order.index(s.block)
        steps.append({
            "title": attention_heading(s),
            "skipped": all(tr[kk].masked for tr in traces),
            "state": _attention_state([tr[kk] for tr in traces]),
            "lit": None if s.sink else _lit(m, bq, bk, q0, q1, s.start, s.stop),
            "sections": _attention_sections(queries, traces, kk),
            "bytes": _bytes(read[at, iq] * size, written[at, iq] * size, end, on_chip),
        })
    lse = np.asarray(res.lse)
    if len(queries) == 1:
        where = f"query {queries[0]} is in Q tile {iq} (rows {q0}:{q1})"
    else:
        where = f"{queries_text(queries)} are in {_tiles_text(tiles)} (rows {q0}:{q1})"
    doc = {
        "kind": "attention", "unit": "tile",
        "title": f"osm attention: batch {b}, head {h}, {_query_words(queries)}",
        "intro": [f"block_q {bq}, block_k {bk}: {where}; start m = -inf, l = 0, O = 0",
                  ATTENTION_NOTE],
        "matrix": m, "steps": steps,
        "bytes_about": (f"FA1's Algorithm 1 for one head (K/V tiles outer, Q tiles inner; {size} "
                        f"B an element): the bytes moved once Q tile {iq} has met the tile"),
        "final": [f"LSE = m + ln l = {g(lse[(b, h, x)[3 - lse.ndim:]], 10)}" + (
            f" (query {x})" if len(queries) > 1 else "") for x in queries]
        if lse.ndim in (2, 3) else [],  # (B, H, N), or (H, N) for inputs without a batch
    }
    if len(queries) > 1:
        o = next((np.size(x.o) for tr in traces for x in tr if x.o is not None), 0)
        doc["state_head"] = ["query", "tile max", "m", "α", "l", f"O[:{min(4, o)}]", "‖O‖"]
    return doc


def _query_words(queries) -> str:
    return f"query {queries[0]}" if len(queries) == 1 else queries_text(queries)


def backward_doc(rep, q, k, opts) -> dict:
    """`osm backward`'s page: FA2's backward loop (K/V tiles outer, Q tiles inner) over the
    tiles the traced key row and the traced query rows meet, in the loop's order; each tile's
    arithmetic as `osm backward --explain` prints it (P, dP, D, dS = P∘(dP − D), then the
    gradients before, the tile's share and after)."""
    res = rep.result
    b, h, _ = res.trace.at
    queries, traces = _rows(res)
    key, bq, bk = res.trace.key, res.tiles.block_q, res.tiles.block_k
    t, n, d, kinds = _head(q, k, opts, bq, bk)
    m = _matrix(q, k, opts, kinds, b, h, bq, bk, queries, key)
    n_q, n_k = kinds.shape
    tiles, jk = sorted({x // bq for x in queries}), key // bk
    read, written = costmodel.fa1_traffic(t, n, d, bq, bk, kinds == "skip", backward=True)
    size = _dtype_bytes(rep, q)
    end = int(read[-1, -1] + written[-1, -1]) * size
    by_q = {s.block: s for s in res.trace.key_steps}  # Q tile -> the key row's step
    by_k = [{s.block: s for s in tr} for tr in traces]  # per row: K/V tile -> its step
    norms = {"dK": 0.0, "dV": 0.0, **{qi: 0.0 for qi in queries}}
    steps = []
    for j, ii in [(j, ii) for j in range(n_k) for ii in range(n_q) if j == jk or ii in tiles]:
        ks = by_q.get(ii) if j == jk else None
        rows = [(qi, by_k[r].get(j)) for r, qi in enumerate(queries) if qi // bq == ii]
        skipped = kinds[ii, j] == "skip"
        sections = []
        if skipped:
            sections.append({"title": "", "lines": [
                "skipped, not computed: the mask hides the tile; dQ, dK, dV unchanged"]})
        if ks is not None:
            lines = [] if skipped else backward_key_lines(ks, res.options.softmax_scale, key)
            lines += [f"dK_j += scale·dSᵀ·Q_i: ‖dK_j‖ = {arrow(norms['dK'], ks.dk_norm, 6)}",
                      f"dV_j += Pᵀ·dO_i: ‖dV_j‖ = {arrow(norms['dV'], ks.dv_norm, 6)}"]
            norms["dK"], norms["dV"] = ks.dk_norm, ks.dv_norm
            sections.append({"title": f"key {key}, down Q tile {ii}'s rows", "lines": lines})
        for qi, qs in rows:
            if qs is None:
                continue
            lines = [] if skipped else backward_query_lines(qs, res.options.softmax_scale)
            lines.append(f"dQ_i += scale·dS·K_j: ‖dQ_i‖ = {arrow(norms[qi], qs.dq_norm, 6)}")
            norms[qi] = qs.dq_norm
            sections.append({"title": f"query {qi}, along K/V tile {j}'s keys", "lines": lines})
        q0, q1, c0, c1 = ii * bq, min(t, (ii + 1) * bq), j * bk, min(n, (j + 1) * bk)
        steps.append({
            "title": f"K/V tile {j} (keys {c0}:{c1}) × Q tile {ii} (rows {q0}:{q1})",
            "lit": _lit(m, bq, bk, q0, q1, c0, c1), "skipped": bool(skipped),
            "state": [[f"‖dK_j‖, key {key}", g(norms["dK"], 6)],
                      [f"‖dV_j‖, key {key}", g(norms["dV"], 6)],
                      *([f"‖dQ_i‖, query {qi}", g(norms[qi], 6)] for qi in queries)],
            "sections": sections,
            "bytes": _bytes(read[j, ii] * size, written[j, ii] * size, end,
                            "on chip: K_j, V_j, dK_j, dV_j and one Q tile's rows"),
        })
    meet = (f"query {queries[0]} (Q tile {tiles[0]})" if len(queries) == 1 else
            f"{queries_text(queries)} ({_tiles_text(tiles)})")
    return {
        "kind": "backward", "unit": "tile",
        "title": f"osm backward: batch {b}, head {h}, key {key}, {_query_words(queries)}",
        "intro": [f"FA2's backward: for each K/V tile (outer), each Q tile (inner): dV_j += "
                  "Pᵀ·dO_i, dS = P∘(dP − D), dQ_i += scale·dS·K_j, dK_j += scale·dSᵀ·Q_i. The "
                  f"steps are the tiles key {key} (K/V tile {jk}) and {meet} meet.",
                  BACKWARD_NOTE],
        "matrix": m, "steps": steps,
        "bytes_about": (f"FA1's Algorithm 4 for one head (K/V tiles outer, Q tiles inner; {size} "
                        "B an element): the backward's own traffic"),
        "final": [],
    }


__all__ = ["attention_doc", "backward_doc", "page", "trace_doc"]
