"""One case judged: the kernel called behind its guards (kernel.py), then osm check's verdict on
out, lse and the gradients against the float64 reference (FlashAttention's rule, or `model`:
within 1.25× osm's model of the kernel), NaN never passing; with repeat > 1 the bitwise
differences between runs, per tensor.

Leaves out: which cases (draw.py), shrinking (shrink.py), the report (runner.py, present/).

Example: judge(target, Case(1, 2, 2, 65, 128, 64)).passed
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.errors import OsmError

from .cases import Case, inputs
from .kernel import Call, Target, _np_dtype, call

RULES = ("fa", "model")
MODEL_FACTOR = 1.25  # --rule model: error ≤ 1.25 × osm's model of the kernel (issue 22)
TENSORS = ("out", "lse", "dq", "dk", "dv")


@dataclass(frozen=True)
class Nondeterminism:
    tensor: str
    runs_differing: int  # of repeat − 1 reruns
    max_diff: float


@dataclass(frozen=True)
class CaseResult:
    """A case's verdict: failed names the failing tensors ("kernel" for an exception or a
    guard, "refused" for a kernel that said it does not take the case); message is one line;
    rule, bound and err are the worst failing tensor's."""

    case: Case
    failed: tuple[str, ...] = ()
    message: str = ""
    rule: str = "fa"
    bound: float | None = None
    err: float | None = None
    where: str = ""
    convention: str = ""  # what the probe found (probe.py); "" when nothing explains it
    nondeterminism: tuple[Nondeterminism, ...] = ()
    kernel_seconds: float = 0.0
    osm_seconds: float = 0.0
    report: object = None  # osm check's CheckReport (replay renders it); None after an error
    reference: str = "numpy"  # where the reference and baseline were computed: numpy, torch
    lost: bool = False  # the kernel's error left the GPU unusable: the battery stops here

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def refused(self) -> bool:
        """The kernel refused the case (an unsupported shape), as opposed to getting it wrong."""
        return self.failed == ("refused",)


def check_options(case: Case, data: dict) -> dict:
    """osm check's keywords (ScoreOptions fields) for the case: FlashAttention's arrays under
    osm's names, the batch in bnhd."""
    opts = {"causal": case.causal, "layout": "bnhd", "scale": 1.0 / math.sqrt(case.d)}
    if case.window is not None:
        opts["window"] = tuple(case.window)
    if case.softcap is not None:
        opts["softcap"] = case.softcap
    names = {"alibi_slopes": "alibi_slopes", "learnable_sink": "sinks",
             "cu_seqlens_q": "cu_seqlens_q", "cu_seqlens_k": "cu_seqlens_k",
             "seqused_k": "seqused_k", "page_table": "page_table"}
    for fa, osm in names.items():
        if fa in data:
            opts[osm] = data[fa]
    if case.varlen:
        opts.pop("seqused_k", None)
    if case.score_mod or case.mask_mod:
        from .modcases import numpy_mods

        score, mask = numpy_mods(case)
        if score is not None:
            opts["score_mod"] = score
        if mask is not None:
            opts["mask_mod"] = mask
    return opts


def judge(target: Target, case: Case, rule: str = "fa", repeat: int = 1,
          top: int = 3) -> CaseResult:
    """Run the case on the kernel and judge what it gave."""
    t0 = time.perf_counter()
    data = inputs(case)
    got = call(target, case, data)
    kernel_s = got.seconds
    if got.error:
        return CaseResult(case, ("refused" if got.refused else "kernel",), got.error, rule,
                          kernel_seconds=kernel_s, lost=got.lost,
                          osm_seconds=time.perf_counter() - t0 - kernel_s)
    nondet = ()
    if repeat > 1:
        nondet, more = _reruns(target, case, data, got, repeat)
        kernel_s += more
    base = _torch_baseline(target, case, data, got) if target.reference == "torch" else None
    res = verdict(case, data, got, rule, top, baseline=base)
    if base is not None:
        res = replace(res, reference="torch")
    return _timed(res, nondet, kernel_s, time.perf_counter() - t0 - kernel_s)


def _torch_baseline(target: Target, case: Case, data: dict, got: Call) -> dict | None:
    """The reference and baseline with torch on the kernel's device, or None (the numpy path
    stands in) where torch cannot make them there, out of memory say."""
    from .torchref import baseline

    try:
        return baseline(case, data, target.device, grads=bool(got.grads))
    except Exception:  # noqa: BLE001 - the numpy reference is always there to fall back on
        return None


def _timed(res: CaseResult, nondet, kernel_s: float, osm_s: float) -> CaseResult:
    return replace(res, nondeterminism=nondet, kernel_seconds=kernel_s, osm_seconds=osm_s)


