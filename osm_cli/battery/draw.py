"""Drawing the battery's case list from what a kernel declares: `draw(declared, budget, …)`.

Three classes, the report's columns: fa-shapes (FlashAttention's own (seqlen_q, seqlen_k)
pairs, for each declared feature and for none), edge (EDGES, each where a declared feature
makes it possible, and FlexAttention's built-in score_mods and mask_mods at lengths that are
not multiples of 128) and random (shapes and feature sets drawn from the declared space, so a
kernel tuned to a list still meets shapes it never saw). Seeded: one seed gives one list.
A kernel's declared limits (Limits: N_q = N_k, a least N, N a multiple of M) fit every case to
them, or leave it out where its point is a shape they forbid.
Leaves out: the inputs (cases.inputs), running (runner.py).

Example: len(draw(Declared(frozenset({"causal"})), "quick", seed=0)) -> 22
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
SEQLENS = ("any", "equal")
# edges whose point is a length the limits may forbid: they are left out rather than fitted
SMALL_EDGES = {"n1": "nk", "q1": "nq"}


@dataclass(frozen=True)
class Limits:
    """The shapes a kernel takes (--seqlens, --min-seqlen, --seqlen-multiple, or its
    osm_constraints): N_q = N_k ("equal"), N ≥ min_seqlen, N a multiple of seqlen_multiple.
    Each applies to N_q and N_k of a dense batch and to every sequence of a varlen or paged
    one."""

    seqlens: str = "any"
    min_seqlen: int = 1
    seqlen_multiple: int = 1

    def __post_init__(self):
        if self.seqlens not in SEQLENS:
            raise InputError(f"seqlens must be one of {', '.join(SEQLENS)}, not "
                             f"{self.seqlens!r}")
        for name in ("min_seqlen", "seqlen_multiple"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise InputError(f"{name} must be a whole number of 1 or more, not {x!r}")

    @property
    def active(self) -> bool:
        return self != Limits()

    def _n(self, n: int) -> int:
        n = max(n, self.min_seqlen)
        return -(-n // self.seqlen_multiple) * self.seqlen_multiple

    def fit(self, case: Case) -> Case | None:
        """case with its lengths raised to the limits, or None where its point is a shape
        they forbid (N_k = 1, one query, rows that see no key, lengths ≡ 64 mod 128)."""
        if not self.active:
            return case
        nq, nk = case.nq, case.nk
        if self.seqlens == "equal":
            nq = nk = max(nq, nk)
        nq, nk = self._n(nq), self._n(nk)
        if case.edge in SMALL_EDGES and {"nq": nq, "nk": nk}[SMALL_EDGES[case.edge]] != 1:
            return None
        if case.edge == "mod64" and (nq % 128 != 64 or nk % 128 != 64):
            return None
        if case.edge == "nokey" and nq <= nk and not (case.varlen or case.page):
            return None
        lens = case.lens
        if lens is not None:
            pairs = [(max(a, c),) * 2 if self.seqlens == "equal" else (a, c) for a, c in lens]
            lens = tuple((self._n(a) if case.varlen else nq, self._n(c)) for a, c in pairs)
            nq, nk = max(a for a, _ in lens), max(c for _, c in lens)
        window = case.window
        if window is not None:
            window = (min(window[0], nk), min(window[1], nk))
        return replace(case, nq=nq, nk=nk, lens=lens, window=window)


def limits_of(fn=None, seqlens: str | None = None, min_seqlen: int | None = None,
              seqlen_multiple: int | None = None) -> Limits:
    """The Limits given (None: the function's osm_constraints, a dict or "seqlens=equal,
    min_seqlen=64" text, else none)."""
    raw = getattr(fn, "osm_constraints", None) or {}
    if isinstance(raw, str):
        try:
            raw = dict(item.split("=", 1) for item in raw.replace(" ", "").split(",") if item)
        except ValueError:
            raise InputError(f"osm_constraints {raw!r} must be name=value pairs separated by "
                             "commas (seqlens=equal,min_seqlen=64)") from None
    if not isinstance(raw, dict):
        raise InputError("osm_constraints must be a dict or 'name=value,…' text")
    bad = sorted(set(raw) - {"seqlens", "min_seqlen", "seqlen_multiple"})
    if bad:
        raise InputError(f"unknown constraint {bad[0]!r}; known: seqlens, min_seqlen, "
                         "seqlen_multiple")
    given = {"seqlens": seqlens, "min_seqlen": min_seqlen, "seqlen_multiple": seqlen_multiple}
    kw = {n: (given[n] if given[n] is not None else raw.get(n)) for n in given}
    kw = {n: x for n, x in kw.items() if x is not None}
    for n in ("min_seqlen", "seqlen_multiple"):
        if isinstance(kw.get(n), str):
            try:
                kw[n] = int(kw[n])
            except ValueError:
                raise InputError(f"{n} must be a whole number, not {kw[n]!r}") from None
    return Limits(**kw)


@dataclass(frozen=True)
class Declared:
    """What a kernel supports: features (FEATURES), head dims, dtypes, and its shape limits."""

    features: frozenset = frozenset()
    head_dims: tuple[int, ...] = (32, 64, 96, 128)
    dtypes: tuple[str, ...] = ("bf16",)
    limits: Limits = field(default_factory=Limits)

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
        """The shaping features declared (block_mask stands for mask_mod)."""
        have = set(self.features) | ({"mask_mod"} if "block_mask" in self.features else set())
        return tuple(f for f in SHAPING if f in have)

    def allows(self, case: Case) -> bool:
        return set(case.features) <= set(self.shaping) and case.dtype in self.dtypes


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
         seed: int = 0, fit: bool = True) -> list[Case]:
    """The case list for a kernel that declares `declared` (fa-shapes, edge, random), fitted
    to its limits (fit=False: as drawn, before the limits)."""
    if budget not in BUDGETS:
        raise InputError(f"budget must be one of {', '.join(BUDGETS)}, not {budget!r}")
    if n_random is not None and n_random < 0:
        raise InputError(f"the number of random cases must be 0 or more, not {n_random}")
    mk = _Maker(declared, seed)
    shaping = declared.shaping
    cases = _fa_shapes(mk, shaping, budget) + _edges(mk, shaping, budget) \
        + _mods(mk, shaping, budget)
    n = BUDGETS[budget] if n_random is None else n_random
    cases += [_random(mk, shaping, budget) for _ in range(n)]
    if not fit:
        return cases
    return [c for c in (declared.limits.fit(c) for c in cases) if c is not None]


