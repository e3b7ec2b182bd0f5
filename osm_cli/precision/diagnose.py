"""What osm check says beyond FlashAttention's rule: one verdict per tensor (out, lse, dq, dk,
dv, dsink) under the chosen rule (fa or model), the exact zero of the rows that see no key, the
per-head bias, and on a failure where the failing rows are (locate.py) and which other
convention the kernel fits (probe.py).

Leaves out: the references and FlashAttention's rule (check.py, rule.py, gradcheck.py), the
rules themselves (strict.py), printing (present/).

Example: [t.tensor for t in check(o, q, k, v, "bf16").failures]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from osm_cli.flash.masks import make_band
from osm_cli.flash.options import default_blocks
from osm_cli.flash.shapes import as_bhnd, kv_head

from .locate import BLOCKS, Location, locate, tile_map
from .probe import Case, Finding, Float64Heads
from .probe import probe as run_probe
from .rule import Rule, lse_errors, max_abs
from .strict import (
    CANCEL_WHY,
    LSE_WHY,
    head_bias,
    lse_floor,
    model_rule,
    nonzero_masked,
    other_rules,
)


@dataclass(frozen=True)
class TensorVerdict:
    """One tensor judged: the rule that decided (fa or model) and FlashAttention's beside it,
    what else failed it, where its rows fail and which convention it fits."""

    tensor: str  # out, lse, dq, dk, dv
    rule: str  # fa or model
    judged: Rule  # the deciding rule's numbers (err, bound)
    fa: Rule  # FlashAttention's rule, always reported
    passed: bool
    reasons: tuple[str, ...] = ()  # failures beyond the rule's bound, in words
    location: Location | None = None
    findings: tuple[Finding, ...] = ()

    @property
    def where(self) -> str:
        return "" if self.location is None else self.location.summary


def _blocks(kernel: str | None, d: int, dv: int, causal: bool) -> tuple[int | None, int | None]:
    """The named kernel's (block_q, block_k); (None, None) when no kernel was named."""
    if kernel is None:
        return None, None
    if kernel == "tiles":
        return default_blocks(d)
    from .presets import preset

    p = preset(kernel)
    return p.q_tile(d), p.block_k(d, dv, causal)


