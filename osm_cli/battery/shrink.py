"""Shrinking a failing case to the smallest (B, H, N_q, N_k, d, features) that still fails the
same way, as hypothesis shrinks: drop each feature, halve each size, then step each down, taking
the first smaller case that still fails one of the same tensors, until none does or the step
budget is spent. A case that failed the forward (out or LSE) must keep failing it: a smaller
case that fails a gradient alone is another bug (the Triton tutorial's forward, wrong at B > 1,
shrank into its causal-only backward at B = 1 and was no longer reported).

Leaves out: judging (judge.py). Example: shrink(target, result).case.id
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from .cases import Case
from .judge import CaseResult, judge
from .kernel import Target


def _fix(case: Case) -> Case | None:
    """case with per-sequence lengths that fit its sizes; None when it cannot be."""
    if case.h % case.hkv or min(case.b, case.h, case.hkv, case.d) < 1:
        return None
    if case.lens is not None:
        lens = tuple((min(a, case.nq), min(c, case.nk)) for a, c in case.lens[:case.b])
        if len(lens) < case.b:
            return None
        case = replace(case, lens=lens)
        if case.varlen and not any(a for a, _ in lens):
            return None
    if case.window is not None:
        case = replace(case, window=(min(case.window[0], case.nk), min(case.window[1], case.nk)))
    return case


def _drops(case: Case) -> Iterator[Case]:
    if case.edge:
        yield replace(case, edge="")
    if case.score_mod:
        yield replace(case, score_mod="")
    if case.mask_mod:
        parts = case.mask_mod.split("+")
        yield replace(case, mask_mod="")
        if len(parts) > 1:
            for i in range(len(parts)):
                yield replace(case, mask_mod="+".join(parts[:i] + parts[i + 1:]))
    if case.varlen or case.page:
        yield replace(case, varlen=False, page=0, lens=None)
    if case.hkv != case.h:
        yield replace(case, h=case.hkv)
        yield replace(case, hkv=case.h)
    for name, off in (("sink", False), ("alibi", False), ("softcap", None), ("window", None),
                      ("causal", False)):
        if getattr(case, name) not in (False, None):
            yield replace(case, **{name: off})


def _sizes(case: Case, head_dims: tuple[int, ...], halve: bool) -> Iterator[Case]:
    def down(n: int, lo: int) -> list[int]:
        if halve:
            return [n // 2] if n // 2 >= lo else []
        steps = {n - max(1, n // 4), n - max(1, n // 8), n - 2, n - 1}
        return sorted(x for x in steps if lo <= x < n)

    for b in down(case.b, 1):
        yield replace(case, b=b, lens=None if case.lens is None else case.lens[:b])
        if case.lens is not None and not halve:  # or drop the first sequence instead
            yield replace(case, b=b, lens=case.lens[1:b + 1])
    if case.hkv == case.h:
        for h in down(case.h, 1):
            yield replace(case, h=h, hkv=h)
    else:
        for h in down(case.h, 2 * case.hkv):
            if h % case.hkv == 0:
                yield replace(case, h=h)
        for hkv in down(case.hkv, 1):
            yield replace(case, hkv=hkv, h=case.h // case.hkv * hkv)
    for nq in down(case.nq, 1):
        yield replace(case, nq=nq, lens=_scaled(case.lens, 0, nq, case.nq))
    for nk in down(case.nk, 1):
        yield replace(case, nk=nk, lens=_scaled(case.lens, 1, nk, case.nk))
    for nq, nk in zip(down(case.nq, 1), down(case.nk, 1), strict=False):  # both: N_q = N_k
        yield replace(case, nq=nq, nk=nk, lens=_scaled(_scaled(case.lens, 0, nq, case.nq), 1,
                                                       nk, case.nk))
    smaller = [d for d in head_dims if d < case.d]
    if smaller:
        yield replace(case, d=smaller[0] if halve else smaller[-1])


def _scaled(lens, axis: int, new: int, old: int):
    if lens is None:
        return None
    return tuple(tuple(max(0, x * new // max(old, 1)) if i == axis else x
                       for i, x in enumerate(pair)) for pair in lens)


def candidates(case: Case, head_dims: tuple[int, ...], limits=None) -> Iterator[Case]:
    """Smaller cases than `case`, the likeliest-to-help first, within the kernel's limits
    (draw.Limits) when given."""
    seen = {case.id}
    for group in (_drops(case), _sizes(case, head_dims, True), _sizes(case, head_dims, False)):
        for c in group:
            c = _fix(c)
            if c is not None and limits is not None:
                c = limits.fit(c)
            if c is not None and c.id not in seen and c.size <= case.size:
                seen.add(c.id)
                yield c


def shrink(target: Target, failed: CaseResult, rule: str = "fa", steps: int = 48) -> CaseResult:
    """The smallest case found that still fails one of `failed`'s tensors (one of its forward
    ones, out or lse, where it failed there), judged."""
    best = failed
    want = set(failed.failed) & FORWARD or set(failed.failed)
    tried = 0
    improved = True
    while improved and tried < steps:
        improved = False
        for cand in candidates(best.case, target.declared.head_dims, target.declared.limits):
            tried += 1
            res = judge(target, cand, rule)
            same = set(res.failed) & want
            if "kernel" in want and res.failed == ("kernel",):  # the same exception or guard
                same = res.message.split(":")[0] == failed.message.split(":")[0]
            if same:
                best, improved = res, True
                break
            if tried >= steps:
                break
    return best


FORWARD = frozenset({"out", "lse"})

__all__ = ["candidates", "shrink"]
