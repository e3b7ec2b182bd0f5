"""Verdicts as text: the precision model and the inputs' rounding (attention --dtype), the
FlashAttention test rule's lines, and osm check's report and its one FAIL line.

Leaves out: judging anything (precision/rule.py, precision/check.py).
"""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.text import Text

from . import diagnosis
from .format import Table, kv_table, num, pass_fail


def rounding_text(notes) -> Text:
    """Per rounded array: values moved, overflowed to inf (bold red), underflowed to 0 (yellow)."""
    parts: list = []
    for i, r in enumerate(notes):
        parts += ["; " if i else "", f"{r.name} {r.changed} of {r.size} moved"]
        if r.changed > r.overflowed:
            parts.append(f" (max |Δ| {r.max_abs_change:.3g})")
        if r.overflowed:
            parts += [", ", Text(f"{r.overflowed} overflowed to inf", style="bold red")]
        if r.underflowed:
            parts += [", ", Text(f"{r.underflowed} underflowed to 0", style="yellow")]
    return Text.assemble(*parts)


def rule_text(r, what: str = "out") -> Text:
    """'max|what − ref| = e ≤ k·pt + k·rounding = bound  PASS' (the terms the rule has)."""
    terms: list = []
    for k, x, by in ((r.k_pt, r.baseline, r.stand_in), (r.k_round, r.rounding, "")):
        if k:
            terms += [" + " if terms else "", f"{k:g}·", num(x, 3), f" ({by})" if by else ""]
    if r.k_abs:
        terms += [" + " if terms else "", num(r.k_abs, 3)]
    line = Text.assemble(
        f"max|{what} − ref| = ", num(r.err, 3), " ≤ " if r.passed else " > ", *terms,
        " = ", num(r.bound, 3), "  ", pass_fail(r.passed),
    )
    if r.note:
        line.append(f"  ({r.note})", style="yellow")
    return line


def _verdict_rows(v, model_err: float | None = None, label: str = "this run",
                  kernel: str | None = None) -> list:
    ratio = f"  ({v.plain_err / v.err:.3g}× {label})" if v.err else ""
    rows = [(f"max |O − ref64|, {label}", num(v.err, 3))]
    if model_err is not None:
        rel = f"  ({v.err / model_err:.3g}× the model)" if model_err else ""
        model = f"osm's {kernel} model" if kernel else "osm flash model"
        rows.append((f"max |O − ref64|, {model}", Text.assemble(num(model_err, 3), rel)))
    rows += [
        (f"max |O − ref64|, plain {v.dtype}", Text.assemble(num(v.plain_err, 3), ratio)),
        ("FlashAttention test rule", rule_text(v.rule)),
    ]
    if v.lse is not None:
        rows += [
            ("max |LSE − ref64|", Text.assemble(num(v.lse_err, 3), "  (plain ",
                                                num(v.plain_lse_err, 3), ")")),
            ("LSE rule", rule_text(v.lse, "lse")),
        ]
    return rows


def precision_summary(model, notes, verdict) -> Table:
    """osm attention --dtype: the precision model, what rounding the inputs did, the verdict."""
    rows = [("precision", model.describe()), (f"inputs in {model.name}", rounding_text(notes))]
    if verdict is None:
        rows.append(("verdict", "skipped (--no-reference)"))
    else:
        rows += _verdict_rows(verdict)
    return kv_table(rows)