def diagnose(rep, *, out, ref, ref_d, ref_lse, lse, lse_err, row_err, model, q, k, v, opts,
             dt, rule: str, probe: bool, rules_table: bool, blocks_known: bool,
             given: dict, top: int, lse_base: str = "e") -> dict:
    """CheckReport's fields beyond FlashAttention's verdict (see check.check)."""
    from .check import lse_rows, packed_offsets, rank_heads, rows_view, view_of, worst

    view = view_of(opts)
    out4 = rows_view(out, view)
    ref4 = rows_view(ref, view)
    no_key = np.isneginf(lse_rows(ref_lse, view)) if opts.sinks is None else None
    nz = (nonzero_masked(out4, no_key) if no_key is not None
          else np.zeros(row_err.shape, dtype=bool))
    model4 = None if model is None else rows_view(model.out, view)
    bias = head_bias(out4, ref4, model4)
    model_lse = None
    if model is not None and lse is not None and model.lse is not None:
        try:
            model_lse = max_abs(lse_errors(np.asarray(model.lse), ref_lse))
        except ValueError:
            model_lse = None
    kname = rep.kernel
    bq, bk = _blocks(kname if blocks_known else None, np.shape(q)[-1], np.shape(v)[-1],
                     opts.causal)
    cu_q, cu_k = packed_offsets(opts), packed_offsets(opts, "k")

    def judge(name, fa: Rule, err64: float, model_err, rows, reasons=(), floor=0.0,
              why=CANCEL_WHY):
        r = fa if rule == "fa" else model_rule(err64, model_err, kname or "kernel", floor, why)
        over = ~(rows <= r.bound)
        return r, over, bool(r.passed and not reasons)

    verdicts, overs = [], {}
    vd = rep.verdict
    reasons = []
    if nz.any():
        reasons.append(f"{int(np.count_nonzero(nz))} of {int(np.count_nonzero(no_key))} rows "
                       "that see no key are not exactly 0")
    flagged = [b for b in bias if b.flagged]
    if rule == "model" and flagged:
        # a varlen batch's bias pools each head's rows of every sequence (its batch 0)
        varlen = cu_q is not None
        reasons.append(", ".join(f"head {b.head}"
                                 + (" (all sequences)" if varlen else f" of batch {b.batch}")
                                 + f" biased {b.bias:+.2g}"
                                 for b in flagged[:3]) + (", …" if len(flagged) > 3 else ""))
    r, over, ok = judge("out", vd.rule, vd.err, rep.model_err, row_err, reasons)
    over = over | nz
    if rule == "model":
        for b in flagged:
            over[b.batch, b.head] = True
    verdicts.append(["out", r, vd.rule, ok, tuple(reasons)])
    overs["out"] = over
    if lse is not None:
        le = lse_rows(lse_err, view)
        r, over, ok = judge("lse", vd.lse, vd.lse_err, model_lse, le, floor=lse_floor(ref_lse),
                            why=LSE_WHY)
        verdicts.append(["lse", r, vd.lse, ok, ()])
        overs["lse"] = over
    for g in rep.grads:
        r, over, ok = judge(g.name, g.rule, g.err64, g.model_err, g.row_err, floor=g.floor)
        verdicts.append([g.name, r, g.rule, ok, ()])
        overs[g.name] = over
    failing = {name: _worst_heads(overs[name], _row_score(name, row_err, lse_err, rep, view))
               for name, _, _, ok, _ in verdicts if not ok}
    locations = {}
    for name in failing:
        if name == "dsink":  # one value per query head: its failing heads say where
            loc = locate(overs[name], name, rows="query")
            locations[name] = replace(loc, patterns=tuple(
                p for p in loc.patterns if "row" not in p and "tile" not in p))
            continue
        key_rows = name in ("dk", "dv")
        locations[name] = locate(overs[name], name, rows="key" if key_rows else "query",
                                 block=bk if key_rows else bq, cu_seqlens=cu_k if key_rows
                                 else cu_q, no_key=None if key_rows else no_key)
    found, tmap = None, None
    if failing and probe:
        case = replace(_case(rep, out4, ref_d, view, lse, ref_lse, q, k, v, opts, failing,
                             given), lse_base=str(lse_base))
        found = run_probe(case)
        if "out" in failing and case.dense and case.k.shape[2] and _plain_scores(opts):
            tmap = _tile_map(case, overs["out"], failing["out"][0], locations["out"].block, bk)
    tensors = tuple(TensorVerdict(name, rule, r, fa, ok, why, locations.get(name),
                                  () if found is None else found.of(name))
                    for name, r, fa, ok, why in verdicts)
    rows = rep.rows
    # the worst rows ranked by the tensor that fails under the deciding rule: by the LSE when it
    # fails and the output does not (check ranked them by FlashAttention's verdicts)
    fails = {name for name, _, _, ok, _ in verdicts if not ok}
    by_lse = "lse" in fails and "out" not in fails
    if rows and by_lse != (vd.lse is not None and not vd.lse.passed and vd.rule.passed):
        rows = worst(out, ref_d, lse_err, vd.rule.bound, dt, view, len(rows), by_lse=by_lse,
                     cu_seqlens=cu_q)[0]
    # … and the worst heads too, with that tensor's rows over its bound under the deciding
    # rule (a varlen batch's a sequence at a time: batch is the rows' sequence, as above)
    heads = rank_heads(row_err, overs["lse" if by_lse else "out"], top,
                       lse_err=None if lse_err is None else lse_rows(lse_err, view),
                       by_lse=by_lse, cu_seqlens=cu_q)
    table = ()
    if rules_table:
        ts = {"out": (out, ref)}
        if lse is not None:
            ts["lse"] = (lse, ref_lse)
        for g in rep.grads:
            ts[g.name] = (given[g.name], g.ref_d)
        table = other_rules(ts, dt)
    return {"tensors": tensors, "model_lse_err": model_lse, "bias": bias,
            "no_key_rows": 0 if no_key is None else int(np.count_nonzero(no_key)),
            "probe": found, "tile_map": tmap, "other_rules": table, "rows": rows,
            "heads": heads, "ranked_by": "lse" if by_lse else "out", "varlen": cu_q is not None}


