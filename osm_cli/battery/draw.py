"""Drawing the battery's case list from what a kernel declares: `draw(declared, budget, …)`.

Three classes, the report's columns: fa-shapes (FlashAttention's own (seqlen_q, seqlen_k)
pairs, for each declared feature and for none), edge (EDGES, each where a declared feature
makes it possible) and random (shapes and feature sets drawn from the declared space, so a
kernel tuned to a list still meets shapes it never saw). Seeded: one seed gives one list.
Leaves out: the inputs (cases.inputs), running (runner.py).

Example: len(draw(Declared(frozenset({"causal"})), "quick", seed=0)) -> 22
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from osm_cli.errors import InputError

from .cases import (
    DTYPES,
    FA_DECODE_PAIRS,
    FA_HEAD_DIMS,
    FA_PAIRS,
    FEATURES,
    SHAPING,
    Case,
    _with_lens,
)

BUDGETS = {"quick": 12, "full": 60}  # random cases per budget (--cases overrides)
PAGE_SIZES = (16, 32)
SOFTCAPS = (5.0, 15.0)


@dataclass(frozen=True)
class Declared:
    """What a kernel supports: features (FEATURES), head dims, dtypes."""

    features: frozenset = frozenset()
    head_dims: tuple[int, ...] = (32, 64, 96, 128)
    dtypes: tuple[str, ...] = ("bf16",)

    def __post_init__(self):
        bad = sorted(set(self.features) - set(FEATURES))
        if bad:
            raise InputError(f"unknown feature {bad[0]!r}; known: {', '.join(FEATURES)}")
        if not self.head_dims or min(self.head_dims) < 1:
            raise InputError("head dims must be positive integers")
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad or not self.dtypes:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not "
                             f"{bad[0] if bad else 'nothing'!r}")

    @property
    def shaping(self) -> tuple[str, ...]:
        return tuple(f for f in SHAPING if f in self.features)

    def allows(self, case: Case) -> bool:
        return set(case.features) <= set(self.features) and case.dtype in self.dtypes


class _Maker:
    """Cases with the declared dims and dtypes taken in turn, and each its own seed."""

    def __init__(self, declared: Declared, seed: int):
        self.decl, self.rng, self.n = declared, np.random.default_rng(seed), 0

    def make(self, klass: str, nq: int, nk: int, on: tuple[str, ...], edge: str = "",
             b: int | None = None) -> Case:
        rng, decl = self.rng, self.decl
        self.n += 1
        d = decl.head_dims[self.n % len(decl.head_dims)]
        dtype = decl.dtypes[self.n % len(decl.dtypes)]
        if "gqa" in on:
            h, hkv = ((4, 1), (4, 2), (6, 2), (8, 2))[self.n % 4]
        else:
            h = hkv = (2, 3, 4)[self.n % 3]
        window = None
        if "window" in on:
            left = int(rng.integers(0, max(nk // 2, 1) + 1))
            window = (left, 0 if "causal" in on else int(rng.integers(0, max(nk // 4, 1) + 1)))
        case = Case(
            b=b or (3 if ("varlen" in on or "paged" in on) else 2), h=h, hkv=hkv, nq=nq, nk=nk,
            d=d, dtype=dtype, causal="causal" in on, window=window,
            softcap=(SOFTCAPS[0] if "causal" in on else SOFTCAPS[self.n % 2])
            if "softcap" in on else None, alibi="alibi" in on,
            sink="sink" in on, varlen="varlen" in on,
            page=PAGE_SIZES[self.n % 2] if "paged" in on and "varlen" not in on else 0,
            edge=edge, seed=int(rng.integers(2**31)), klass=klass)
        return _with_lens(case, np.random.default_rng(case.seed))


def draw(declared: Declared, budget: str = "quick", n_random: int | None = None,
         seed: int = 0) -> list[Case]:
    """The case list for a kernel that declares `declared` (fa-shapes, edge, random)."""
    if budget not in BUDGETS:
        raise InputError(f"budget must be one of {', '.join(BUDGETS)}, not {budget!r}")
    if n_random is not None and n_random < 0:
        raise InputError(f"the number of random cases must be 0 or more, not {n_random}")
    mk = _Maker(declared, seed)
    shaping = declared.shaping
    cases = _fa_shapes(mk, shaping, budget) + _edges(mk, shaping, budget)
    n = BUDGETS[budget] if n_random is None else n_random
    cases += [_random(mk, shaping, budget) for _ in range(n)]
    return cases


def _fa_shapes(mk: _Maker, shaping: tuple, budget: str) -> list[Case]:
    out = []
    rows = [(), *((f,) for f in shaping)]
    for i, on in enumerate(rows):
        if "varlen" in on and "paged" in on:
            continue
        if budget == "quick":
            pairs = [FA_PAIRS[i % 6], FA_PAIRS[(i + 3) % 6], FA_DECODE_PAIRS[i % 2]]
            if set(on) & {"causal", "window"} and all(t <= s for t, s in pairs):
                pairs[1] = (512, 256)  # causal with t > s as well as t < s
        else:
            pairs = [*FA_PAIRS, *FA_DECODE_PAIRS]
        # GQA rides along with the other features when declared: most real models use it
        extra = ("gqa",) if "gqa" in shaping and on and on[0] != "gqa" and i % 2 else ()
        # the score modifiers meet the mask too: where softcap-after-mask bugs live
        masked = ("causal",) if "causal" in shaping and set(on) & {"softcap", "alibi", "sink"} \
            else ()
        out += [mk.make("fa-shapes", t, s, on + extra + (masked if j == 1 else ()))
                for j, (t, s) in enumerate(pairs)]
    return out


def _edges(mk: _Maker, shaping: tuple, budget: str) -> list[Case]:
    has = set(shaping)
    masked = next((f for f in ("causal", "window", "varlen", "paged") if f in has), None)
    mask_on = ("causal",) if "causal" in has else ()
    plan = {
        "nokey": (128, 64, (masked,) if masked else None),
        "big": (96, 160, mask_on),
        "mod64": (192, 320, mask_on),
        "rise": (64, 512, ()),
        "ties": (100, 200, mask_on),
        "n1": (64, 1, ()),
        "q1": (1, 300, mask_on),
    }
    out = []
    for edge, (t, s, on) in plan.items():
        if on is None:
            continue
        if edge == "nokey" and "sink" in has:  # seqused_k = 0 with a sink: a known failure
            out.append(mk.make("edge", t, s, (*on, "sink"), edge))
        out.append(mk.make("edge", t, s, on, edge))
        if budget == "full":
            rng = mk.rng
            more = tuple(f for f in shaping if rng.random() < 0.5 and f not in on)
            if "varlen" in more and "paged" in more:
                more = tuple(f for f in more if f != "paged")
            out.append(mk.make("edge", t, s, (*on, *more), edge))
    return out


def _random(mk: _Maker, shaping: tuple, budget: str) -> Case:
    rng = mk.rng
    on = tuple(f for f in shaping if rng.random() < 0.4)
    if "varlen" in on and "paged" in on:
        on = tuple(f for f in on if f != ("paged" if rng.random() < 0.5 else "varlen"))
    top = 300 if budget == "quick" else 1100
    t, s = int(rng.integers(1, top + 1)), int(rng.integers(1, top + 1))
    case = mk.make("random", t, s, on, b=int(rng.integers(1, 4)))
    if "gqa" in on:
        hkv = int(rng.choice((1, 2, 4)))
        case = replace(case, h=hkv * int(rng.choice((2, 4, 8))), hkv=hkv)
    return _with_lens(replace(case, lens=None), np.random.default_rng(case.seed))


def head_dims_of(text: str | None) -> tuple[int, ...]:
    """--head-dims "64,128" (or "fa": FlashAttention's test list) as a tuple."""
    if not text:
        return Declared().head_dims
    if text.strip() == "fa":
        return FA_HEAD_DIMS
    try:
        dims = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise InputError(f"head dims must be integers separated by commas, not {text!r}") \
            from exc
    if not dims or min(dims) < 1:
        raise InputError(f"head dims must be positive integers, not {text!r}")
    return dims


__all__ = ["BUDGETS", "Declared", "draw", "head_dims_of"]


