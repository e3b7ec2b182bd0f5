"""Judging a kernel's gradients (osm check --dq/--dk/--dv): each against the float64 gradients of
the dtype-rounded inputs, by FlashAttention's backward test rule (docs/numerics.md#grad-rule).

Both rules of FlashAttention's own tests are here by name; osm applies "fa3" by default:
  fa3: max|g − ref| ≤ 2·max|g_pt − ref| + 2·max|(ref + 0.3 − 0.3) − ref|  (FA3's and FA4's tests)
  fa2: max|g − ref| ≤ 3·max|g_pt − ref|                                   (FA2's tests)
ref is the float64 gradient cast to the dtype and g_pt plain same-dtype attention's gradient.
Leaves out: the output's verdict (check.py), the gradients themselves (flash/, backward.py).

Example: check_grads(q, k, v, do, DTYPES["bfloat16"], {"dq": dq}, ScoreOptions())[0].rule.passed
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from osm_cli.errors import OsmError
from osm_cli.flash.options import ScoreOptions
from osm_cli.flash.reference import reference_backward

from .backward import flash_backward, plain_backward
from .dtypes import dtype_name, round_to
from .model import model
from .names import GRAD_RULES as _RULE_NAMES
from .rule import Rule, _fa_rule, max_abs

GRADS = ("dq", "dk", "dv")
LABELS = {"dq": "dQ", "dk": "dK", "dv": "dV"}
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
                kernel: str | None = None, mma: str = "blas",
                pts: dict | None = None) -> tuple[GradCheck, ...]:
    """Judge each gradient of `given` (dq, dk, dv: the kernel's) for dtype-valued q, k, v, do;
    refs and pts, if the caller has them, are the float64 gradients (reference_backward's)
    and plain same-dtype attention's (plain_backward's). The model
    beside them is flash_backward with `kernel`'s forward (its default: the dtype's)."""
    from .check import view_of, worst  # check.py judges the output and calls here

    if rule not in GRAD_RULES:
        raise OsmError(f"gradient rule must be one of {', '.join(GRAD_RULES)}, not {rule!r}")
    if refs is None:
        refs = dict(zip(GRADS, reference_backward(q, k, v, do, opts), strict=True))
    for name, g in given.items():
        if np.shape(g) != refs[name].shape:
            like = {"dq": "Q", "dk": "K", "dv": "V"}[name]
            raise OsmError(f"{LABELS[name]} has shape {tuple(np.shape(g))}; it must be shaped "
                           f"like {like}, {tuple(refs[name].shape)}")
    if pts is None:
        pts = dict(zip(GRADS, plain_backward(q, k, v, do, dt, opts), strict=True))
    mod = None
    if with_model:
        fb = flash_backward(model(dtype_name(dt)), q, k, v, do, opts=opts, trace_at=None,
                            kernel=kernel, mma=mma)
        mod = {"dq": fb.dq, "dk": fb.dk, "dv": fb.dv}
    out = []
    for name in GRADS:
        if name not in given:
            continue
        g = np.asarray(given[name])
        ref = refs[name]
        ref_d = round_to(ref, dt, np.float64)
        r = _fa_rule(g, ref_d, pts[name], dt, GRAD_RULES[rule],
                     model_err=None if mod is None else max_abs(mod[name] - ref_d))
        rows, heads, over, row_err = worst(g, ref_d, None, r.bound, dt,
                                           view_of(opts, "q" if name == "dq" else "k"), top)
        out.append(GradCheck(
            name, r, max_abs(np.asarray(g, dtype=np.float64) - ref),
            max_abs(np.asarray(pts[name], dtype=np.float64) - ref),
            None if mod is None else max_abs(mod[name] - ref), rows, heads,
            int(np.count_nonzero(over)), int(over.size), row_err, ref_d))
    return tuple(out)


__all__ = ["GRADS", "GRAD_RULES", "GradCheck", "check_grads"]
