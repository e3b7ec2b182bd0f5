"""osm check's diagnosis as text: one verdict line per tensor, and for each failing tensor
where it fails, which convention it fits and the tile map; the per-head bias; the other
projects' rules (--rules-table). Records in (precision/diagnose.py, probe.py, locate.py,
strict.py), renderables and strings out.

Leaves out: judging (precision/), FlashAttention's rule lines (verdicts.py).
"""

from __future__ import annotations

from rich import box
from rich.text import Text

from osm_cli.precision.notebook import LABELS

from .format import Table, num, pass_fail


def advice(f, flag=None) -> str:
    """A finding's message with its option as a flag (flag: the CLI's parameter -> flag
    function, cli/flags.py) or, without one, as a keyword (the Python API)."""
    if not f.option:
        return f.message.replace(": {option} if", ": pass it if")
    name, value = f.option
    if flag is not None:
        opt = flag(name)
        said = opt if value is True else f"{opt} {value:.6g}" if isinstance(value, float) \
            else f"{opt} {value}"
    else:
        said = f"{name}={value!r}"
    return f.message.replace("{option}", f"pass {said}")


def tensor_table(rep) -> Table:
    """One row per judged tensor: the rule, max error, bound, verdict and where it fails."""
    t = Table(title=f"verdicts (rule {rep.rule})", box=box.SIMPLE_HEAD, title_justify="left",
              pad_edge=False)
    for c, j in (("tensor", "left"), ("max error", "right"), ("bound", "right"),
                 ("verdict", "left"), ("where", "left")):
        t.add_column(c, justify=j)
    for v in rep.tensors:
        where = v.where if not v.passed else ""
        if v.reasons:
            where = "; ".join([*v.reasons, *([where] if where else [])])
        t.add_row(LABELS[v.tensor], num(v.judged.err, 3), num(v.judged.bound, 3),
                  pass_fail(v.passed), where)
    return t


def failure_lines(rep, flag=None) -> list[Text]:
    """Per failing tensor: what the probe found, or that nothing it tried fits."""
    lines = []
    for v in rep.failures:
        tried = 0 if rep.probe is None else sum(f.tensor == v.tensor for f in rep.probe.tried)
        for f in v.findings:
            lines.append(Text(f"{LABELS[v.tensor]}: {advice(f, flag)}", style="yellow"))
        if not v.findings and tried:
            lines.append(Text(f"{LABELS[v.tensor]}: none of the {tried} other conventions "
                              "tried fits (a bug, not a convention)"))
    if rep.tile_map is not None:
        lines += tile_map_lines(rep.tile_map)
    return lines


def tile_map_lines(m) -> list[Text]:
    """The tile map: a Q tile per line, a K/V tile per column."""
    head = Text(f"tile map of head {m.head}, batch {m.batch} (Q tiles of {m.block_q} rows down, "
                f"K/V tiles of {m.block_k} across; # the K/V tile that explains the error, "
                "~ failing with no single K/V tile to blame, . fine, blank skipped)")
    rows = [Text(f"{i:>4} {row}") for i, row in enumerate(m.marks)]
    return [head, *rows, *(Text(p) for p in m.patterns)]


def bias_line(rep) -> Text | None:
    """The most significant per-head bias and how many heads are flagged; None when none is
    (the JSON keeps every head's)."""
    if not rep.bias or not any(x.flagged for x in rep.bias):
        return None
    b = rep.bias[0]
    flagged = sum(x.flagged for x in rep.bias)
    sig = f"{abs(b.bias) / b.sigma:.3g}σ" if b.sigma else "exact"
    model = "" if b.model_bias is None else f", model {b.model_bias:+.2g}"
    # a varlen batch's bias pools each head's rows of every sequence (its packed batch 0)
    where = " (all sequences)" if rep.varlen else f" of batch {b.batch}"
    line = Text(f"per-head bias of (out − ref): largest head {b.head}{where}, "
                f"{b.bias:+.2g} ({sig}{model})")
    if flagged:
        line.append(f"; {flagged} head{'s' if flagged > 1 else ''} flagged (a scale bug? "
                    "--rule model fails them)", style="yellow")
    return line


def rules_table(rep) -> Table:
    """What other projects' tolerance rules say on the same tensors (--rules-table)."""
    tensors = list(dict.fromkeys(r.tensor for r in rep.other_rules))
    t = Table(title="other rules on the same tensors (failing elements)", box=box.SIMPLE_HEAD,
              title_justify="left", pad_edge=False)
    t.add_column("rule")
    for n in tensors:
        t.add_column(LABELS[n], justify="right")
    fa = {v.tensor: v.fa for v in rep.tensors}
    t.add_row("FlashAttention's rule (osm's default)",
              *[pass_fail(fa[n].passed) if fa.get(n) is not None else "" for n in tensors])
    for name in dict.fromkeys(r.rule for r in rep.other_rules):
        cells = []
        for n in tensors:
            r = next(x for x in rep.other_rules if x.rule == name and x.tensor == n)
            cells.append("n/a" if r.passed is None else
                         Text.assemble(pass_fail(r.passed), f" ({r.failing})" if r.failing else ""))
        t.add_row(name, *cells)
    return t


