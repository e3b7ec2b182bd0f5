"""The --json documents: records in, plain dicts out, one function per document; and strict
JSON text for them (`dumps`; a long trace's steps and arrays are StepChunks and Pieces, which
present/stream.py writes as they are computed).

Keys and their order are the documents' contract (tests and scripts read them). The step
record's field names are mapped to the documented keys in `_state`, `step_doc` and `tile_doc`
only: alpha is written as "scale" (the rescale factor exp(m_old − m); the softmax scale is
"softmax_scale" in osm attention's and osm backward's documents alike, `_run_doc`, so that
"scale" is only ever α); a trace step's lazy skip and a tile's mask both as "skipped"; a tile's
block index and max as "tile" and "tile_max".
Leaves out: computing anything (the records come from reports/ and the lower layers).

Example: trace_doc(trace_report(np.array([2., 4., 1., 3.]), 2))["steps"][1]["l"] -> 1.5530018
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict

import numpy as np

from .bulk import LONG
from .diagnosis import diagnosis_doc


def jsonable(obj):
    """Plain Python values for strict JSON: arrays to lists, inf/nan to "inf", "-inf", "nan"."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biu":
            return obj.tolist()
        if obj.dtype.kind != "f":
            try:  # bfloat16 and float8 (ml_dtypes) hold their values exactly in float64
                obj = obj.astype(np.float64)
            except (TypeError, ValueError):
                return jsonable(obj.tolist())
        bad = ~np.isfinite(obj)
        if not bad.any():
            return obj.tolist()
        # Vectorized: swap the non-finite entries for their strings, then one tolist().
        named = obj.astype(object)
        named[np.isnan(obj)] = "nan"
        named[np.isposinf(obj)] = "inf"
        named[np.isneginf(obj)] = "-inf"
        return named.tolist()
    if isinstance(obj, (np.floating, float)):
        x = float(obj)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


class StepChunks:
    """A long trace's steps, written as a list of step_doc objects a chunk at a time: make()
    yields core.record.StepColumns (reports.trace.TraceReport.iter_columns); lazy adds
    "skipped". present/stream.py writes them."""

    def __init__(self, make: Callable[[], Iterable], lazy: bool = False):
        self.make, self.lazy = make, lazy


class Pieces:
    """An array of `shape` (1-D or 2-D) written piece by piece: make() yields (r0, r1, a, b,
    values) covering it in row order (reports.trace.TraceReport.pieces)."""

    def __init__(self, shape: tuple, make: Callable[[], Iterable]):
        self.shape, self.make = tuple(shape), make


def dumps(obj, indent: int | None = 2) -> str:
    """Strict JSON (RFC 8259): no NaN or Infinity literals.

    Indented when small; a large document (over ~100 kB) stays on one line, because json's
    C encoder, 10× faster, only runs without indentation.
    """
    doc = jsonable(obj)
    text = json.dumps(doc, allow_nan=False)
    if indent is not None and len(text) < 100_000:
        text = json.dumps(doc, indent=indent, allow_nan=False)
    return text


def _state(st) -> dict:
    """A step's running state: m and l before and after, and α (the key "scale")."""
    return {"m_prev": st.m_prev, "m": st.m, "scale": st.alpha, "l_prev": st.l_prev, "l": st.l}


def step_doc(st, lazy: bool = False) -> dict:
    """One block of a traced row (core.record.Step); lazy adds "skipped" (its lazy rescale)."""
    d = {"block": st.block, "start": st.start, "stop": st.stop, "block_max": st.block_max,
         **_state(st), "rescaled": st.rescaled}
    if st.block_l is not None:
        d.update(block_m=st.block_m, block_l=st.block_l, block_weight=st.block_weight)
    if lazy:
        d["skipped"] = st.lazy_skipped
    return d


STREAM_ABOVE = LONG  # scores: a larger trace's steps and arrays are written as computed


def _steps(rep, t: int, lazy: bool = False):
    """Trace t's steps as step_doc dicts: a list, or for a long trace StepChunks made on
    demand."""
    if rep.rows.size > STREAM_ABOVE:
        return StepChunks(lambda: rep.iter_columns(t), lazy)
    return [step_doc(st, lazy) for st in rep.iter_steps(t)]


def _array(rep, name: str):
    """A trace report's array `name`: whole, or for a long trace Pieces made on demand."""
    if rep.rows.size > STREAM_ABOVE:
        return Pieces(np.shape(rep.scores), lambda: rep.pieces(name))
    return rep.whole(name)


