"""The rules beside FlashAttention's that osm check reports (docs/check.md#rules): the model
rule (error ≤ 1.25× osm's model of the named kernel), the per-head signed relative bias of
(out − ref), the exact zero a row that sees no key must hold, and the cross-table of what other
projects' tolerance rules would say on the same tensors (docs/numerics.md#fa-rule).

Leaves out: FlashAttention's rule (rule.py), running the model (check.py), printing.

Example: model_rule(err=3e-3, model_err=1e-3).passed -> False
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .dtypes import bits, dtype_name
from .rule import Rule

MODEL_FACTOR = 1.25  # --rule model: error ≤ this × osm's model of the kernel
LSE_ULPS = 4  # … and the LSE's error may reach this many float32 ulps of its largest |LSE|
#              (a correct kernel's m·scale + log l rounds two or three times: 1-2 ulps)
BIAS_SIGMAS = 6.0  # a head's bias is flagged past this many standard errors …
BIAS_MODEL = 4.0  # … and this many times the model's own bias in that head
BIAS_FLOOR = 1e-4  # … and at least this relative bias


CANCEL_WHY = "float32's rounding of the cancelling terms, the exact gradient being 0"
LSE_WHY = f"{LSE_ULPS} float32 ulps of the largest |LSE|"


def model_rule(err: float, model_err: float | None, kernel: str = "the kernel",
               floor: float = 0.0, floor_why: str = CANCEL_WHY) -> Rule:
    """err ≤ 1.25 × the model's error (both against float64), or ≤ floor where that is larger
    (a gradient that is exactly 0: gradcheck.cancel_floor, CANCEL_WHY; the LSE: lse_floor,
    LSE_WHY), floor_why saying what the floor is; a NaN error fails."""
    if model_err is None or not math.isfinite(model_err):
        return Rule(err, math.nan, 0.0, math.inf, False,
                    "the model rule needs osm's model of the kernel (it was not run)",
                    MODEL_FACTOR, 0.0)
    bound = max(MODEL_FACTOR * model_err, floor)
    return Rule(err, model_err, 0.0, bound, bool(err <= bound), f"{MODEL_FACTOR:g}× osm's "
                f"{kernel} model" + (f", or {floor_why}" if bound == floor > 0 else ""),
                MODEL_FACTOR, 0.0)


def lse_floor(ref_lse) -> float:
    """The model rule's least bound on the LSE's error: LSE_ULPS float32 ulps of the largest
    finite |LSE| of the reference (0 where none is finite). An LSE wrong by a convention or a
    precision bug errs by orders of magnitude more (docs/check.md#rules).

    Example: lse_floor(np.array([2.5, -np.inf])) -> 9.5367431640625e-07
    """
    lse = np.asarray(ref_lse, dtype=np.float64)
    top = float(np.abs(lse[np.isfinite(lse)]).max(initial=0.0))
    return LSE_ULPS * float(np.spacing(np.float32(top))) if top else 0.0


@dataclass(frozen=True)
class HeadBias:
    """One head's signed relative bias Σ(out − ref)·ref / Σ ref², its standard error, and the
    model's bias in that head (None without a model)."""

    batch: int
    head: int
    bias: float
    sigma: float
    model_bias: float | None
    flagged: bool


def head_bias(out4, ref4, model4=None) -> tuple[HeadBias, ...]:
    """Per (batch, head) bias of (B, H, rows, d) arrays, worst (largest |bias| / σ) first; a
    head whose whole output is scaled by 1 + ε shows bias ε, rounding noise averages out.
    One head at a time, so that no temporary is larger than a head."""
    out = []
    for bb in range(ref4.shape[0]):
        for hh in range(ref4.shape[1]):
            r = np.asarray(ref4[bb, hh], dtype=np.float64)
            e = np.asarray(out4[bb, hh], dtype=np.float64) - r
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                rr = float((r * r).sum())
                x = float((e * r).sum()) / rr if rr else 0.0
                res = (e - x * r) * r
                s = math.sqrt(float((res * res).sum())) / rr if rr else 0.0
                m = None
                if model4 is not None:
                    m = float(((np.asarray(model4[bb, hh], dtype=np.float64) - r) * r).sum())
                    m = m / rr if rr else 0.0
            flag = bool(math.isfinite(x) and abs(x) > BIAS_FLOOR and abs(x) > BIAS_SIGMAS * s
                        and (m is None or abs(x) > BIAS_MODEL * abs(m)))
            out.append(HeadBias(bb, hh, x, s, m, flag))

    def key(h: HeadBias) -> float:
        if not math.isfinite(h.bias):
            return math.inf
        return abs(h.bias) / h.sigma if h.sigma else (math.inf if h.bias else 0.0)

    return tuple(sorted(out, key=lambda h: -key(h)))


def nonzero_masked(out4, no_key) -> np.ndarray:
    """(B, H, rows) bool: rows that see no key whose output is not exactly 0 (every kernel's
    contract; NaN counts)."""
    o = np.asarray(out4)
    return np.asarray(no_key, dtype=bool) & ~(o == 0).all(axis=-1)


# torch.testing.assert_close's defaults by dtype (rtol, atol)
TORCH_DEFAULTS = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
                  "float64": (1e-7, 1e-7)}