def verdict(case: Case, data: dict, got: Call, rule: str = "fa", top: int = 3,
            baseline: dict | None = None, **overrides) -> CaseResult:
    """osm check on the call's tensors; overrides change check's options (the probe);
    baseline: the reference and plain attention made elsewhere (torchref.py)."""
    from osm_cli.precision.check import check

    dt = _np_dtype(case.dtype)
    q, k, v = (data[n].astype(dt) for n in ("q", "k", "v"))
    grads = dict(got.grads)
    if grads:
        grads["do"] = data["dout"].astype(dt)
    lse = got.lse
    try:
        rep = check(got.out, q, k, v, dt, lse=lse, top=top, with_model=rule == "model",
                    baseline=baseline, **grads, **{**check_options(case, data), **overrides})
    except OsmError as exc:
        return CaseResult(case, ("kernel",), f"osm check refused the output: {exc}", rule)
    return _read(case, rep, rule)


def _read(case: Case, rep, rule: str) -> CaseResult:
    """The failing tensors of a CheckReport, worst first, with rule, bound and location."""
    fails = []  # (severity, tensor, err, bound, rows_over, total_rows, worst row)
    v = rep.verdict
    out_bound = v.rule.bound
    if rule == "model" and rep.model_err is not None:
        out_bound = MODEL_FACTOR * rep.model_err + 1e-300
    out_ok = (v.rule.passed if rule == "fa" else bool(v.err <= out_bound))
    if not out_ok:
        err = v.rule.err if rule == "fa" else v.err
        fails.append((_sev(err, out_bound), "out", err, out_bound, rep.rows_over,
                      rep.total_rows, rep.rows[0] if rep.rows else None))
    if v.lse is not None and not v.lse.passed:
        fails.append((_sev(v.lse.err, v.lse.bound), "lse", v.lse.err, v.lse.bound, None, None,
                      max(rep.rows, key=lambda r: _nan_big(r.lse_err), default=None)))
    for g in rep.grads:
        bound = g.rule.bound
        ok = g.rule.passed
        err = g.rule.err
        if rule == "model" and g.model_err is not None:
            bound, err = MODEL_FACTOR * g.model_err + 1e-300, g.err64
            ok = bool(err <= bound)
        if not ok:
            fails.append((_sev(err, bound), g.name, err, bound, g.rows_over, g.total_rows,
                          g.rows[0] if g.rows else None))
    if not fails:
        return CaseResult(case, (), "", rule, report=rep)
    fails.sort(key=lambda f: -f[0])
    sev, name, err, bound, over, total, row = fails[0]
    what = "FlashAttention's rule" if rule == "fa" else f"{MODEL_FACTOR:g}× osm's model"
    msg = (f"{name}: max error {_g(err)} > bound {_g(bound)} ({what})" if not math.isnan(err)
           else f"{name}: NaN in the kernel's {name} (NaN never passes)")
    return CaseResult(case, tuple(f[1] for f in fails), msg, rule, bound, err,
                      _where(name, row, over, total, case), report=rep)


def _nan_big(x) -> float:
    return math.inf if x is None or math.isnan(x) else x


def _sev(err: float, bound: float) -> float:
    if math.isnan(err):
        return math.inf
    return err / bound if bound else math.inf


def _g(x: float) -> str:
    return f"{x:.3g}"


def _where(name: str, row, over, total, case: Case) -> str:
    """Where the worst failing row is: batch (or sequence), head, query (key for dK, dV)."""
    parts = []
    if over is not None and total:
        parts.append(f"{over} of {total} rows over the bound")
    if row is not None:
        unit = "key" if name in ("dk", "dv") else "query"
        batch = "sequences packed" if case.varlen and row.batch == 0 else f"batch {row.batch}"
        parts.append(f"worst at {batch}, head {row.head}, {unit} {row.query}")
    return "; ".join(parts)


def _reruns(target: Target, case: Case, data: dict, first: Call, repeat: int):
    """(Nondeterminism per tensor that differed bitwise from the first run, kernel seconds)."""
    first_t = {"out": first.out, "lse": first.lse, **first.grads}
    diffs = {n: [0, 0.0] for n, x in first_t.items() if x is not None}
    spent = 0.0
    for _ in range(repeat - 1):
        again = call(target, case, data)
        spent += again.seconds
        now = {"out": again.out, "lse": again.lse, **again.grads}
        for n in diffs:
            a, b = first_t[n], now.get(n)
            if b is None or a.shape != b.shape:
                diffs[n][0] += 1
                diffs[n][1] = math.inf
                continue
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            same = np.array_equal(a64, b64, equal_nan=True)
            if not same:
                diffs[n][0] += 1
                with np.errstate(invalid="ignore"):
                    d = np.nanmax(np.abs(a64 - b64)) if a64.size else 0.0
                diffs[n][1] = max(diffs[n][1], float(d))
    return tuple(Nondeterminism(n, c, m) for n, (c, m) in diffs.items() if c), spent


__all__ = ["MODEL_FACTOR", "RULES", "TENSORS", "CaseResult", "Nondeterminism", "judge",
           "verdict"]