def tile_doc(s) -> dict:
    """One K/V tile of attention's traced row (core.record.Step); o_head is O's first
    components after the tile, unnormalised; "skipped" is a tile the mask hides."""
    doc = {"tile": s.block, "start": s.start, "stop": s.stop, "skipped": s.masked,
           "tile_max": s.block_max, **_state(s), "o_head": s.o, "o_norm": s.o_norm}
    if s.sink:  # not a tile: the sink (its logit in tile_max) joining the denominator
        doc["sink"] = True
    if s.pages is not None:
        doc["pages"] = list(s.pages)
    if s.p_max is not None:  # FP8: the largest P before rounding, and how many saturated
        doc["p_max"], doc["saturated"] = s.p_max, s.saturated
    if s.kind is not None:  # under a mask_mod: the block mask's kind, full or partial
        doc["kind"] = s.kind
    return doc


def kernel_inputs_doc(res) -> dict:
    """The kernels' inputs a run took (an Attention or Backward record); {} for a plain run."""
    doc, o = {}, res.options
    if o.batch:
        doc["batch"] = o.batch
    if o.softcap is not None:
        doc["softcap"] = o.softcap
    if o.alibi:
        doc["alibi"] = True
    if o.mods:
        doc["mods"] = o.mods
        doc["tiles_partial"] = res.tiles.partial
    if o.sinks:
        doc["sinks"] = True
    return doc


def trace_doc(rep) -> dict:
    """osm trace --json (report.TraceReport): the steps, the final state of every row, the
    references, and the keys of --form both, --dtype, --rescale-threshold and --order."""
    t = rep.trace
    doc = {
        "block": rep.block,
        "form": rep.form,
        "row": rep.row,
        "shape": list(rep.scores.shape),
        "steps": _steps(rep, 0, rep.lazy is not None),
        "m": t.m,
        "l": t.l,
        "lse": t.lse,
        "lse_base": "e",
        "probabilities": _array(rep, "probabilities"),
        "reference": _array(rep, "reference"),
        "naive": _array(rep, "naive"),
        "max_abs_diff": float(rep.max_diff.max()),
    }
    if len(rep.traces) == 2:
        doc["merge_steps"] = _steps(rep, 1)
        doc["forms_max_abs_diff"] = rep.forms_diff
    if rep.in_dtype:
        lt = rep.in_dtype[0]
        doc.update(dtype=lt.model.name, precision=lt.model.precision, scores_in_dtype=lt.scores,
                   reference_note="float64 stabilized softmax of the unrounded scores",
                   ulps=lt.ulps, rounding=vars(lt.rounding), p_underflowed=lt.p_underflowed,
                   alpha_underflowed=list(lt.alpha_underflowed))
        if lt.overflow_note:
            doc.update(scores_overflowed=lt.rounding.overflowed, overflow_note=lt.overflow_note)
    lazy, check = rep.lazy, rep.check
    if lazy is not None:
        doc.update(
            rescale_threshold=lazy.threshold, threshold_units="natural log",
            rescales=lazy.rescales, rescales_eager=lazy.rescales_eager,
            rescales_saved=lazy.rescales_saved, skipped_rescales=lazy.skipped,
            max_excess=lazy.max_excess, lazy_vs_eager_max_abs_diff=lazy.max_abs_diff,
        )
    if check is not None:
        doc.update(
            order=check.order, seed=rep.seed, block_order=check.indices,
            order_check={
                "forward_vs_order": check.p_order, "forward_vs_tree": check.p_tree,
                "order_vs_tree": check.p_order_tree, "lse_forward_vs_order": check.lse_order,
                "lse_forward_vs_tree": check.lse_tree,
            },
        )
    if rep.softcap is not None:
        doc["softcap"] = rep.softcap  # the steps and arrays are of the capped scores
    if rep.sink is not None:
        st = rep.sink_steps[0]
        doc["sink"] = {"sink": rep.sink, **_state(st)}
    return doc


def _run_doc(res) -> dict:
    """The keys of what a run was asked (an Attention or Backward record), for attention's and
    backward's documents alike: the shapes, softmax_scale, the masks, the kernels' inputs."""
    o, sh = res.options, res.shapes
    return {"shape_q": list(sh.q), "shape_k": list(sh.k), "shape_v": list(sh.v),
            "softmax_scale": o.softmax_scale, "causal": o.causal, "causal_align": o.causal_align,
            "window": None if o.window is None else list(o.window), "mask": o.mask,
            **kernel_inputs_doc(res)}


