"""What `attention` and `attention_backward` return (Attention, Backward), as tables in Jupyter:
the summary lines osm attention and osm backward print (shapes, conventions, tiles) and the
traced rows' tile tables, as core/notebook.py's plain Tables. The summary's plain lines are
written here once: the terminal's summaries (present/attention.py, present/backward.py) take
them from here too.

Leaves out: the errors against a reference and a kernel model's verdict (reports/, present/),
styling.

Example: attention(q, k, v, causal=True)._repr_html_() starts '<div class="osm-record">'
"""

from __future__ import annotations

import numpy as np

from osm_cli.core.notebook import Table, arrow, elided, num


def convention_rows(res) -> list:
    """The summary's first lines, the forward's and the backward's alike (an Attention or
    Backward record): shapes, scale, causal, window, mask and the kernels' inputs."""
    o, sh = res.options, res.shapes
    window = "none" if o.window is None else f"left {o.window[0]}, right {o.window[1]}"
    return [
        ("shapes", f"Q {sh.q}  K {sh.k}  V {sh.v}"),
        ("softmax scale", f"{o.softmax_scale:.8g}"),  # not α, the scale factor: a word, a number
        ("causal", f"yes ({o.causal_align})" if o.causal else "no"),
        ("window", window),
        ("mask", o.mask),
        *kernel_inputs_rows(o),
    ]


def kernel_inputs_rows(o) -> list:
    """The summary's lines for the kernels' inputs a run took (softcap, ALiBi, sinks, a varlen
    or paged batch); none for a plain run. o: an Attention or Backward record's options."""
    rows = []
    if o.batch:
        rows.append(("batch", o.batch))
    if o.softcap is not None:
        rows.append(("softcap", f"{o.softcap:g}: s → {o.softcap:g}·tanh(s/{o.softcap:g})"))
    if o.alibi:
        rows.append(("ALiBi", "−slope·|i + s − t − j| added to the scores"))
    if o.sinks:
        rows.append(("sinks", "per-head logits in the denominator (trace: last row)"))
    if o.mods:
        rows.append(("mods", o.mods))
    return rows


def partial_text(res) -> str:
    """" (N partial, masked)" after the computed tiles under a mask_mod: the block mask's
    partial tiles, the only ones the mask is applied on; "" otherwise."""
    if "mask_mod" not in res.options.mods:
        return ""
    t = res.tiles
    return f" ({t.partial} partial, masked; {t.computed - t.partial} full)"


def tiles_text(res) -> str:
    """"block_q 4, block_k 2: 6 computed, 2 skipped of 8"."""
    t = res.tiles
    return (f"block_q {t.block_q}, block_k {t.block_k}: {t.computed} computed"
            f"{partial_text(res)}, {t.skipped} skipped of {t.total}")


def attention_tables(res) -> list[Table]:
    """An Attention: its summary, then the traced row's K/V tiles (m, α, l, O)."""
    rows = convention_rows(res)
    if res.options.one_shot:
        rows.append(("tiles", "none: plain attention computes all scores at once"))
    else:
        rows += [("tiles", tiles_text(res)),
                 ("rescales", f"{res.counters.rescales} times a tile raised a row's m (l and O "
                  "then × α < 1)")]
    rows.append(("fully masked rows", f"{res.counters.masked_rows} (output 0, LSE "
                                      f"{res.options.masked_lse})"))
    tables = [Table("attention", (), tuple(rows))]
    if res.trace.steps:
        b, h, i = res.trace.at
        d = res.shapes.v[-1]
        o_head = f"O[:{min(3, d)}] of {d}"

        def state(s) -> tuple:
            o = "" if s.o is None else "[" + ", ".join(num(x, 4) for x in np.ravel(s.o)[:3]) + "]"
            return ("skipped" if s.masked else num(s.block_max, 7), arrow(s.m_prev, s.m, 7),
                    "" if s.masked else num(s.alpha, 7), arrow(s.l_prev, s.l, 7),
                    "" if s.masked else o, "" if s.masked else num(s.o_norm, 7))

        def where(s) -> tuple:
            return ("sink" if s.sink else str(s.block), "" if s.sink else f"{s.start}:{s.stop}")

        head = ("tile max", "m", "α", "l", o_head, "‖O‖")
        if len(res.trace.rows) > 1:  # a line per row under each tile: the vectors of a Q tile
            cells, note = _row_lines(res.trace, where, state, 9)
            tables.append(Table(f"trace of batch {b}, head {h}, {_queries(res.trace.queries)}: "
                                "start m = -inf, l = 0, O = 0 (a line per row under each tile)",
                                ("tile", "keys", "query", *head), cells, note))
            return tables
        shown, note = elided(res.trace.steps, "tiles")
        cells = [("⋮",) * 8 if s is None else (*where(s), *state(s)) for s in shown]
        tables.append(Table(f"trace of batch {b}, head {h}, query {i}: start m = -inf, l = 0, "
                            "O = 0", ("tile", "keys", *head), tuple(cells), note))
    return tables


