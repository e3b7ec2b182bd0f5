"""Naming a failure: the conventions real kernels get wrong, tried on a failing (shrunk) case.
The kernel's tensors are judged again as if it followed each alternative; the first under which
the failing tensors pass names the bug ("the LSE is in base 2", "causal aligned top-left", "the
scale is 1/d", "query head h reads K/V head h % Hkv", "the kernel ignores softcap", …). The probe
never turns a FAIL into a PASS: the verdict stays the kernel's own.

Leaves out: localisation beyond the worst row (judge.py) and the check helper's fuller probe.
Example: probe(target, failed_result) -> "the LSE is in base 2 …"
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .cases import Case, inputs
from .judge import CaseResult, verdict
from .kernel import Target, call


def _alternatives(case: Case, failed: set) -> list:
    """(description, how to judge): how is (case, data-edit, check overrides, lse factor)."""
    alts = []
    if "lse" in failed:
        alts.append(("the LSE is in base 2 (m·log₂e + log₂ l, FlashInfer's and Triton's "
                     "convention): give --lse-base 2 if that is the kernel's contract",
                     None, {}, math.log(2)))
    if case.causal and case.nq != case.nk:
        alts.append(("the causal mask is aligned top-left (key j ≤ query i), where "
                     "FlashAttention aligns it bottom-right (j ≤ i + N_k − N_q)", None,
                     {"causal_align": "top-left"}, 1.0))
    alts += [(f"the scores are scaled by 1/d = {1 / case.d:.3g}, not softmax_scale = 1/√d",
              None, {"scale": 1.0 / case.d}, 1.0),
             ("the scores are not scaled (scale 1, softmax_scale ignored)", None,
              {"scale": 1.0}, 1.0)]
    if case.hkv not in (1, case.h):
        alts.append((f"query head h reads K/V head h % Hkv, not h // (H / Hkv) = h // "
                     f"{case.h // case.hkv}", "gqa_mod", {}, 1.0))
    for name, off in (("softcap", None), ("alibi", False), ("sink", False), ("window", None)):
        if getattr(case, name) not in (None, False):
            alts.append((f"the kernel ignores {name}: its output is that of attention "
                         f"without it", ("drop", name, off), {}, 1.0))
    return alts


def _expand_mod(case: Case, data: dict) -> tuple[Case, dict]:
    """K and V repeated to H heads by h % Hkv: a case judged as multi-head attention."""
    heads = np.arange(case.h) % case.hkv
    axis = -2
    data = dict(data)
    for n in ("k", "v"):
        data[n] = np.take(data[n], heads, axis=axis)
    return replace(case, hkv=case.h), data


def probe(target: Target, res: CaseResult) -> str:
    """The first alternative convention under which res's failing tensors pass; '' if none."""
    if res.passed or "kernel" in res.failed:
        return ""
    case = res.case
    data = inputs(case)
    got = call(target, case, data)
    if got.error:
        return ""
    failed = set(res.failed)
    for text, edit, overrides, lse_factor in _alternatives(case, failed):
        c, d = case, data
        if edit == "gqa_mod":
            c, d = _expand_mod(case, data)
        elif isinstance(edit, tuple):
            c = replace(case, **{edit[1]: edit[2]})
            d = {n: x for n, x in data.items() if not (
                (edit[1] == "alibi" and n == "alibi_slopes")
                or (edit[1] == "sink" and n == "learnable_sink"))}
        g = got
        if lse_factor != 1.0 and got.lse is not None:
            g = replace(got, lse=got.lse * lse_factor)
        again = verdict(c, d, g, res.rule, **overrides)
        if not (set(again.failed) & failed):
            return text
    return ""


__all__ = ["probe"]
