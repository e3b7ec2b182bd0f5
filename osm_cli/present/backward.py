"""osm backward's tables: the summary, the traced key row's dK_j and dV_j over the Q tiles, the
traced query row's dQ_i over the K/V tiles, the traced rows beside the reference, and under
--dtype each gradient's verdict.

Leaves out: computing anything (reports/backward.py), the rule's own line (verdicts.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from rich import box
from rich.console import Group
from rich.text import Text

from osm_cli.flash.notebook import convention_rows, tiles_text

from .attention import kernel_text
from .format import Table, agreement, fill, fit, kv_table, num, pass_fail
from .verdicts import rounding_text, rule_text

GRADS = ("dq", "dk", "dv")


def backward_summary(rep) -> Table:
    """Shapes, conventions, D, tile counts and each gradient's error against the reference."""
    r = rep.result
    d = np.asarray(r.delta, dtype=np.float64)
    forward = ("osm's own (--o and --lse take a kernel's saved O and LSE)" if r.own_forward
               else "given O and LSE (a kernel's saved forward)")
    rows = [*convention_rows(r)]
    if rep.shown:
        what = ("its forward gave O and LSE" if r.own_forward else
                "not run: the given O and LSE are the forward's")
        line = kernel_text(rep.kernel, mma=rep.mma,
                           dtype=None if rep.model is None else rep.model.name)
        fa4 = rep.kernel in ("fa4", "fa4-sm100")
        how = ("its own arithmetic" if rep.kernel_arith else
               "osm's arithmetic, BLAS matmuls")  # kernel_backward.py, or osm's flash model
        bwd = (f"FA4's, {how}: its tiles below, GQA's dK, dV summed in float32" if fa4
               else f"FA2's, {how}: tiles below")
        rows.append(("kernel", f"{line}; {what}; the backward: {bwd}"
                     if rep.kernel != "tiles" else f"{line}; {what}"))
    rows += [
        ("forward", forward),
        ("D = rowsum(dO∘O)", _range(d)),
        ("tiles", tiles_text(r)),
        ("fully masked rows", f"{r.counters.masked_rows} (LSE ±inf: P = 0, no gradient)"),
    ]
    if rep.errors is None:
        rows.append(("reference", "skipped (--no-reference)"))
    else:
        for name, label in (("dq", "dQ"), ("dk", "dK"), ("dv", "dV"), ("dsink", "dsink")):
            if name not in rep.errors:
                continue
            e = rep.errors[name]
            rows.append((f"max |{label} − ref|", Text.assemble(
                num(e["max_abs_err"], 3), " (relative ", num(e["max_rel_err"], 3), ")")))
    return kv_table(rows)


def _range(d: np.ndarray) -> Text | str:
    """'lo to hi' of D over the query rows, one number when all agree."""
    if not d.size:
        return "no query rows"
    lo, hi = float(d.min()), float(d.max())
    return num(lo, 6) if lo == hi else Text.assemble(num(lo, 6), " to ", num(hi, 6))


def backward_precision(rep) -> Table:
    """backward --dtype: the model, the inputs' rounding and each gradient's verdict."""
    rows = [("precision", rep.model.describe_backward(rep.kernel)),
            (f"inputs in {rep.model.name}", rounding_text(rep.notes))]
    for g in rep.verdicts:
        rows += [(f"max |{g.label} − ref64|", Text.assemble(
                      num(g.err64, 3), "  (plain ", num(g.plain_err64, 3), ")")),
                 (f"{g.label} rule", rule_text(g.rule, g.label))]
    if rep.verdicts:
        rows.append(("verdict", pass_fail(all(g.rule.passed for g in rep.verdicts))))
    return kv_table(rows)


def backward_heads(rep) -> list:
    """What comes before the traces: the summary, and under --dtype the precision block."""
    heads = [backward_summary(rep)]
    if rep.model is not None:
        heads.append(backward_precision(rep))
    return heads


def key_trace(rep, width: int = 100, show_all: bool = False) -> Group:
    """Key row J's dK_j and dV_j accumulating over the Q tiles."""
    return fit(lambda d: _trace(rep, d, show_all, key=True), width, (8, 7, 6, 5, 4))


def query_trace(rep, width: int = 100, show_all: bool = False) -> Group:
    """Query row I's dQ_i accumulating over the K/V tiles."""
    return fit(lambda d: _trace(rep, d, show_all, key=False), width, (8, 7, 6, 5, 4))


def _trace(rep, d: int, show_all: bool, key: bool) -> Group:
    r = rep.result
    b, h, i = r.trace.at
    many = not key and len(r.trace.queries) > 1  # several query rows: a line per row under a tile
    steps = r.trace.key_steps if key else r.trace.steps
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    nc = {"justify": "right", "no_wrap": True}
    names = ("Q tile", "rows", "P max", "Σ dS", "‖dK_j‖", "‖dV_j‖") if key else (
        "K/V tile", "keys", *(("query",) if many else ()), "P max", "Σ dS", "‖dQ_i‖")
    for name in names:
        t.add_column(name, **nc)

    def cells(s, query=None):
        tile = str(s.block) if s.kind is None else f"{s.block} {s.kind[0]}"  # full / partial
        out = [tile, f"{s.start}:{s.stop}", *(() if query is None else (query,))]
        if s.masked:
            out += [Text("skipped", style="dim"), ""]
        else:
            out += [num(s.p_max, d), num(s.ds_sum, d)]
        return out + ([num(s.dk_norm, d), num(s.dv_norm, d)] if key else [num(s.dq_norm, d)])

    what = "sequence" if r.options.batch else "batch"
    if many:
        from .rows import queries_text, tile_groups

        def line(n, k, first):
            out = cells(r.trace.rows[n][k], str(r.trace.queries[n]))
            if not first:
                out[0] = out[1] = ""
            return out

        tile_groups(t, r.trace.rows, show_all, line)
        return Group(Text(f"{queries_text(r.trace.queries)} of {what} {b}, head {h}: dQ_i over the "
                          "K/V tiles, start 0" + _kinds_note(steps)), t)
    fill(t, len(steps), lambda n: cells(steps[n]), show_all, unit="tiles")
    if key:
        title = (f"key {r.trace.key} of {what} {b}, kv head {r.trace.kv_head} ({_heads_of(r)}): "
                 "dK_j, dV_j over the Q tiles, start 0")
    else:
        title = f"query {i} of {what} {b}, head {h}: dQ_i over the K/V tiles, start 0"
    return Group(Text(title + _kinds_note(steps)), t)