# FlexAttention's built-ins at lengths that are not multiples of 128 (the block mask's last
# tiles partial: where flex users report NaN and wrong gradients), and in the full budget at
# multiples too: (score_mod, mask_mod, N_q, N_k); documents of uneven lengths, one of 1
MOD_CASES = (
    ("softcap.20", "", 200, 333),
    ("alibi", "causal", 257, 257),
    ("relbias", "", 190, 300),
    ("", "causal", 300, 300),
    ("", "causal", 100, 300),
    ("", "sliding.64", 333, 333),
    ("", "doc.1.120.7.172+causal", 300, 300),
    ("", "prefix.37", 300, 300),
    ("", "chunked.48+causal", 250, 250),
    ("softcap.20", "doc.50.1.199", 250, 250),
)
MOD_CASES_FULL = (
    ("softcap.30", "causal", 256, 256),
    ("", "doc.1.255.130.638", 1024, 1024),
    ("alibi", "sliding.100", 1000, 1000),
    ("relbias", "prefix.129", 513, 513),
    ("", "chunked.128", 1023, 1023),
)


def _mods(mk: _Maker, shaping: tuple, budget: str) -> list[Case]:
    has = set(shaping)
    out = []
    for score, mask, t, s in MOD_CASES + (MOD_CASES_FULL if budget == "full" else ()):
        if (score and "score_mod" not in has) or (mask and "mask_mod" not in has):
            continue
        on = ("gqa",) if "gqa" in has and len(out) % 3 == 1 else ()
        out.append(replace(mk.make("edge", t, s, on), score_mod=score, mask_mod=mask))
    return out


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
    modded = {"score_mod", "mask_mod"}
    on = tuple(f for f in shaping if f not in modded and rng.random() < 0.4)
    if "varlen" in on and "paged" in on:
        on = tuple(f for f in on if f != ("paged" if rng.random() < 0.5 else "varlen"))
    top = 300 if budget == "quick" else 1100
    t, s = int(rng.integers(1, top + 1)), int(rng.integers(1, top + 1))
    case = mk.make("random", t, s, on, b=int(rng.integers(1, 4)))
    if "gqa" in on:
        hkv = int(rng.choice((1, 2, 4)))
        case = replace(case, h=hkv * int(rng.choice((2, 4, 8))), hkv=hkv)
    # a score_mod or mask_mod now and then, on a dense batch (FlexAttention takes no varlen)
    if set(shaping) & modded and not (case.varlen or case.page) and rng.random() < 0.4:
        score = mask = ""
        if "score_mod" in shaping and rng.random() < 0.6:
            score = str(rng.choice(("softcap.20", "alibi", "relbias")))
        if "mask_mod" in shaping and (not score or rng.random() < 0.5):
            w = int(rng.integers(1, max(s, 2)))
            mask = str(rng.choice(("causal", f"sliding.{w}", f"prefix.{w}", f"chunked.{w}")))
        case = replace(case, score_mod=score, mask_mod=mask)
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


__all__ = ["BUDGETS", "SEQLENS", "Declared", "Limits", "draw", "head_dims_of", "limits_of"]