def attention_summary(res, errs: dict | None, ref_row) -> dict:
    """osm attention's summary and traced row (attention.Attention), with its errors against the
    reference (attention.errors; None: skipped) and the reference's traced row."""
    return {
        **_run_doc(res),  # shapes, softmax_scale (1/√d by default; a step's "scale" is its α)
        "block_q": res.tiles.block_q, "block_k": res.tiles.block_k,
        "tiles_computed": res.tiles.computed, "tiles_skipped": res.tiles.skipped,
        "tiles_total": res.tiles.total, "rescales": res.counters.rescales,
        "masked_rows": res.counters.masked_rows, "masked_lse": res.options.masked_lse,
        "lse_base": "e",
        **(errs or {"reference": "skipped"}),
        "trace": trace_rows_doc(res, ref_row) if len(res.trace.rows) > 1 else {
            "batch": res.trace.at[0], "head": res.trace.at[1], "query": res.trace.at[2],
            "steps": [tile_doc(s) for s in res.trace.steps],
            "out": res.trace.out,
            "reference": ref_row,
        },
    }


SHARED = ("tile", "start", "stop", "sink", "pages")  # a step's keys the same for every row


def trace_rows_doc(res, ref_rows) -> dict:
    """attention --json's "trace" for several rows (--query 0:4): "queries" lists them, and
    each step is one K/V tile with its tile, start, stop (and sink, pages) once and every other
    key of tile_doc as a list over the rows, in the order of "queries" (m, l, scale, o_head, …:
    the vectors a kernel holds for a Q tile); "out" and "reference" are lists of rows."""
    steps = []
    for k in range(min(map(len, res.trace.rows))):
        docs = [tile_doc(tr[k]) for tr in res.trace.rows]
        keys = list(dict.fromkeys(key for d in docs for key in d))
        steps.append({key: docs[0].get(key) if key in SHARED else [d.get(key) for d in docs]
                      for key in keys})
    return {"batch": res.trace.at[0], "head": res.trace.at[1], "queries": list(res.trace.queries),
            "steps": steps, "out": res.trace.outs, "reference": ref_rows}


def attention_doc(rep) -> dict:
    """osm attention --json (report.AttentionReport): the summary and trace, then the keys of
    --dtype (precision) and --splits."""
    doc = {"kernel": rep.kernel, "mma": rep.mma,  # the preset modelled (None: naive)
           **({"kernel_splits": rep.result.options.splits}
              if rep.kernel not in (None, "tiles") else {}),
           **attention_summary(rep.result, rep.errors,
                               rep.ref_rows if len(rep.result.trace.rows) > 1 else rep.ref_row)}
    if rep.model is not None:
        doc["precision"] = precision_doc(rep.model, rep.notes, rep.verdict)
    if rep.baseline is not None:
        doc["baseline"] = vars(rep.baseline)
    if rep.split is not None:
        doc["splits"] = [vars(s) for s in rep.split.splits]
        doc["splits_max_abs_diff"] = rep.split.max_abs_diff
        doc["splits_max_lse_diff"] = rep.split.max_lse_diff
    return doc


def rule_doc(r) -> dict | None:
    """One rule (precision.rule.Rule): the error, plain attention's, the rounding term, the
    bound and the verdict."""
    return None if r is None else {
        "max_err": r.err, "plain_max_err": r.pt_err, "rounding": r.rounding,
        "bound": r.bound, "passed": r.passed, **({"note": r.note} if r.note else {}),
        **({"baseline": r.baseline, "baseline_from": r.stand_in} if r.stand_in else {})}


def verdict_doc(v) -> dict:
    """A verdict (precision.Verdict): errors against float64 and FlashAttention's test rule."""
    rule = rule_doc
    return {
        "dtype": v.dtype, "max_err_vs_fp64": v.err, "plain_max_err_vs_fp64": v.plain_err,
        "max_lse_err_vs_fp64": v.lse_err, "plain_max_lse_err_vs_fp64": v.plain_lse_err,
        "rule": "max|out - ref| <= 2*max|pt - ref| + 2*max|(ref + 0.3 - 0.3) - ref|",
        "out": rule(v.rule), "lse": rule(v.lse), "passed": v.passed,
    }


def precision_doc(m, notes, verdict) -> dict:
    """attention --dtype: the model (precision.Model), the inputs' rounding, the verdict."""
    return {
        "dtype": m.name, "precision": m.precision, "accum": m.accum.name,
        "model": m.describe(),
        "inputs": [vars(r) for r in notes],
        "verdict": None if verdict is None else verdict_doc(verdict),
    }


