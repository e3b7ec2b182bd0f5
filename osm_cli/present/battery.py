"""osm battery's report: the table of feature × case class (PASS, FAIL n/m, REFUSED n/m,
skipped), each failure with its smallest case, rule, bound, convention and location and a
replay line, each kind of refusal (an unsupported shape) with its smallest case, the totals
and the time; the same as a JSON document and as JUnit XML for CI; a replayed case with
osm check's full report.

Leaves out: running anything (battery/).
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

from rich import box
from rich.console import Group
from rich.text import Text

from .format import Table, kv_table, pass_fail
from .verdicts import check_report

STYLE = {"PASS": "bold green", "FAIL": "bold red", "REFUSED": "bold yellow", "skipped": "dim",
         "none": "dim"}


def _cell(state: str, bad: int, n: int) -> Text:
    if state == "PASS":
        return Text(f"PASS {n}", style=STYLE[state])
    if state in ("FAIL", "REFUSED"):
        return Text(f"{state} {bad}/{n}", style=STYLE[state])
    return Text("skipped" if state == "skipped" else "–", style=STYLE[state])


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def case_text(case) -> str:
    """'B 1, H 2/1, N_q 65, N_k 128, d 64, bf16, causal': a case for people."""
    parts = [f"B {case.b}", f"H {case.h}" + (f"/{case.hkv}" if case.hkv != case.h else ""),
             f"N_q {case.nq}", f"N_k {case.nk}", f"d {case.d}", case.dtype]
    parts += list(case.features)
    if case.window is not None:
        parts[parts.index("window")] = f"window {case.window}"
    if case.softcap is not None:
        parts[parts.index("softcap")] = f"softcap {case.softcap:g}"
    if case.page:
        parts[parts.index("paged")] = f"pages of {case.page}"
    if case.lens is not None:
        parts.append("lengths " + " ".join(f"{a}×{b}" for a, b in case.lens))
    if case.score_mod:
        parts[parts.index("score_mod")] = f"score_mod {case.score_mod}"
    if case.mask_mod:
        parts[parts.index("mask_mod")] = f"mask_mod {case.mask_mod.replace('+', ' & ')}"
    if case.edge:
        parts.append(f"edge: {case.edge}")
    return ", ".join(parts)


def battery_report(rep, replay_cmd: str) -> Group:
    """The table, the failures (smallest case, rule, convention, location, replay), totals."""
    head = Text(f"osm battery {rep.target}: {len(rep.results)} cases, {rep.budget} budget, "
                f"seed {rep.seed}, rule {rep.rule}")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("feature")
    for c in rep.classes:
        t.add_column(c, justify="right")
    for row in rep.rows:
        t.add_row(row, *(_cell(*rep.cell(row, c)) for c in rep.classes))
    parts: list = [head, t]
    wrong = [f for f in rep.failures if not f.smallest.refused]
    for i, f in enumerate((f for f in rep.failures if f.smallest.refused), 1):
        s = f.smallest
        feats = ", ".join(f.features) or "dense"
        parts += [Text.assemble(("REFUSED", "bold yellow"), f" {i}: the kernel does not take "
                                f"{feats} cases like this"),
                  kv_table([("smallest case", case_text(s.case)),
                            ("refused", f"{_n(f.count, 'case')} like it"),
                            ("kernel said", s.message),
                            ("if so", "an unsupported shape, not a wrong number: declare the "
                             "kernel's limits (--seqlens equal, --min-seqlen N, "
                             "--seqlen-multiple M, --head-dims, --dtype) and the battery "
                             "draws only what it takes"),
                            ("replay", f"{replay_cmd} --replay {s.case.id}")])]
    for i, f in enumerate(wrong, 1):
        s = f.smallest
        lines = [("smallest case", case_text(s.case)),
                 ("failed", ", ".join(s.failed) + f"  ({_n(f.count, 'case')} failed like it)")]
        lines.append(("rule", s.message))
        if s.bound is not None:
            lines.append(("bound", f"{s.bound:.3g} (error {s.err:.3g})"))
        lines.append(("convention", getattr(s, "convention", "") or "no alternative "
                      "convention explains it"))
        if s.where:
            lines.append(("location", s.where))
        lines.append(("replay", f"{replay_cmd} --replay {s.case.id}"))
        feats = ", ".join(f.features) or "dense"
        parts += [Text.assemble(("FAIL", "bold red"), f" {i}: {', '.join(f.tensors)} on {feats}"),
                  kv_table(lines)]
    nd = rep.nondeterministic
    if nd:
        n = Table(title="bitwise nondeterminism (--repeat)", box=box.SIMPLE_HEAD,
                  title_justify="left", pad_edge=False)
        for c in ("tensor", "cases", "runs differing", "largest difference"):
            n.add_column(c, justify="right" if c != "tensor" else "left")
        for name, (cases, runs, d) in nd.items():
            n.add_row(name, str(cases), str(runs), f"{d:.3g}")
        parts.append(n)
    passed = len(rep.results) - rep.failed - rep.refused
    kinds = len(wrong)
    parts.append(kv_table([
        ("cases", f"{len(rep.results)}: {passed} passed, {rep.failed} failed"
                  + (f", {rep.refused} refused by the kernel" if rep.refused else "")
                  + (f"; {_n(kinds, 'kind')} of failure" if kinds else "")
                  + (f"; {rep.left_out} left out by the declared limits" if rep.left_out
                     else "")),
        *([("stopped", f"{rep.stopped}; {rep.not_run} cases not run, failures not shrunk")]
          if rep.stopped else []),
        *_reference_line(rep),
        ("time", f"{rep.seconds:.1f} s: the kernel {rep.kernel_seconds:.1f} s, osm "
                 f"{rep.osm_seconds:.1f} s"),
        ("verdict", pass_fail(rep.passed)),
    ]))
    return Group(*parts)


def _reference_line(rep) -> list:
    """Where osm's reference ran, when it was torch's (numpy's, the default, says nothing)."""
    on = sum(r.reference == "torch" for r in rep.results)
    if not on:
        return []
    rest = len(rep.results) - on
    return [("reference", f"float64 with torch on the kernel's device ({on} cases"
             + (f"; {rest} on numpy: torch could not, or the kernel failed first)" if rest
                else ")"))]


def replay_report(res, target: str) -> Group:
    """One replayed case: what it is, its verdict line, and osm check's full report."""
    head = kv_table([("case", f"{res.case.id}"), ("is", case_text(res.case)),
                     ("target", target),
                     ("verdict", pass_fail(res.passed) if res.passed else
                      Text.assemble(pass_fail(False), f"  {res.message}"))])
    parts: list = [head]
    if res.where:
        parts.append(Text(f"location: {res.where}"))
    if getattr(res, "convention", ""):
        parts.append(Text(f"convention: {res.convention}"))
    if res.report is not None:
        parts.append(check_report(res.report, "out", 5))
    return Group(*parts)


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def result_doc(r) -> dict:
    return {"id": r.case.id, "class": r.case.klass, "features": list(r.case.features),
            "passed": r.passed, "refused": r.refused, "failed": list(r.failed),
            "message": r.message,
            "rule": r.rule, "bound": _num(r.bound), "error": _num(r.err), "where": r.where,
            "convention": getattr(r, "convention", ""), "reference": r.reference,
            "nondeterminism": [{"tensor": n.tensor, "runs_differing": n.runs_differing,
                                "max_diff": _num(n.max_diff)} for n in r.nondeterminism]}


def battery_doc(rep, replay_cmd: str) -> dict:
    """The report as JSON: table cells, failures (with replay lines), every case, times."""
    table = {row: {c: dict(zip(("state", "failed", "cases"), rep.cell(row, c), strict=True))
                   for c in rep.classes} for row in rep.rows}
    lim = rep.declared.limits
    return {
        "target": rep.target, "features": sorted(rep.declared.features),
        "head_dims": list(rep.declared.head_dims), "dtypes": list(rep.declared.dtypes),
        "rule": rep.rule, "budget": rep.budget, "seed": rep.seed, "lse_base": rep.lse_base,
        "limits": {"seqlens": lim.seqlens, "min_seqlen": lim.min_seqlen,
                   "seqlen_multiple": lim.seqlen_multiple},
        "passed": rep.passed, "cases": len(rep.results), "failed": rep.failed,
        "refused": rep.refused, "left_out": rep.left_out, "table": table,
        "failures": [{"tensors": list(f.tensors), "features": list(f.features),
                      "count": f.count, "smallest": result_doc(f.smallest),
                      "replay": f"{replay_cmd} --replay {f.replay_id}"} for f in rep.failures],
        "results": [result_doc(r) for r in rep.results],
        "seconds": rep.seconds, "kernel_seconds": rep.kernel_seconds,
        "osm_seconds": rep.osm_seconds,
        **({"stopped": rep.stopped, "not_run": rep.not_run} if rep.stopped else {}),
    }


def fail_line(rep, max_failures: int | None = None) -> str:
    """The FAIL line's text (after "FAIL: "): how many cases failed and were refused, and
    whether the run stopped at `max_failures` or because the GPU was lost."""
    stopped = max_failures is not None and rep.failed + rep.refused >= max_failures
    return (f"{rep.failed} of {len(rep.results)} cases failed"
            + (f", {rep.refused} refused by the kernel" if rep.refused else "")
            + (" (stopped at `max_failures`)" if stopped else "")
            + (f" (stopped: the GPU was lost; {rep.not_run} cases not run)" if rep.stopped
               else ""))


def junit_xml(rep) -> str:
    """JUnit XML: one testcase per case (class = its case class), a <failure> per failing one,
    an <error type="refused"> per case the kernel refused."""
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuite name={quoteattr("osm battery " + rep.target)} '
           f'tests="{len(rep.results)}" failures="{rep.failed}" errors="{rep.refused}" '
           f'time="{rep.seconds:.3f}">']
    for r in rep.results:
        t = r.kernel_seconds + r.osm_seconds
        out.append(f'  <testcase classname={quoteattr(r.case.klass)} name={quoteattr(r.case.id)}'
                   f' time="{t:.3f}"' + ("/>" if r.passed else ">"))
        if not r.passed:
            tag = 'error type="refused"' if r.refused else "failure"
            out.append(f"    <{tag} message={quoteattr(r.message)}>"
                       f"{escape(r.where)}</{tag.split()[0]}>")
            out.append("  </testcase>")
    out.append("</testsuite>")
    return "\n".join(out) + "\n"


__all__ = ["battery_doc", "battery_report", "case_text", "fail_line", "junit_xml", "replay_report"]
