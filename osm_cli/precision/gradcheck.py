"""Judging a kernel's gradients (osm check --dq/--dk/--dv): each against the float64 gradients of
the dtype-rounded inputs, by FlashAttention's backward test rule (docs/numerics.md#grad-rule).

Both rules of FlashAttention's own tests are here by name; osm applies "fa3" by default:
  fa3: max|g − ref| ≤ 2·max|g_pt − ref| + 2·max|(ref + 0.3 − 0.3) − ref|  (FA3's and FA4's tests)
  fa2: max|g − ref| ≤ 3·max|g_pt − ref|                                   (FA2's tests)
ref is the float64 gradient cast to the dtype and g_pt plain same-dtype attention's gradient.
Where the exact gradient is identically 0 (one key: P = 1, so dS = P∘(dP − D) = 0) both terms
are 0 and so is the bound, which no float32 kernel meets: its dP and D are two float32 sums that
cancel. There the bound is that cancellation's float32 rounding (cancel_floor,
docs/numerics.md#grad-rule), about 10⁻⁷ of the terms: a wrong gradient is of their size.
Leaves out: the output's verdict (check.py), the gradients themselves (flash/, backward.py).

Example: check_grads(q, k, v, do, DTYPES["bfloat16"], {"dq": dq}, ScoreOptions())[0].rule.passed
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from osm_cli.errors import OsmError
from osm_cli.flash.options import ScoreOptions
from osm_cli.flash.reference import reference_backward
from osm_cli.flash.shapes import as_bhnd

from .backward import flash_backward, plain_backward
from .dtypes import bits, dtype_name, round_to, ulp
from .model import model
from .names import GRAD_RULES as _RULE_NAMES
from .rule import Rule, _fa_rule, _rule, max_abs, max_abs_diff

GRADS = ("dq", "dk", "dv")
SINK = "dsink"  # the learnable sink's gradient, one per query head (FA4's learnable_sink)
LABELS = {"dq": "dQ", "dk": "dK", "dv": "dV", SINK: "dsink"}
# name -> (k_pt, k_round, k_abs): bound = k_pt·max|g_pt − ref| + k_round·rounding + k_abs
GRAD_RULES = dict(zip(_RULE_NAMES, ((2.0, 2.0, 0.0), (3.0, 0.0, 0.0)), strict=True))


@dataclass(frozen=True)
class GradCheck:
    """One gradient judged: the rule, its errors against float64, the worst rows and heads."""

    name: str  # dq, dk or dv
    rule: Rule
    err64: float  # max |g − ref64|
    plain_err64: float  # max |g_pt − ref64|
    model_err: float | None  # osm's flash model of FA2's backward on the same inputs
    rows: tuple  # check.RowError: the worst rows (query rows of dQ, key rows of dK and dV)
    heads: tuple  # check.HeadError
    rows_over: int
    total_rows: int
    row_err: np.ndarray | None = field(default=None, repr=False, compare=False)  # (B, H, rows)
    ref_d: np.ndarray | None = field(default=None, repr=False, compare=False)  # ref in the dtype
    floor: float = 0.0  # the bound where the exact gradient is identically 0 (cancel_floor)
    varlen: bool = False  # rows and heads are a varlen sequence's: batch holds the sequence

    @property
    def label(self) -> str:
        return LABELS[self.name]

    @property
    def severity(self) -> float:
        """err / bound: above 1 fails; the report's worst gradient has the largest."""
        b = self.rule.bound
        return np.inf if not b and self.rule.err else (self.rule.err / b if b else 0.0)


