"""What `check` returns (CheckReport), as tables in Jupyter: the verdict, one row per judged
tensor (rule, max error, bound, verdict, where it fails), the worst rows and heads, as
core/notebook.py's plain Tables; the same cells as osm check's tables.

Leaves out: the probe's advice and the tile map in words (present/diagnosis.py), styling.

Example: check(out, q, k, v, dtype="float16")._repr_markdown_() opens "**check: PASS**"
"""

from __future__ import annotations

from osm_cli.core.notebook import Table, num

LABELS = {"out": "out", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV", "dsink": "dsink"}


def check_tables(rep) -> list[Table]:
    """A CheckReport: its summary, the verdicts per tensor, the worst rows and heads."""
    v = rep.verdict
    judged = f"{v.dtype}, against the float64 reference of the {v.dtype}-rounded Q, K, V"
    summary = [("shape", str(rep.shape)), ("judged as", judged),
               ("max |O − ref64|, the kernel", num(v.err, 3)),
               ("max |O − ref64|, plain " + v.dtype, num(v.plain_err, 3))]
    if rep.model_err is not None:
        summary.append((f"max |O − ref64|, osm's {rep.kernel or 'tiles'} model",
                        num(rep.model_err, 3)))
    if v.lse_err is not None:
        summary.append(("max |LSE − ref64|", num(v.lse_err, 3)))
    summary += [("rows over the bound", f"{rep.rows_over} of {rep.total_rows}"),
                ("verdict", "PASS" if rep.passed else "FAIL")]
    tables = [Table(f"check: {'PASS' if rep.passed else 'FAIL'}", (), tuple(summary))]
    if rep.tensors:
        rows = []
        for t in rep.tensors:
            where = t.where if not t.passed else ""
            if t.reasons:
                where = "; ".join([*t.reasons, *([where] if where else [])])
            rows.append((LABELS[t.tensor], num(t.judged.err, 3), num(t.judged.bound, 3),
                         "PASS" if t.passed else "FAIL", where))
        tables.append(Table(f"verdicts (rule {rep.rule})",
                            ("tensor", "max error", "bound", "verdict", "where"), tuple(rows),
                            left=(0, 3, 4)))
    tables.append(Table(f"worst {len(rep.rows)} rows", (
        "sequence" if rep.varlen else "batch", "head", "query", "max |out − ref|", "ulps",
        "|LSE − ref|"), tuple((str(r.batch), str(r.head), str(r.query), num(r.err, 3),
                               "—" if r.ulps is None else num(r.ulps, 3), num(r.lse_err, 3))
                              for r in rep.rows)))
    by_lse = rep.ranked_by == "lse"
    tables.append(Table(
        "worst heads by |LSE − ref|" if by_lse else "worst heads",
        ("sequence" if rep.varlen else "batch", "head", "max |out − ref|",
         *(("max |LSE − ref|",) if by_lse else ()), "rows over the bound"),
        tuple((str(h.batch), str(h.head), num(h.err, 3),
               *((num(h.lse_err, 3),) if by_lse else ()), str(h.rows_over)) for h in rep.heads)))
    if rep.grads:
        tables.append(Table("gradients", ("gradient", "max error", "bound", "verdict"), tuple(
            (LABELS.get(g.name, g.name), num(g.rule.err, 3), num(g.rule.bound, 3),
             "PASS" if g.rule.passed else "FAIL") for g in rep.grads), left=(0, 3)))
    return tables


__all__ = ["LABELS", "check_tables"]