RULE_NAMES = {"fa": "FlashAttention's rule", "model": "the model rule"}


def terms(r) -> str:
    """The bound's terms as the rule writes them: 2·pt + 2·rounding, or 1.25·model."""
    # where plain attention overflowed, its stand-in's error, named (rule.py)
    base, by = getattr(r, "baseline", r.pt_err), getattr(r, "stand_in", "")
    t = [f"{k:g}·{x:.3g}" + (f" ({b})" if b else "")
         for k, x, b in ((r.k_pt, base, by), (r.k_round, r.rounding, "")) if k]
    return " + ".join(t) or f"{r.bound:.3g}"


def failures_text(rep, flag=None) -> str:
    """One line per failing tensor: its rule with the numbers, the rows over the bound, what
    else failed it, where and the convention found (assert_attention_close's message)."""
    parts = []
    for v in rep.failures:
        r, label = v.judged, LABELS[v.tensor]
        ref = "ref64" if v.rule == "model" else "ref"
        cmp = ">" if not r.err <= r.bound else "≤"
        line = (f"{label} fails {RULE_NAMES[v.rule]}: max|{v.tensor} − {ref}| = {r.err:.3g} "
                f"{cmp} {terms(r)} = {r.bound:.3g} ({rep.verdict.dtype})")
        if v.location is not None:
            line += f"; {v.location.rows_over} of {v.location.total_rows} rows over the bound"
        if v.reasons:
            line += "; " + "; ".join(v.reasons)
        if v.where:
            line += f"; where: {v.where}"
        if v.findings:
            line += "; probe: " + " / ".join(advice(f, flag) for f in v.findings)
        parts.append(line)
    return "\n".join(parts)


def location_doc(loc) -> dict | None:
    """A locate.Location as JSON: where a tensor's rows fail."""
    if loc is None:
        return None
    return {"summary": loc.summary, "patterns": list(loc.patterns), "rows": loc.rows,
            "rows_over_bound": loc.rows_over, "total_rows": loc.total_rows,
            "batches": list(loc.batches), "heads": [list(h) for h in loc.heads],
            "sequences": None if loc.sequences is None else list(loc.sequences),
            "block": loc.block, "tiles": list(loc.tiles), "n_tiles": loc.n_tiles}


def finding_doc(f, flag=None) -> dict:
    return {"probe": f.probe, "message": advice(f, flag), "max_diff": f.max_diff,
            "bound": f.bound, "option": None if not f.option else
            {"name": f.option[0], "value": f.option[1]}}


def diagnosis_doc(rep, flag=None) -> dict:
    """check --json's keys beyond FlashAttention's verdict: the rule, one verdict per tensor,
    the failures with where and probe, the per-head bias, the tile map, the other rules."""
    tensors = [{"tensor": t.tensor, "rule": t.rule, "passed": t.passed,
                "max_error": t.judged.err, "bound": t.judged.bound,
                "fa_passed": t.fa.passed, "reasons": list(t.reasons)} for t in rep.tensors]
    failures = [{"tensor": t.tensor, "rule": t.rule, "bound": t.judged.bound,
                 "max_error": t.judged.err, "reasons": list(t.reasons),
                 "where": location_doc(t.location),
                 "probe": [finding_doc(f, flag) for f in t.findings]} for t in rep.failures]
    m = rep.tile_map
    return {
        "rule": rep.rule, "lse_base": rep.lse_base, "passed": rep.passed,
        "tensors": tensors, "failures": failures,
        "model_max_lse_err_vs_fp64": rep.model_lse_err, "rows_that_see_no_key": rep.no_key_rows,
        "head_bias": [{"batch": b.batch, "head": b.head, "bias": b.bias, "sigma": b.sigma,
                       "model_bias": b.model_bias, "flagged": b.flagged,
                       **({"sequence": None} if rep.varlen else {})} for b in rep.bias],
        "probe_heads": None if rep.probe is None else [list(h) for h in rep.probe.heads],
        "tile_map": None if m is None else {
            "batch": m.batch, "head": m.head, "block_q": m.block_q, "block_k": m.block_k,
            "marks": list(m.marks), "explained": [list(x) for x in m.explained],
            "patterns": list(m.patterns)},
        "other_rules": [{"rule": r.rule, "tensor": r.tensor, "passed": r.passed,
                         "failing": r.failing, "total": r.total} for r in rep.other_rules],
        "varlen_rows": rep.varlen,
    }


__all__ = ["advice", "bias_line", "diagnosis_doc", "failure_lines", "failures_text",
           "finding_doc", "location_doc", "rules_table", "tensor_table", "terms",
           "tile_map_lines"]