def check_grads(q, k, v, do, dt: np.dtype, given: dict, opts: ScoreOptions, *, top: int = 5,
                with_model: bool = True, rule: str = "fa3", refs: dict | None = None,
                kernel: str | None = None, mma: str | None = None,
                pts: dict | None = None) -> tuple[GradCheck, ...]:
    """Judge each gradient of `given` (dq, dk, dv: the kernel's) for dtype-valued q, k, v, do;
    refs and pts, if the caller has them, are the float64 gradients (reference_backward's)
    and plain same-dtype attention's (plain_backward's). The model
    beside them is flash_backward with `kernel`'s forward (its default: the dtype's)."""
    from .check import packed_offsets, view_of, worst  # check.py judges the output, calls here

    if rule not in GRAD_RULES:
        raise OsmError(f"gradient rule must be one of {', '.join(GRAD_RULES)}, not {rule!r}")
    sink = SINK in given
    if sink and opts.sinks is None:
        raise OsmError("dsink is the gradient of the sinks (learnable_sink): give them to judge "
                       "it")
    if refs is None or (sink and SINK not in refs):
        refs = _named(reference_backward(q, k, v, do, opts))
    for name, g in given.items():
        if np.shape(g) != refs[name].shape:
            like = {"dq": "Q", "dk": "K", "dv": "V", SINK: "the sinks (one per query head)"}
            raise OsmError(f"{LABELS[name]} has shape {tuple(np.shape(g))}; it must be shaped "
                           f"like {like[name]}, {tuple(refs[name].shape)}")
    if pts is None or (sink and SINK not in pts):
        pts = _named(plain_backward(q, k, v, do, dt, opts))
    mod = None
    if with_model:
        fb = flash_backward(model(dtype_name(dt)), q, k, v, do, opts=opts, trace_at=None,
                            kernel=kernel, mma=mma)
        mod = {"dq": fb.dq, "dk": fb.dk, "dv": fb.dv, SINK: getattr(fb, "dsink", None)}
    out = []
    for name in (*GRADS, SINK):
        if name not in given:
            continue
        if name == SINK:
            out.append(_sink_check(np.asarray(given[SINK]), refs[SINK], pts[SINK],
                                   None if mod is None else mod[SINK], top))
            continue
        g = np.asarray(given[name])
        ref = refs[name]
        ref_d = round_to(ref, dt, np.float64)
        r = _fa_rule(g, ref_d, pts[name], dt, GRAD_RULES[rule],
                     model_err=None if mod is None else max_abs_diff(mod[name], ref_d))
        floor = 0.0
        if r.bound == 0 and bits(dt) <= 32 and not np.any(ref_d):
            floor = cancel_floor(name, q, k, v, do, opts)
            r = replace(r, bound=floor, k_abs=floor, passed=bool(r.err <= floor),
                        note="the exact gradient is 0 (its terms cancel), so the bound is "
                        "float32's rounding of the terms (docs/numerics.md#grad-rule)")
        x = "q" if name == "dq" else "k"
        cu = packed_offsets(opts, x)
        rows, heads, over, row_err = worst(g, ref_d, None, r.bound, dt, view_of(opts, x), top,
                                           cu_seqlens=cu)
        out.append(GradCheck(
            name, r, max_abs_diff(g, ref),
            max_abs_diff(pts[name], ref),
            None if mod is None else max_abs_diff(mod[name], ref), rows, heads,
            int(np.count_nonzero(over)), int(over.size), row_err, ref_d, floor,
            cu is not None))
    return tuple(out)


def _named(grads) -> dict:
    """reference_backward's Grads as a dict, with "dsink" where it has one."""
    out = dict(zip(GRADS, grads, strict=True))
    if getattr(grads, "dsink", None) is not None:
        out[SINK] = np.asarray(grads.dsink, dtype=np.float64)
    return out