def check_report(rep, name: str, top: int, flag=None) -> Group:
    """osm check: the verdicts, one per tensor, what failed where and which convention fits,
    then the worst rows (of the failing tensor) and heads against the dtype-rounded reference.
    flag: the CLI's parameter -> flag function, for the probe's advice (None: keywords)."""
    v = rep.verdict
    head = Text(f"{name}: shape {rep.shape}, judged as {v.dtype} against the float64 reference "
                f"of the {v.dtype}-rounded Q, K, V")
    rows_kv = [("inputs", rounding_text(rep.notes)),
               *_verdict_rows(v, rep.model_err, "the kernel", rep.kernel)]
    if rep.model_lse_err is not None and v.lse is not None:
        rel = f"  ({v.lse_err / rep.model_lse_err:.3g}× the model)" if rep.model_lse_err else ""
        rows_kv.append(("max |LSE − ref64|, model", Text.assemble(num(rep.model_lse_err, 3),
                                                                   rel)))
    if rep.no_key_rows:
        rows_kv.append(("rows that see no key", f"{rep.no_key_rows} (output must be exactly 0)"))
    fwd = [t for t in rep.tensors if t.tensor in ("out", "lse")]
    over = f"{rep.rows_over} of {rep.total_rows}"
    lse_only = [t for t in rep.failures if t.tensor == "lse" and t.location is not None]
    out_model = [t for t in rep.failures if t.tensor == "out" and t.rule == "model"
                 and t.location is not None]
    if lse_only and not any(t.tensor == "out" for t in rep.failures):
        loc = lse_only[0].location
        over = f"{over} (LSE: {loc.rows_over} of {loc.total_rows})"
    elif out_model:  # the count above is FlashAttention's rule's
        loc = out_model[0].location
        over = f"{over} (model rule: {loc.rows_over} of {loc.total_rows})"
    # with gradients judged this is the forward's verdict alone ("verdict, all" closes them)
    rows_kv += [("rows over the bound", over),
                ("verdict, out and LSE" if rep.grads else "verdict",
                 pass_fail(all(t.passed for t in fwd) if fwd else v.passed))]
    t = kv_table(rows_kv)
    title = (f"worst {min(top, len(rep.rows))} rows by |LSE − ref|" if rep.ranked_by == "lse" else
             f"worst {min(top, len(rep.rows))} rows (ulp of {v.dtype} at the row's largest "
             "|ref|)")
    rows = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for c in ("sequence" if rep.varlen else "batch", "head", "query", "max |out − ref|",
              "ulps", "|LSE − ref|"):
        rows.add_column(c, justify="right")
    for r in rep.rows:
        err = num(r.err, 3)
        if r.err > v.rule.bound:  # nan is bold red already
            err.style = "bold red"
        rows.add_row(str(r.batch), str(r.head), str(r.query), err, _ulps(r.ulps),
                     num(r.lse_err, 3))
    by_lse = rep.ranked_by == "lse"  # the heads as the rows: by the tensor that fails
    heads = Table(title="worst heads by |LSE − ref|" if by_lse else "worst heads",
                  box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    # ranked by the LSE, the count is the LSE's rows over the bound (and a narrower header
    # keeps a varlen batch's five columns within 72)
    for c in ("sequence" if rep.varlen else "batch", "head", "max |out − ref|",
              *(("max |LSE − ref|", "rows over (LSE)") if by_lse else ("rows over the bound",))):
        heads.add_column(c, justify="right")
    for h in rep.heads:
        heads.add_row(str(h.batch), str(h.head), num(h.err, 3),
                      *((num(h.lse_err, 3),) if by_lse else ()), str(h.rows_over))
    parts = [head, t]
    if rep.tensors:
        parts.append(diagnosis.tensor_table(rep))
        parts += diagnosis.failure_lines(rep, flag)
        bias = diagnosis.bias_line(rep)
        if bias is not None:
            parts.append(bias)
    if isinstance(parts[-1], Text):  # the probe's advice, the tile map: a line before the rows
        parts.append(Text(""))
    parts += [rows, *_zero_ref_note(rep.rows), heads]
    if rep.hint:
        parts.append(Text(rep.hint, style="yellow"))
    if rep.grads:
        parts += grads_report(rep, top)
    if rep.other_rules:
        parts.append(diagnosis.rules_table(rep))
    return Group(*parts)


def grads_report(rep, top: int) -> list:
    """osm check's gradients: each one's errors and rule, then the worst gradient's rows."""
    v = rep.verdict
    rows = []
    for g in rep.grads:
        model = []
        if g.model_err is not None:
            model = ["  (osm's FA2 model ", num(g.model_err, 3), ")"]
        rows += [(f"max |{g.label} − ref64|", Text.assemble(
                     num(g.err64, 3), "  (plain ", num(g.plain_err64, 3), ")", *model)),
                 (f"{g.label} rule", rule_text(g.rule, g.label)),
                 (f"{g.label} rows over", f"{g.rows_over} of {g.total_rows}")]
    w = rep.worst_grad
    rows.append(("verdict, all", pass_fail(rep.passed)))
    t = kv_table(rows)
    what = {"dq": "query", "dsink": "row"}.get(w.name, "key")
    worst = Table(title=f"worst {min(top, len(w.rows))} rows of {w.label} (nearest its bound)",
                  box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    batch = "sequence" if w.varlen else "batch"  # a varlen batch's rows: (sequence, row)
    for c in (batch, "head", what, f"max |{w.label} − ref|", "ulps"):
        worst.add_column(c, justify="right")
    for r in w.rows:
        err = num(r.err, 3)
        if r.err > w.rule.bound:
            err.style = "bold red"
        worst.add_row(str(r.batch), str(r.head), str(r.query), err, _ulps(r.ulps))
    heads = Table(title=f"worst heads of {w.label}", box=box.SIMPLE_HEAD, title_justify="left",
                  pad_edge=False)
    for c in (batch, "head", f"max |{w.label} − ref|", "rows over the bound"):
        heads.add_column(c, justify="right")
    for h in w.heads:
        heads.add_row(str(h.batch), str(h.head), num(h.err, 3), str(h.rows_over))
    return [Text(f"gradients, judged as {v.dtype} against the float64 gradients of the "
                 f"{v.dtype}-rounded Q, K, V, dO"), t, worst, *_zero_ref_note(w.rows), heads]


NO_ULP = "—"  # the ulps of a row whose reference is exactly 0 and whose error is not


def _ulps(u) -> Text:
    return Text(NO_ULP) if u is None else num(u, 3)


def _zero_ref_note(rows) -> list[Text]:
    """The legend of "—" in an ulps column, under the table that shows one."""
    if all(r.ulps is not None for r in rows):
        return []
    return [Text(f"ulps {NO_ULP}: the row's reference is exactly 0 (a row that sees no key, or "
                 "one whose V is 0), which has no ulp; its error is the absolute one beside",
                 style="dim")]


def fail_line(rep, flag=None) -> str:
    """The one line `osm check` prints on stderr when a kernel fails (a CheckReport): each
    failing tensor's rule, where it fails, and the convention it fits."""
    v, parts = rep.verdict, []
    fails = {t.tensor: t for t in rep.failures} if rep.tensors else None

    def extra(name: str) -> str:
        t = None if fails is None else fails.get(name)
        if t is None:
            return ""
        s = "".join(f"; {r}" for r in t.reasons)
        s += f"; where: {t.where}" if t.where else ""
        if t.findings:
            s += f"; probe: {diagnosis.advice(t.findings[0], flag)}"
        return s

    def failing(name: str, fa_failed: bool) -> bool:
        return fa_failed if fails is None else name in fails

    def judged(name: str, fa):
        return fa if fails is None or name not in fails else fails[name].judged

    if failing("out", not v.rule.passed):
        r = judged("out", v.rule)
        loc = None if fails is None else fails["out"].location
        over, total = (rep.rows_over, rep.total_rows) if loc is None else (loc.rows_over,
                                                                          loc.total_rows)
        parts.append(f"max|out − ref| = {r.err:.3g} {'>' if not r.passed else '≤'} "
                     f"{diagnosis.terms(r)} = {r.bound:.3g} ({v.dtype}); {over} of "
                     f"{total} rows over the bound" + extra("out"))
    if v.lse is not None and failing("lse", not v.lse.passed):
        r = judged("lse", v.lse)
        parts.append(f"max|lse − ref| = {r.err:.3g} > {diagnosis.terms(r)} = {r.bound:.3g}"
                     + extra("lse"))
    for g in rep.grads:
        if failing(g.name, not g.rule.passed):
            r = judged(g.name, g.rule)
            h = g.heads[0] if g.heads else None
            of = "sequence" if g.varlen else "batch"
            where = f", worst head {h.head} of {of} {h.batch}" if h else ""
            parts.append(f"max|{g.label} − ref| = {r.err:.3g} > {r.bound:.3g}; {g.rows_over} of "
                         f"{g.total_rows} rows over the bound{where}" + extra(g.name))
    return "; ".join(parts) + (f" ({rep.hint})" if rep.hint else "")


def block_mask_lines(rep, against: str) -> list[str]:
    """check --block-mask's verdict line and its wrong tiles, a line each; `against` names
    the mask_mod."""
    verdict = "PASS" if rep.passed else "FAIL"
    head = (f"block mask {verdict}: {rep.wrong_count} wrong of {rep.tiles} tiles "
            f"(block {rep.block_q}×{rep.block_k} against {against})"
            + (f"; {rep.slower} claimed partial that are full or empty (slower, not wrong)"
               if rep.slower else ""))
    return [head, *(f"  {line}" for line in rep.wrong)]
