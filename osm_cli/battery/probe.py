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


def _alternatives(case: Case, failed: set, base: str = "e") -> list:
    """(description, data edit, check overrides, factor on the LSE osm read)."""
    alts = []
    if "lse" in failed and base == "2":
        alts.append(("the LSE is in base e (natural log, FlashAttention's and PyTorch's "
                     "convention), not base 2: drop --lse-base 2", None, {}, 1 / math.log(2)))
    elif "lse" in failed:
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
    for name, off in (("softcap", None), ("alibi", False), ("sink", False), ("window", None),
                      ("score_mod", ""), ("mask_mod", "")):
        if getattr(case, name) not in (None, False, ""):
            alts.append((f"the kernel ignores {name}: its output is that of attention "
                         f"without it", ("drop", name, off), {}, 1.0))
    alts += _mod_alternatives(case)
    return alts


def _mod_alternatives(case: Case) -> list:
    """A score_mod applied before the scale; a block mask that declares the last, partial
    K/V tile full (FlexAttention's 128, or 64)."""
    from .cases import scale_of
    from .modcases import numpy_mods, tail_unmasked, unscaled

    if not (case.score_mod or case.mask_mod):
        return []
    score, mask = numpy_mods(case)
    alts = []
    if score is not None:
        alts.append(("the score_mod is applied to q·k before softmax_scale (FlexAttention "
                     "applies it to the scaled score)", None,
                     {"score_mod": unscaled(score, scale_of(case))}, 1.0))
    if mask is not None:
        for block in (128, 64):
            if case.nk % block and case.nk > block:
                alts.append((f"the mask_mod is not applied on the last K/V tile of {block} "
                             f"keys (keys {(case.nk - 1) // block * block} to {case.nk - 1}): "
                             "a block mask that declares that partial tile full", None,
                             {"mask_mod": tail_unmasked(mask, case.nk, block)}, 1.0))
    return alts


def _expand_mod(case: Case, data: dict) -> tuple[Case, dict]:
    """K and V repeated to H heads by h % Hkv: a case judged as multi-head attention."""
    heads = np.arange(case.h) % case.hkv
    axis = -2
    data = dict(data)
    for n in ("k", "v"):
        data[n] = np.take(data[n], heads, axis=axis)
    return replace(case, hkv=case.h), data


def probe(target: Target, res: CaseResult) -> CaseResult:
    """res with its convention (the first alternative under which its failing tensors pass)
    and its location (locate) filled in."""
    if res.passed or "kernel" in res.failed:
        return res
    case = res.case
    data = inputs(case)
    got = call(target, case, data)
    if got.error:
        return res
    where = locate(case, data, got, res.failed[0], res.bound) if res.bound is not None else ""
    return replace(res, convention=_convention(target, res, data, got),
                   where=where or res.where)


def _convention(target: Target, res: CaseResult, data: dict, got) -> str:
    case = res.case
    failed = set(res.failed)
    for text, edit, overrides, lse_factor in _alternatives(case, failed, target.lse_base):
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


def _ranges(xs, most: int = 4) -> str:
    """[0, 1, 2, 5] -> '0–2, 5' (at most `most` ranges, then '…')."""
    xs = sorted(set(int(x) for x in xs))
    runs: list = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    text = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:most])
    return text + (", …" if len(runs) > most else "")


def locate(case: Case, data: dict, got, tensor: str, bound: float) -> str:
    """Which sequences, heads and queries of `tensor` (out or lse) are over `bound`, against
    osm's float64 reference: 'queries 64–97 of 98; heads 0–3 of 4; batch 0 of 1', and whether
    they are exactly the rows that see no key."""
    from osm_cli.flash.reference import reference
    from osm_cli.precision.rule import lse_errors

    from .judge import check_options

    if tensor not in ("out", "lse") or got.out is None:
        return ""
    q, k, v = (np.asarray(data[n], dtype=np.float64) for n in ("q", "k", "v"))
    ref, ref_lse = reference(q, k, v, **check_options(case, data))
    if tensor == "out":
        with np.errstate(invalid="ignore"):
            err = np.abs(np.asarray(got.out, np.float64) - ref).max(axis=-1, initial=0.0)
        empty = np.isneginf(ref_lse)  # FlashAttention's (B, H, N), or (H, total) for varlen
        err = err.T if case.varlen else err.swapaxes(1, 2)
    else:
        if got.lse is None:
            return ""
        err = lse_errors(got.lse, ref_lse)
        empty = np.isneginf(ref_lse)
    over = ~(err <= bound)
    if not over.any():
        return ""
    if case.varlen:  # (H, total): rows to (sequence, query)
        cu = data["cu_seqlens_q"]
        h_idx, row = np.nonzero(over)
        seq = np.searchsorted(cu, row, side="right") - 1
        where = [f"sequences {_ranges(seq)} of {case.b}", f"heads {_ranges(h_idx)} of {case.h}",
                 f"queries {_ranges(row - cu[seq])}"]
    else:
        b_idx, h_idx, row = np.nonzero(over)
        where = [f"queries {_ranges(row)} of {err.shape[-1]}",
                 f"heads {_ranges(h_idx)} of {case.h}", f"batches {_ranges(b_idx)} of {case.b}"]
    text = f"{tensor} over the bound at " + "; ".join(where)
    if empty[over].all():
        text += " (exactly rows that see no key)"
    elif empty.any() and not over[empty].any():
        text += " (the rows that see no key pass)"
    return text