def _sink_check(g, ref, pt, mod, top: int) -> GradCheck:
    """dsink judged as FlashAttention-4's tests judge it (check_dsink_vs_ref): against the
    float64 gradient in float32 (the sinks' dtype), |dsink − ref| ≤ 2·max|pt − ref| + 2 ulp,
    osm taking the ulp of the largest |ref| (one bound for the tensor, as for the others).
    Its rows are the query heads (batch 0: the sinks' gradient sums the batch)."""
    from .check import HeadError, RowError  # check.py judges the output and calls here

    f32 = np.dtype(np.float32)
    ref_d = round_to(ref, f32, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = max_abs_diff(g, ref_d)
        pt_err = max_abs_diff(pt, ref_d)
    two_ulp = float(ulp(max_abs(ref_d), f32)) if ref_d.size else 0.0
    r = _rule(err, pt_err, two_ulp, 2.0, 2.0,
              model_err=None if mod is None else max_abs_diff(mod, ref_d))
    r = replace(r, note=(r.note + "; " if r.note else "") + "rounding: one float32 ulp of the "
                "largest |dsink| (FA4's tests add 2 ulp)")
    diff = np.abs(np.asarray(g, dtype=np.float64).ravel() - ref_d.ravel())
    diff = np.where(np.isnan(diff), np.inf, diff)
    with np.errstate(over="ignore", invalid="ignore"):
        ulps = diff / ulp(np.abs(ref_d.ravel()), f32)
    order = np.argsort(-diff, kind="stable")[:top]
    rows = tuple(RowError(0, int(h), 0, float(diff[h]), float(ulps[h]), None) for h in order)
    heads = tuple(HeadError(0, int(h), float(diff[h]), int(not diff[h] <= r.bound))
                  for h in order)
    over = ~(diff <= r.bound)
    return GradCheck(SINK, r, max_abs_diff(g, ref),
                     max_abs_diff(pt, ref),
                     None if mod is None else max_abs_diff(mod, ref), rows, heads,
                     int(np.count_nonzero(over)), int(over.size), diff.reshape(1, -1, 1), ref_d)


U32 = 2.0**-24  # float32's unit roundoff: the kernels' dP, D and dS are float32


def cancel_floor(name: str, q, k, v, do, opts: ScoreOptions) -> float:
    """The float32 rounding of the terms that cancel in a gradient that is exactly 0, 2·u·T,
    T bounding them: dS_ij = P_ij·(dP_ij − D_i) with |dP_ij|, |D_i| ≤ ‖dO_i‖·max‖V_j‖
    (O a mean of V's rows), then dQ_i = scale·Σ_j dS_ij·K_j (Σ_j P_ij ≤ 1) and dK_j =
    scale·Σ_i dS_ij·Q_i (Σ_i P_ij ≤ the query rows of its kv head); 0 for dV (Pᵀ·dO
    does not cancel).
    Example: cancel_floor("dq", q, k, v, do, ScoreOptions()) -> about 1e-5 for unit inputs"""
    if name == "dv":
        return 0.0
    d = np.shape(q)[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        t = 2.0 * _max_norm(do) * _max_norm(v) * opts.scale_for(d)
        if name == "dq":
            t *= _max_abs(k)
        else:
            t *= _max_abs(q) * _rows_per_kv_head(q, k, opts)
    return float(2.0 * U32 * t) if math.isfinite(t) else 0.0


def _max_norm(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt((x * x).sum(axis=-1)).max(initial=0.0))


def _max_abs(x) -> float:
    return float(np.abs(np.asarray(x, dtype=np.float64)).max(initial=0.0))


def _rows_per_kv_head(q, k, opts: ScoreOptions) -> int:
    """The query rows whose scores one key of one kv head enters: a sequence's rows (the
    longest of a varlen batch) times the query heads of the group."""
    p = opts.packing
    if p.active:
        hq, hk = np.shape(q)[-2], np.shape(k)[-2]
        rows = (int(np.diff(np.asarray(p.cu_seqlens_q)).max(initial=0))
                if p.cu_seqlens_q is not None else int(np.shape(q)[-3]))
    else:
        q4, k4 = as_bhnd(np.asarray(q), opts.layout, "Q"), as_bhnd(np.asarray(k), opts.layout, "K")
        hq, hk, rows = q4.shape[1], k4.shape[1], q4.shape[2]
    return rows * max(1, hq // max(1, hk))


__all__ = ["GRADS", "GRAD_RULES", "SINK", "GradCheck", "cancel_floor", "check_grads"]