def _kinds_note(steps) -> str:
    """The block mask's letters, as the forward's trace says them (under a mask_mod)."""
    if any(s.kind is not None for s in steps):
        return "\nblock mask: f a full tile (no mask applied), p a partial one (masked)"
    return ""


def _heads_of(r) -> str:
    """The query heads that read the traced kv head: 'query head 2' or 'query heads 3–5'."""
    first = r.trace.kv_head * r.trace.group
    if r.trace.group == 1:
        return f"query head {first}"
    return f"query heads {first}–{first + r.trace.group - 1}"


def traced_rows(rep, show_all: bool = False, width: int = 100) -> Group:
    """The traced rows as written (dQ_i, dK_j, dV_j), one component a line, and how far each
    is from the float64 reference; several traced query rows' dQ_i a line a row first
    (rows.row_lines), then dK_j and dV_j."""
    rows = rep.traced_rows
    r = rep.result
    xs, refs, parts = {}, {}, []
    if len(r.trace.queries) > 1:
        from .rows import row_lines

        parts.append(row_lines("dQ_i of the traced query rows", "dQ_i", r.trace.queries, rows["dq"],
                               None if rep.ref_rows is None else rep.ref_rows["dq"], show_all,
                               width))
        names = (("dk", f"dK[{r.trace.key}]"), ("dv", f"dV[{r.trace.key}]"))
    else:
        names = (("dq", f"dQ[{r.trace.at[2]}]"), ("dk", f"dK[{r.trace.key}]"),
                 ("dv", f"dV[{r.trace.key}]"))
    for name, label in names:
        xs[label] = np.asarray(rows[name], dtype=np.float64)
        if rep.ref_rows is not None:
            refs[label] = np.asarray(rep.ref_rows[name], dtype=np.float64)
    n = max(len(x) for x in xs.values())

    def make(digits):
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        t.add_column("j", justify="right")
        for label in xs:
            t.add_column(label, justify="right", no_wrap=True)

        def line(j):
            return [str(j), *(num(x[j], digits) if j < len(x) else Text("")
                              for x in xs.values())]

        return Group(Text("traced rows of the gradients"), fill(t, n, line, show_all))

    parts.append(fit(make, width, (10, 8, 7, 6, 5)))
    for label, ref in refs.items():
        diff = float(np.abs(xs[label] - ref).max(initial=0.0))
        parts.append(agreement(f"{label} vs the float64 reference", diff))
    return Group(*parts)


def key_step_frame(headers, rep, upto: int, width: int = 100) -> Group:
    """backward --step, first part: the key trace up to Q tile `upto` (lit), its arithmetic."""
    from .explain import backward_key_step
    from .stepmode import frame

    r = rep.result
    return frame(headers, r.trace.key_steps, upto, "Q tile",
                 lambda shown: key_trace(replace(rep, result=replace(r, trace=replace(
                     r.trace, key_steps=tuple(shown)))), width), backward_key_step(r, upto))


def query_step_frame(headers, rep, upto: int, width: int = 100) -> Group:
    """backward --step, second part: the query trace (every traced row) up to K/V tile
    `upto`, the tile's lines lit, and its arithmetic."""
    from .explain import backward_query_step
    from .stepmode import frame

    r = rep.result

    def upto_step(shown):
        n = len(shown)
        res = replace(r, trace=replace(r.trace, rows=tuple(tr[:n] for tr in r.trace.rows)))
        return query_trace(replace(rep, result=res), width)

    return frame(headers, r.trace.steps, upto, "K/V tile", upto_step,
                 backward_query_step(r, upto), lines=max(1, len(r.trace.rows)))


def backward_step_frame(headers, rep, k: int, width: int = 100) -> Group:
    """backward --step's frame k of both traces in turn, so that b goes back across them: the
    key's Q tiles first (FA2's inner loop, for one K/V tile), then the query's K/V tiles."""
    from .stepmode import step_hint

    r = rep.result
    nk = len(r.trace.key_steps)
    if k < nk:
        group, unit, at, n = key_step_frame(headers, rep, k, width), "Q tile", k, nk
    else:
        group = query_step_frame(headers, rep, k - nk, width)
        unit, at, n = "K/V tile", k - nk, len(r.trace.steps)
    total = nk + len(r.trace.steps)
    hint = step_hint(k, total, "step")
    hint.plain = hint.plain.replace(f"step {k + 1} of {total}",
                                    f"step {k + 1} of {total} ({unit} {at + 1} of {n})", 1)
    return Group(*group.renderables[:-1], hint)


def backward_results(rep, show_all: bool = False, width: int = 100) -> Group:
    """What follows the traces: the traced rows beside the reference."""
    return Group(traced_rows(rep, show_all, width))


__all__ = ["backward_heads", "backward_results", "backward_step_frame", "key_step_frame",
           "key_trace", "query_step_frame", "query_trace", "traced_rows"]