def _row_score(name, row_err, lse_err, rep, view):
    from .check import lse_rows

    if name == "out":
        return row_err
    if name == "lse":
        return lse_rows(lse_err, view)
    return next(g.row_err for g in rep.grads if g.name == name)


def _worst_heads(over, score) -> tuple[tuple[int, int], ...]:
    """The (batch, head) pairs with a failing row, worst (largest row error) first."""
    s = np.where(over, np.nan_to_num(score, nan=np.inf), -np.inf).max(axis=-1)
    pairs = [(int(b), int(h)) for b, h in zip(*np.nonzero(over.any(axis=-1)), strict=True)]
    return tuple(sorted(pairs, key=lambda x: -s[x]))


def _plain_scores(opts) -> bool:
    return (opts.mask is None and opts.softcap is None and opts.alibi_slopes is None
            and opts.sinks is None and not opts.packing.active)


def _case(rep, out4, ref_d, view, lse, ref_lse, q, k, v, opts, failing, given) -> Case:
    """The probe's view of a failed check: (B, H, …) float64 arrays, options in bhnd."""
    from .check import lse_rows, rows_view, view_of

    dense = not opts.packing.active
    got = {"out": Float64Heads(out4)}
    refs = {"out": rows_view(ref_d, view)}
    bounds = {"out": rep.verdict.rule.bound}
    if lse is not None:
        got["lse"] = lse_rows(np.asarray(lse, dtype=np.float64), view)
        refs["lse"] = lse_rows(ref_lse, view)
        bounds["lse"] = rep.verdict.lse.bound
    for g in rep.grads:
        if g.name == "dsink":  # per head, no rows: only the factor per head is tried
            got[g.name] = np.asarray(given[g.name], dtype=np.float64).reshape(1, -1, 1)
            refs[g.name] = np.asarray(g.ref_d).reshape(1, -1, 1)
            bounds[g.name] = g.rule.bound
            continue
        kv = "q" if g.name == "dq" else "k"
        gv = given[g.name]
        got[g.name] = Float64Heads(rows_view(np.asarray(gv), view_of(opts, kv)))
        refs[g.name] = rows_view(g.ref_d, view_of(opts, kv))
        bounds[g.name] = g.rule.bound
    if dense:
        q4, k4, v4 = (Float64Heads(as_bhnd(np.asarray(x), opts.layout, n))
                      for x, n in ((q, "Q"), (k, "K"), (v, "V")))
        o = replace(opts, layout="bhnd")
    else:
        q4 = k4 = v4 = np.zeros((0, 0, 0, 0))
        o = opts
    return Case(q4, k4, v4, o, got, refs, bounds,
                {n: f for n, f in failing.items() if n in got}, dense,
                packed=tuple(n for n in got if view_of(opts, "k" if n in ("dk", "dv") else "q")
                             == "packed" and n != "dsink"))


def _tile_map(case: Case, over, head, block_q: int, block_k: int | None):
    """The tile map of the worst failing head, at the kernel's block_k or the one of 64 and
    128 that explains more Q tiles."""
    b, h = head
    o = case.opts
    t, s = case.q.shape[2], case.k.shape[2]
    kv = kv_head(h, case.q.shape[1], case.k.shape[1])
    band = make_band(t, s, o.causal, o.causal_align, o.window)
    vis = None if band is None else (lambda i0, i1: band.visible(i0, i1, 0, s))
    ref4 = case.ref["out"]
    best = None
    for bk in ([block_k] if block_k else BLOCKS):
        m = tile_map(case.q[b, h], case.k[b, kv], case.v[b, kv], case.got["out"][b, h],
                     ref4[b, h], over[b, h], scale=o.scale_for(case.q.shape[-1]), visible=vis,
                     block_q=block_q, block_k=bk, batch=b, head=h)
        if best is None or len(m.explained) > len(best.explained):
            best = m
    return best


__all__ = ["TensorVerdict", "diagnose"]
