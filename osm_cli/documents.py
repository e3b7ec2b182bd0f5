"""The --json documents: records in, plain dicts out, one function per document.

Keys and their order are the documents' contract (tests and scripts read them); values may still
be numpy arrays and floats with inf/nan, which io.dumps turns into strict JSON.
Leaves out: computing anything (the records come from the core), serializing (io.dumps).

Example: trace_doc(trace_report(np.array([2., 4., 1., 3.]), 2))["steps"][1]["l"] -> 1.5530018
"""

from __future__ import annotations


def step_doc(st) -> dict:
    """One block of a traced row (online.Step)."""
    d = {
        "block": st.block, "start": st.start, "stop": st.stop, "block_max": st.block_max,
        "m_prev": st.m_prev, "m": st.m, "scale": st.scale, "l_prev": st.l_prev, "l": st.l,
        "rescaled": st.rescaled,
    }
    if st.block_l is not None:
        d.update(block_m=st.block_m, block_l=st.block_l, block_weight=st.block_weight)
    return d


def trace_doc(rep) -> dict:
    """osm trace --json (report.TraceReport): the steps, the final state of every row, the
    references, and the keys of --form both, --dtype, --rescale-threshold and --order."""
    t = rep.trace
    doc = {
        "block": rep.block,
        "form": rep.form,
        "row": rep.row,
        "shape": list(rep.scores.shape),
        "steps": [step_doc(st) for st in t.steps],
        "m": t.m,
        "l": t.l,
        "lse": t.lse,
        "lse_base": "e",
        "probabilities": t.probabilities,
        "reference": rep.reference,
        "naive": rep.naive,
        "max_abs_diff": float(rep.max_diff.max()),
    }
    if len(rep.traces) == 2:
        doc["merge_steps"] = [step_doc(st) for st in rep.traces[1].steps]
        doc["forms_max_abs_diff"] = rep.forms_diff
    if rep.in_dtype:
        lt = rep.in_dtype[0]
        doc.update(dtype=lt.model.name, precision=lt.model.precision, scores_in_dtype=lt.scores,
                   reference_note="float64 stabilized softmax of the unrounded scores",
                   ulps=lt.ulps, rounding=vars(lt.rounding), p_underflowed=lt.p_underflowed,
                   alpha_underflowed=list(lt.alpha_underflowed))
    lazy, check = rep.lazy, rep.check
    if lazy is not None:
        for d, st in zip(doc["steps"], t.steps, strict=True):
            d["skipped"] = st.skipped
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
    return doc


__all__ = ["step_doc", "trace_doc"]