def check_doc(rep, flag=None) -> dict:
    """osm check --json (precision.CheckReport); flag: the CLI's parameter -> flag function
    for the probe's advice (None: keywords)."""
    return {
        "shape": list(rep.shape), "inputs": [vars(r) for r in rep.notes],
        "verdict": verdict_doc(rep.verdict), "model_max_err_vs_fp64": rep.model_err,
        "kernel": rep.kernel, "mma": rep.mma,
        "rows_over_bound": rep.rows_over, "rows": rep.total_rows,
        # a varlen batch's rows and heads are a sequence's: `batch` holds it (the key is a
        # contract) and `sequence` says so
        "worst_rows": [_seq(vars(r), rep.varlen) for r in rep.rows],
        "worst_heads": [_seq(vars(h), rep.varlen) for h in rep.heads],
        "worst_ranked_by": rep.ranked_by, "hint": rep.hint or None,
        **({"gradients": [grad_check_doc(g) for g in rep.grads],
            "worst_gradient": rep.worst_grad.name} if rep.grads else {}),
        **diagnosis_doc(rep, flag),
    }


def _seq(doc: dict, varlen: bool) -> dict:
    return {**doc, "sequence": doc["batch"]} if varlen else doc


def grad_check_doc(g) -> dict:
    """One gradient judged (precision.gradcheck.GradCheck)."""
    k = g.rule
    terms = [f"{k.k_pt:g}*max|pt - ref|"] + (
        [f"{k.k_round:g}*max|(ref + 0.3 - 0.3) - ref|"] if k.k_round else [])
    rows = [_seq({"batch": r.batch, "head": r.head, "row": r.query, "err": r.err,
                  "ulps": r.ulps}, g.varlen) for r in g.rows]
    return {
        "gradient": g.name, "rule": f"max|{g.name} - ref| <= " + " + ".join(terms),
        **rule_doc(k), "max_err_vs_fp64": g.err64, "plain_max_err_vs_fp64": g.plain_err64,
        "model_max_err_vs_fp64": g.model_err, "rows_over_bound": g.rows_over,
        "rows": g.total_rows, "worst_rows": rows,
        "worst_heads": [_seq(vars(h), g.varlen) for h in g.heads],
    }


GRAD_STEP_KEYS = ("block", "start", "stop", "masked", "p_max", "ds_sum", "dk_norm", "dv_norm",
                  "dq_norm", "kind")  # kind: under a mask_mod, "full" or "partial"


def grad_step_doc(s) -> dict:
    """One tile of a backward trace (core.record.GradStep): its keys that are not None."""
    return {k: getattr(s, k) for k in GRAD_STEP_KEYS if getattr(s, k) is not None}


def query_traces_doc(r) -> list:
    """backward --json's "query_trace" for several rows (--query 0:4): one step per K/V tile,
    its block, start and stop once and masked, p_max, ds_sum, dq_norm as lists over the rows
    of traced.queries."""
    steps = []
    for k in range(min(map(len, r.trace.rows))):
        docs = [grad_step_doc(tr[k]) for tr in r.trace.rows]
        keys = dict.fromkeys(key for d in docs for key in d)
        steps.append({key: docs[0][key] if key in ("block", "start", "stop") else
                      [d.get(key) for d in docs] for key in keys})
    return steps


def backward_doc(rep) -> dict:
    """osm backward --json (reports.backward.BackwardReport); for several traced query rows,
    traced.queries in place of traced.query, query_trace as query_traces_doc, and
    traced_rows.dq and reference_rows.dq as lists of rows."""
    r = rep.result
    b, h, i = r.trace.at
    many = len(r.trace.queries) > 1  # several query rows: their traces as lists (query_traces_doc)
    d = np.asarray(r.delta, dtype=np.float64)
    doc = {
        "kernel": rep.kernel, "mma": rep.mma,  # the preset whose forward gave O and LSE
        **_run_doc(r), "own_forward": r.own_forward,
        # the kernel's own backward arithmetic (kernel_backward.py), or osm's flash model
        "backward_arithmetic": "kernel" if rep.kernel_arith else "osm",
        "block_q": r.tiles.block_q, "block_k": r.tiles.block_k,
        "tiles_computed": r.tiles.computed, "tiles_skipped": r.tiles.skipped,
        "tiles_total": r.tiles.total, "masked_rows": r.counters.masked_rows,
        "delta_min": float(d.min()) if d.size else None,
        "delta_max": float(d.max()) if d.size else None,
        "errors": rep.errors,
        "traced": {"batch": b, "head": h, **({"queries": list(r.trace.queries)} if many else
                                              {"query": i}),
                   "key": r.trace.key, "kv_head": r.trace.kv_head},
        "key_trace": [grad_step_doc(s) for s in r.trace.key_steps],
        "query_trace": (query_traces_doc(r) if many else
                        [grad_step_doc(s) for s in r.trace.steps]),
        "traced_rows": {n: np.asarray(x, dtype=np.float64) for n, x in rep.traced_rows.items()},
        "reference_rows": rep.ref_rows,
        **({} if r.dsink is None else {"dsink": r.dsink}),
    }
    if rep.model is not None:
        doc["precision"] = {
            "dtype": rep.model.name, "accum": rep.model.accum.name,
            "model": rep.model.describe_backward(rep.kernel),
            "inputs": [vars(n) for n in rep.notes],
            "gradients": [grad_check_doc(g) for g in rep.verdicts],
        }
    return doc


