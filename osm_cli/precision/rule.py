"""FlashAttention's own test rule, the verdict osm gives a run or a kernel.

Pass when max|out − ref| ≤ 2·max|pt − ref| + 2·max|(ref + 0.3 − 0.3) − ref|, with ref the
upcast reference cast back to the dtype and pt plain same-dtype attention; osm applies the same
rule to the LSE, and a fixed tolerance to float64 runs (docs/numerics.md#fa-rule). A bound is
always finite: where plain attention overflows (its error inf or NaN) the rule takes osm's
kernel model's error in its place, or without a model the dtype's rounding, and says so
(docs/inputs.md#unusable-baseline); a PASS is never given against an infinite bound.
Leaves out: running anything (model.py, check.py).

Example: fa_rule(out, ref64, pt, DTYPES["float16"]).passed
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .dtypes import bits, blocks, dtype_name, round_to

F64_TOLERANCE = 1e-12  # float64 runs: max|out − ref| ≤ this · max(1, max|ref|)


@dataclass(frozen=True)
class Rule:
    """err ≤ 2·pt_err + 2·rounding, FlashAttention's rule for one quantity (O or LSE)."""

    err: float  # max |out − ref|
    pt_err: float  # max |pt − ref|, plain same-dtype attention
    rounding: float  # max |(ref + 0.3 − 0.3) − ref|, the 0.3 arithmetic in the dtype
    bound: float
    passed: bool
    note: str = ""
    k_pt: float = 2.0  # bound = k_pt·pt_err + k_round·rounding (+ k_abs)
    k_round: float = 2.0
    k_abs: float = 0.0
    stand_in: str = ""  # what replaced a pt_err that is not finite: "model" or "rounding"
    base: float | None = None  # the error k_pt multiplies: pt_err, or its stand-in's

    @property
    def baseline(self) -> float:
        """The error the bound multiplies by k_pt: plain attention's, or its stand-in's."""
        return self.pt_err if self.base is None else self.base


def max_abs(d: np.ndarray) -> float:
    # NaN propagates (a NaN anywhere fails the rule); empty arrays have no error.
    return float(np.max(np.abs(d))) if d.size else 0.0


def max_abs_diff(x, ref) -> float:
    """max |x − ref| in float64, as max_abs(np.asarray(x, float64) − ref) gives it (NaN
    propagates; empty: 0), a piece at a time: a realistic layer's float64 difference is never
    held whole (benchmarks/bench_check.py)."""
    x, ref = np.asarray(x), np.asarray(ref)
    if x.shape != ref.shape:
        x, ref = np.broadcast_arrays(x, ref)
    if not x.size:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        tops = [np.max(np.abs(x[ix].astype(np.float64) - ref[ix])) for ix in blocks(x.shape)]
    return float(np.max(tops))


def _rule(err: float, pt_err: float, rounding_err: float, k_pt: float = 2.0,
          k_round: float = 2.0, k_abs: float = 0.0, model_err: float | None = None) -> Rule:
    """The bound k_pt·pt_err + k_round·rounding + k_abs, always finite: a baseline that is not
    finite (plain attention overflowed) is replaced by osm's kernel model's error (model_err,
    a faithful kernel's), or without one by the rounding, and the note says why."""
    factors = (k_pt, k_round, k_abs)
    if not math.isfinite(rounding_err):
        rounding_err = 0.0  # only where the reference itself is past the dtype's range
    note, stand_in, base = "", "", pt_err
    if not math.isfinite(pt_err):
        why = f"plain same-dtype attention overflowed (max|pt − ref| = {pt_err:g}), so it is no "
        if model_err is not None and math.isfinite(model_err):
            stand_in, base = "model", model_err
            note = why + "baseline: the bound takes osm's kernel model's error in its place"
        else:
            stand_in, base = "rounding", rounding_err
            note = why + "baseline: the bound takes the dtype's rounding in its place"
    bound = k_pt * base + k_round * rounding_err + k_abs
    return Rule(err, pt_err, rounding_err, bound, bool(err <= bound), note, *factors,
                stand_in, None if not stand_in else base)


def fa_rule(out, ref, pt, dtype) -> Rule:
    """FlashAttention's test: ref = the upcast reference cast back to the dtype, pt = plain.

    Pass when max|out − ref| ≤ 2·max|pt − ref| + 2·max|(ref + 0.3 − 0.3) − ref|, the last done in
    the dtype. osm's upcast reference is float64 (FlashAttention's tests use float32); cast to a
    16- or 8-bit dtype the two agree except at rounding ties.

    Example: fa_rule(out, ref64, pt, DTYPES["float16"]).passed
    """
    dt = np.dtype(dtype)
    return _fa_rule(out, round_to(ref, dt, np.float64), pt, dt)