def _row_lines(trace, where, state, width: int) -> tuple[tuple, str | None]:
    """Several traced rows' cells: under each tile (where(step) on its first line only) a line
    per row, its query and state(step); the elision's ⋮ lines `width` cells wide."""
    shown, note = elided(range(min(map(len, trace.rows))), "tiles")
    cells = []
    for k in shown:
        if k is None:
            cells.append(("⋮",) * width)
            continue
        for n, (qi, tr) in enumerate(zip(trace.queries, trace.rows, strict=True)):
            cells.append((*(where(tr[k]) if n == 0 else ("", "")), str(qi), *state(tr[k])))
    return tuple(cells), note


def _queries(queries) -> str:
    """'queries 0:4' for consecutive rows, 'queries 0, 2, 5' otherwise (as the terminal's)."""
    qs = list(queries)
    if len(qs) > 2 and qs == list(range(qs[0], qs[-1] + 1)):
        return f"queries {qs[0]}:{qs[-1] + 1}"
    return "queries " + ", ".join(map(str, qs))


def backward_tables(res) -> list[Table]:
    """A Backward: its summary, then the traced key's dK_j, dV_j over the Q tiles and the
    traced query's dQ_i over the K/V tiles."""
    d = np.asarray(res.delta, dtype=np.float64)
    finite = d[np.isfinite(d)]
    rows = [*convention_rows(res),
            ("forward", "osm's own" if res.own_forward else "given O and LSE"),
            ("D = rowsum(dO∘O)", f"{num(finite.min(), 6)} to {num(finite.max(), 6)}"
             if finite.size else "none"),
            ("tiles", tiles_text(res)),
            ("fully masked rows", f"{res.counters.masked_rows} (LSE ±inf: P = 0, no gradient)")]
    b, h, i = res.trace.at

    def trace(steps, key: bool):
        shown, note = elided(steps, "tiles")
        cells = []
        for s in shown:
            if s is None:
                cells.append(("⋮",) * (6 if key else 5))
                continue
            left = (str(s.block), f"{s.start}:{s.stop}", *(("skipped", "") if s.masked else (
                num(s.p_max, 8), num(s.ds_sum, 8))))
            cells.append((*left, num(s.dk_norm, 8), num(s.dv_norm, 8)) if key else
                         (*left, num(s.dq_norm, 8)))
        return tuple(cells), note

    key_rows, key_note = trace(res.trace.key_steps, True)
    tables = [Table("attention backward", (), tuple(rows)),
              Table(f"key {res.trace.key} of batch {b}, kv head {res.trace.kv_head}: dK_j, dV_j "
                    "over the Q tiles, start 0", ("Q tile", "rows", "P max", "Σ dS", "‖dK_j‖",
                                             "‖dV_j‖"), key_rows, key_note)]
    if len(res.trace.rows) > 1:  # a line per traced row under each K/V tile
        cells, note = _row_lines(
            res.trace, lambda s: (str(s.block), f"{s.start}:{s.stop}"),
            lambda s: (*(("skipped", "") if s.masked else (num(s.p_max, 8), num(s.ds_sum, 8))),
                       num(s.dq_norm, 8)), 6)
        tables.append(Table(f"{_queries(res.trace.queries)} of batch {b}, head {h}: dQ_i over "
                            "the K/V tiles, start 0 (a line per row under each tile)",
                            ("K/V tile", "keys", "query", "P max", "Σ dS", "‖dQ_i‖"),
                            cells, note))
        return tables
    query_rows, query_note = trace(res.trace.steps, False)
    tables.append(Table(f"query {i} of batch {b}, head {h}: dQ_i over the K/V tiles, start 0",
                        ("K/V tile", "keys", "P max", "Σ dS", "‖dQ_i‖"), query_rows, query_note))
    return tables


__all__ = ["attention_tables", "backward_tables", "convention_rows", "kernel_inputs_rows",
           "partial_text", "tiles_text"]