@dataclass(frozen=True)
class OtherRule:
    """What one project's tolerance rule says of one tensor: elements failing, the verdict."""

    rule: str
    tensor: str
    passed: bool | None  # None: the rule has no setting for this dtype
    failing: int
    total: int


def _close(got, ref, rtol: float, atol: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.abs(got - ref) <= atol + rtol * np.abs(ref)


def other_rules(tensors: dict, dt) -> tuple[OtherRule, ...]:
    """tensors: name -> (kernel's values, float64 reference); each rule's verdict on each:
    torch.testing.assert_close's defaults; atol 1e-2, rtol 0 (Triton's tutorial); KernelBench's
    allclose (1e-2 for 16-bit, 1e-4 for float32); flashinfer-bench's matched ratio (an element
    fails where abs > 1e-2 and rel > 1e-2; pass when ≥ 95 % match)."""
    name = dtype_name(dt)
    kb = 1e-4 if bits(dt) >= 32 else 1e-2
    out = []
    for t, (got, ref) in tensors.items():
        g = np.asarray(got, dtype=np.float64)
        r = np.asarray(ref, dtype=np.float64)
        fin = np.isfinite(r)
        g, r = g[fin], r[fin]
        n = int(r.size)
        tol = TORCH_DEFAULTS.get(name)
        if tol is None:
            out.append(OtherRule("torch.testing.assert_close defaults", t, None, 0, n))
        else:
            bad = n - int(np.count_nonzero(_close(g, r, *tol)))
            out.append(OtherRule("torch.testing.assert_close defaults", t, bad == 0, bad, n))
        bad = n - int(np.count_nonzero(_close(g, r, 0.0, 1e-2)))
        out.append(OtherRule("atol 1e-2 (Triton's tutorial)", t, bad == 0, bad, n))
        bad = n - int(np.count_nonzero(_close(g, r, kb, kb)))
        out.append(OtherRule(f"KernelBench allclose ({kb:g})", t, bad == 0, bad, n))
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.abs(g - r)
            rel = a / np.abs(r)
            miss = (a > 1e-2) & (rel > 1e-2) | np.isnan(g)
        bad = int(np.count_nonzero(miss))
        out.append(OtherRule("flashinfer-bench matched ratio ≥ 0.95", t,
                             n == 0 or (n - bad) / n >= 0.95, bad, n))
    return tuple(out)


__all__ = ["BIAS_SIGMAS", "MODEL_FACTOR", "HeadBias", "OtherRule", "head_bias", "model_rule",
           "nonzero_masked", "other_rules"]