def _fa_rule(out, ref_d, pt, dt: np.dtype, factors: tuple = (2.0, 2.0, 0.0),
             model_err: float | None = None) -> Rule:
    """fa_rule with ref already rounded to the dtype (ref_d, float64), for callers that keep it;
    factors (k_pt, k_round, k_abs) make the bound k_pt·pt_err + k_round·rounding + k_abs (the
    gradients' rules, gradcheck.py); model_err, osm's kernel model's max|model − ref_d|, stands
    in for pt's error where that is not finite (_rule)."""
    err, pt_err = max_abs_diff(out, ref_d), max_abs_diff(pt, ref_d)
    rounding_err = _rounding_err(ref_d, dt)
    if bits(dt) > 32:
        # In float64 plain attention is the reference itself (pt_err = 0): no narrower baseline.
        bound = F64_TOLERANCE * max(1.0, max_abs_diff(ref_d, 0.0))
        return Rule(err, pt_err, rounding_err, bound, bool(err <= bound),
                    f"float64: the reference's own precision; bound {F64_TOLERANCE:g}·max|ref|")
    return _rule(err, pt_err, rounding_err, *factors, model_err=model_err)


def _rounding_err(ref_d: np.ndarray, dt: np.dtype) -> float:
    """max|(ref + 0.3 − 0.3) − ref| over ref_d's finite values, the 0.3 arithmetic in dt (a
    piece at a time)."""
    third = np.array(0.3).astype(dt)
    tops = []
    for ix in blocks(ref_d.shape):
        part = ref_d[ix]
        r = part[np.isfinite(part)]
        if r.size:
            with np.errstate(over="ignore", invalid="ignore"):
                moved = ((r.astype(dt) + third) - third).astype(np.float64)
            tops.append(max_abs(moved - r))
    return float(np.max(tops)) if tops else 0.0


def lse_errors(lse, ref_lse) -> np.ndarray:
    """|lse − ref| per row; on fully masked rows (ref −inf) any convention (−inf, +inf, 0) is 0."""
    x = np.asarray(lse, dtype=np.float64)
    ref = np.asarray(ref_lse, dtype=np.float64)
    masked = np.isneginf(ref)
    ok_masked = np.isinf(x) | (x == 0)
    with np.errstate(invalid="ignore"):
        d = np.abs(x - np.where(masked, 0.0, ref))
    return np.where(masked, np.where(ok_masked, 0.0, np.inf), np.where(np.isnan(x), np.nan, d))


def lse_rule(lse, ref_lse, pt_lse) -> Rule:
    """The same rule for the LSE (osm's extension): pt's LSE is the logsumexp of the dtype-rounded
    scores, and the 0.3 arithmetic is done in float32, the LSE's own dtype."""
    return _lse_rule(lse_errors(lse, ref_lse), lse_errors(pt_lse, ref_lse), ref_lse)


def _lse_rule(errs: np.ndarray, pt_errs: np.ndarray, ref_lse,
              model_err: float | None = None) -> Rule:
    """lse_rule from the per-row lse_errors of the run (errs) and of plain attention (pt_errs);
    model_err, osm's kernel model's LSE error, stands in for a pt error that is not finite."""
    ref = np.asarray(ref_lse, dtype=np.float64)
    finite = ref[np.isfinite(ref)]
    third = np.float32(0.3)
    with np.errstate(over="ignore", invalid="ignore"):  # past float32's range: no term
        f32 = finite.astype(np.float32)
        moved = ((f32 + third) - third).astype(np.float64) - f32
    return _rule(max_abs(errs), max_abs(pt_errs), max_abs(moved[np.isfinite(moved)]),
                 model_err=model_err)


@dataclass(frozen=True)
class Verdict:
    """A run (or an external kernel) judged against the float64 reference and the FA rule."""

    dtype: str
    err: float  # max |out − ref64|
    plain_err: float  # max |pt − ref64|
    lse_err: float | None  # max |lse − ref64 LSE|
    plain_lse_err: float
    rule: Rule
    lse: Rule | None

    @property
    def passed(self) -> bool:
        return self.rule.passed and (self.lse is None or self.lse.passed)


def judge(out, ref, pt, dtype, *, lse=None, ref_lse=None, pt_lse=None) -> Verdict:
    """Errors against the float64 reference (ref, ref_lse) and the FA rule with plain `pt`."""
    ref64 = np.asarray(ref, dtype=np.float64)
    lse_err = None if lse is None else lse_errors(lse, ref_lse)
    return judged(out, ref64, round_to(ref64, dtype, np.float64), pt, dtype, lse_err, ref_lse,
                   pt_lse)


def judged(out, ref64, ref_d, pt, dtype, lse_err, ref_lse, pt_lse, *,
           model_err: float | None = None, model_lse_err: float | None = None) -> Verdict:
    """judge, given ref64 rounded to the dtype (ref_d) and the run's per-row lse_errors (None
    without an LSE), which check() goes on to use row by row; model_err and model_lse_err
    (osm's kernel model's max|out − ref_d| and LSE error) bound a run whose plain baseline
    overflowed."""
    err, plain_err = max_abs_diff(out, ref64), max_abs_diff(pt, ref64)
    pt_lse_err = None if lse_err is None and pt_lse is None else lse_errors(pt_lse, ref_lse)
    lrule = None if lse_err is None else _lse_rule(lse_err, pt_lse_err, ref_lse, model_lse_err)
    return Verdict(
        dtype_name(dtype), err, plain_err, None if lrule is None else lrule.err,
        max_abs(pt_lse_err) if pt_lse is not None else math.nan,
        _fa_rule(out, ref_d, pt, np.dtype(dtype), model_err=model_err), lrule,
    )