def sweep_doc(res, name: str, accum: str) -> dict:
    """osm sweep --json over scores (sweep.Sweep): the model's sizes, then one entry per block."""
    return {
        "source": name, "accum": accum, "rows": res.n_q, "keys": res.n_k, "d": res.d,
        "dtype_bytes": res.dtype_bytes, "sram_bytes": res.sram_bytes, "block_q": res.block_q,
        "hbm_standard": res.hbm_standard, "fa1_block_q": res.fa1_block[0],
        "fa1_block_k": res.fa1_block[1],
        "blocks": [
            {"block": r.block, "tiles": r.measure.tiles, "masked_tiles": r.measure.skipped,
             "rescales": r.measure.rescales, "max_abs_error": r.measure.max_error,
             "max_lse_error": r.measure.lse_error, "tile_bytes": r.tile_bytes, "fits": r.fits,
             "hbm_flash": r.hbm_flash,
             **({} if r.hbm_skipping is None else {
                 "tiles_computed": r.measure.tiles - r.measure.skipped,
                 "row_visits": r.measure.row_visits, "hbm_flash_skipping": r.hbm_skipping})}
            for r in res.rows
        ],
    }


def merge_doc(files, rep) -> dict:
    """osm merge --json (merge.MergeReport); files are the pairs O_0 LSE_0 O_1 LSE_1 … given."""
    merged = rep.merged
    return {
        "lse_base": merged.lse_base,
        "shape": list(merged.out.shape),
        "rows": int(merged.lse.size),
        "empty_rows": rep.empty_rows,
        "splits": [
            {"o": str(o), "lse": str(lse), "rows": st.rows, "empty_rows": st.empty,
             "pos_inf": st.pos_inf, "lse_min": st.lse_min, "lse_max": st.lse_max,
             "weight_min": st.weight_min, "weight_max": st.weight_max,
             "weight_mean": st.weight_mean, "row_lse": rl, "row_weight": rw}
            for st, o, lse, rl, rw in zip(rep.stats, files[0::2], files[1::2], rep.row_lses,
                                          rep.row_weights, strict=True)
        ],
        "row": rep.row,
        "row_lse": rep.row_lse,
        "row_out": rep.row_out,
    }


def attention_sweep_doc(res, name: str, accum: str, shapes, opts) -> dict:
    """osm sweep Q K V --json: sweep_doc, then Q/K/V's shapes and attention's mask keywords."""
    doc = sweep_doc(res, name, accum)
    sq, sk, sv = shapes
    window = opts.window
    doc.update(shape_q=list(sq), shape_k=list(sk), shape_v=list(sv), batch=res.batch,
               heads=res.heads, causal=opts.causal, causal_align=opts.causal_align,
               window=None if window is None else list(window), mask=opts.mask is not None,
               error_of="O", kernel=getattr(res, "kernel", None), dtype=getattr(res, "dtype", None),
               mma=getattr(res, "mma", None))  # a model's matmuls (None: no model ran)
    return doc


def cost_doc(c) -> dict:
    """osm cost --json (costmodel.Cost): its fields, in order."""
    return asdict(c)


__all__ = [
    "Pieces", "StepChunks", "attention_doc", "attention_summary", "attention_sweep_doc",
    "backward_doc", "check_doc", "grad_check_doc",
    "cost_doc", "dumps", "jsonable", "merge_doc", "precision_doc", "step_doc", "sweep_doc",
    "tile_doc", "trace_doc", "trace_rows_doc", "verdict_doc",
]
