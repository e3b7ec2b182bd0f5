"""score_mod and mask_mod: FlexAttention's two functions for attention variants, on numpy tiles.

`score_mod(score, b, h, q_idx, kv_idx) -> score` changes a scaled score; `mask_mod(b, h,
q_idx, kv_idx) -> bool` says which keys a query sees (True = attend). osm calls them on whole
tiles: score a float array, b, h, q_idx, kv_idx integer arrays that broadcast against it, so
a function written with numpy's elementwise operations (np.where, np.tanh, &, |, indexing a
table with h) works as written, and one written for scalars (`if q_idx >= kv_idx:`) is
refused when given, with the error it raised (docs/score-mod.md).

`ScoreMod` and `MaskMod` wrap a function once (validated, named, with the derivative the
backward needs: exact for the built-ins and for a user function with a `grad` companion,
central finite differences otherwise, said in `derivative`); `SCORE_MODS` and `MASK_MODS`
build the built-ins from their parameters; `all_of` ands several masks.
Leaves out: where in the score pipeline they apply (masks.score_tile), block masks
(blockmask.py), loading files and `python:FILE.py:FUNCTION` (io/, cli/).

Example: MaskMod.causal()(np.arange(1)[:, None, None, None], 0, np.arange(3)[:, None],
         np.arange(3)) -> the lower triangle of a 3 × 3 matrix
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from osm_cli.errors import InputError

PROBE = (2, 3, 4, 5)  # the tile a function is tried on when given: (b, h, q, kv)


def probe_indices(shape=PROBE) -> tuple[np.ndarray, ...]:
    """b, h, q_idx, kv_idx for a (B, H, t, s) tile, each broadcastable to it."""
    b, h, t, s = shape
    return (np.arange(b).reshape(b, 1, 1, 1), np.arange(h).reshape(1, h, 1, 1),
            np.arange(t).reshape(1, 1, t, 1), np.arange(s).reshape(1, 1, 1, s))


def _tried(kind: str, name: str, call: Callable, shape) -> np.ndarray:
    """call() on the probe tile, or an InputError that says why it is not vectorised."""
    try:
        with np.errstate(all="ignore"):
            out = call()
    except Exception as exc:  # the user's function: any error means it cannot take arrays
        raise InputError(
            f"{kind} {name} must take numpy arrays: osm calls it on whole tiles with "
            f"broadcast index arrays (a {PROBE} tile here), and it raised "
            f"{type(exc).__name__}: {exc} (write it with np.where, &, | instead of if/and/or)"
        ) from None
    out = np.asarray(out)
    try:
        np.broadcast_to(out, shape)
    except ValueError:
        raise InputError(f"{kind} {name} returned shape {out.shape} for a {shape} tile; it "
                         "must return one value per (b, h, q_idx, kv_idx)") from None
    return out


@dataclass(frozen=True)
class ScoreMod:
    """A score_mod, with its derivative in the score for the backward."""

    fn: Callable
    name: str
    grad: Callable | None = None  # d fn / d score, the same signature; None: differences
    builtin: bool = False
    cap: float | None = None  # the built-in softcap's C: FA4's softcap is this score_mod

    @classmethod
    def of(cls, fn, name: str | None = None) -> ScoreMod:
        """fn as a ScoreMod (a ScoreMod stays itself), tried on a probe tile: an InputError
        when it cannot take arrays or returns another shape."""
        if isinstance(fn, ScoreMod):
            return fn
        if not callable(fn):
            raise InputError(f"score_mod must be a function score_mod(score, b, h, q_idx, "
                             f"kv_idx), not {type(fn).__name__}")
        mod = cls(fn, name or getattr(fn, "__name__", "score_mod"), getattr(fn, "grad", None))
        score = np.linspace(-2.0, 2.0, math.prod(PROBE)).reshape(PROBE)
        out = _tried("score_mod", mod.name, lambda: fn(score, *probe_indices()), PROBE)
        if out.dtype.kind not in "fiu":
            raise InputError(f"score_mod {mod.name} returned {out.dtype} values; it must "
                             "return numbers")
        if mod.grad is not None:
            _tried("score_mod's grad", mod.name, lambda: mod.grad(score, *probe_indices()),
                   PROBE)
        return mod

    @property
    def derivative(self) -> str:
        """How the backward differentiates it: "exact" or "finite differences"."""
        return "exact" if self.builtin or self.grad is not None else "finite differences"

    def __call__(self, s: np.ndarray, idx: tuple) -> np.ndarray:
        """fn on the tile s (any shape the indices broadcast to), in s's dtype."""
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(self.fn(s, *idx))
        return np.broadcast_to(out, s.shape).astype(s.dtype)

    def slope(self, s: np.ndarray, idx: tuple) -> np.ndarray:
        """d fn / d score at s: the grad companion, or central differences with a step
        h = cbrt(eps)·max(1, |s|) (error O(h²) ≈ 1e-11 relative in float64)."""
        if self.grad is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.broadcast_to(np.asarray(self.grad(s, *idx)), s.shape).astype(s.dtype)
        x = np.asarray(s, dtype=np.float64)
        h = np.cbrt(np.finfo(np.float64).eps) * np.maximum(1.0, np.abs(x))
        with np.errstate(over="ignore", invalid="ignore"):
            up = np.asarray(self.fn(x + h, *idx), dtype=np.float64)
            down = np.asarray(self.fn(x - h, *idx), dtype=np.float64)
        return np.broadcast_to((up - down) / (2 * h), s.shape).astype(s.dtype)


@dataclass(frozen=True)
class MaskMod:
    """A mask_mod: True where query q_idx of head h, batch b attends key kv_idx."""

    fn: Callable
    name: str

    @classmethod
    def of(cls, fn, name: str | None = None) -> MaskMod:
        """fn as a MaskMod (a MaskMod stays itself, a list is and-ed), tried on a probe."""
        if isinstance(fn, MaskMod):
            return fn
        if isinstance(fn, (list, tuple)):
            return all_of(*fn)
        if not callable(fn):
            raise InputError(f"mask_mod must be a function mask_mod(b, h, q_idx, kv_idx), not "
                             f"{type(fn).__name__}")
        mod = cls(fn, name or getattr(fn, "__name__", "mask_mod"))
        out = _tried("mask_mod", mod.name, lambda: fn(*probe_indices()), PROBE)
        if out.dtype.kind != "b":
            raise InputError(f"mask_mod {mod.name} returned {out.dtype} values; it must "
                             "return booleans (True = attend)")
        return mod

    def __call__(self, b, h, q_idx, kv_idx) -> np.ndarray:
        return np.asarray(self.fn(b, h, q_idx, kv_idx), dtype=bool)


@dataclass(frozen=True)
class TileMod:
    """A score_mod bound to one tile: idx = (b, h, q_idx, kv_idx) broadcastable to the tile
    as (…, rows, heads, n, keys) when `heads` is given (the g query heads of a kv group
    stacked as g·n rows), else to the tile itself."""

    mod: ScoreMod
    idx: tuple
    heads: int | None = None

    def _view(self, s: np.ndarray) -> np.ndarray:
        if self.heads is None:
            return s
        return s.reshape(*s.shape[:-2], self.heads, s.shape[-2] // self.heads, s.shape[-1])

    def __call__(self, s: np.ndarray) -> np.ndarray:
        return self.mod(self._view(s), self.idx).reshape(s.shape)

    def slope(self, s: np.ndarray) -> np.ndarray:
        return self.mod.slope(self._view(s), self.idx).reshape(s.shape)


def all_of(*mods) -> MaskMod:
    """Several masks and-ed (a key is seen when every one lets it through)."""
    parts = [MaskMod.of(m) for m in mods]
    if len(parts) == 1:
        return parts[0]

    def both(b, h, q_idx, kv_idx):
        out = parts[0](b, h, q_idx, kv_idx)
        for part in parts[1:]:
            out = out & part(b, h, q_idx, kv_idx)
        return out

    return MaskMod(both, " & ".join(p.name for p in parts))


def about_mods(opts) -> str:
    """A run's score_mod and mask_mod in a few words (opts a ScoreOptions), "" without them.
    Example: "score_mod softcap:30 (exact derivative), mask_mod causal & document"."""
    parts = []
    if opts.score_mod is not None:
        parts.append(f"score_mod {opts.score_mod.name} ({opts.score_mod.derivative} "
                     "derivative)")
    if opts.mask_mod is not None:
        parts.append(f"mask_mod {opts.mask_mod.name}")
    return ", ".join(parts)


def modded_scores(s: np.ndarray, score_mod=None, mask_mod=None) -> np.ndarray:
    """A score matrix (rows, n) or vector through a score_mod and mask_mod, as osm trace takes
    them: row r is q_idx r, position j is kv_idx j, batch and head 0; hidden scores −inf.
    Example: modded_scores(np.zeros((2, 2)), mask_mod=causal()) -> [[0, -inf], [0, 0]]"""
    s2 = np.atleast_2d(np.asarray(s))
    idx = (np.zeros((1, 1), int), np.zeros((1, 1), int), np.arange(s2.shape[0])[:, None],
           np.arange(s2.shape[1])[None, :])
    out = s2 if score_mod is None else ScoreMod.of(score_mod)(s2, idx)
    if mask_mod is not None:
        seen = np.broadcast_to(MaskMod.of(mask_mod)(*idx), s2.shape)
        out = np.where(seen, out, out.dtype.type(-np.inf))
    return out.reshape(np.shape(s))


# --- the built-ins (docs/score-mod.md): FlexAttention's and attention-gym's conventions -------

def softcap(cap: float) -> ScoreMod:
    """cap·tanh(score / cap) (Gemma 2, Grok; FA2's softcap on the scaled score)."""
    cap = _positive(cap, "softcap")
    return ScoreMod(lambda s, b, h, q, kv: cap * np.tanh(s / cap), f"softcap:{cap:g}",
                    lambda s, b, h, q, kv: 1.0 - np.tanh(s / cap) ** 2, builtin=True,
                    cap=cap)


def tanh_gate() -> ScoreMod:
    """tanh(score): every score gated into (−1, 1) (softcap:1)."""
    return ScoreMod(lambda s, b, h, q, kv: np.tanh(s), "tanh-gate",
                    lambda s, b, h, q, kv: 1.0 - np.tanh(s) ** 2, builtin=True)


def alibi(slopes) -> ScoreMod:
    """score + slope[h]·(kv_idx − q_idx) (attention-gym's ALiBi: under a causal mask with t = s
    it is FA2's −slope·|q − kv|). slopes: (H,), one per query head."""
    slopes = np.asarray(slopes, dtype=np.float64)
    if slopes.ndim != 1 or not np.isfinite(slopes).all():
        raise InputError(f"ALiBi slopes must be finite, one per head (H,); got shape "
                         f"{slopes.shape}")
    return ScoreMod(lambda s, b, h, q, kv: s + slopes[h] * (kv - q), "alibi",
                    lambda s, b, h, q, kv: np.ones_like(s), builtin=True)


def relative_bias(table) -> ScoreMod:
    """score + table[h, q_idx − kv_idx + N − 1], table (H, 2N − 1): a learned bias by distance
    (T5-style, one per head)."""
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] % 2 != 1 or not np.isfinite(table).all():
        raise InputError(f"a relative-bias table is (H, 2N − 1) finite numbers; got shape "
                         f"{table.shape}")
    mid = table.shape[1] // 2

    def fn(s, b, h, q, kv):
        at = q - kv + mid
        if np.any(at < 0) or np.any(at >= table.shape[1]):
            raise InputError(f"relative-bias table of width {table.shape[1]} reaches distances "
                             f"up to ±{mid}; the inputs need more")
        return s + table[h, at]

    return ScoreMod(fn, "relative-bias", lambda s, b, h, q, kv: np.ones_like(s), builtin=True)


def causal() -> MaskMod:
    """q_idx ≥ kv_idx: FlexAttention's causal mask, aligned top-left (osm's causal_align)."""
    return MaskMod(lambda b, h, q, kv: q >= kv, "causal")


def sliding(window: int) -> MaskMod:
    """causal and q_idx − kv_idx ≤ W (attention-gym's sliding window: the W keys before and
    the query's own)."""
    w = _count(window, "sliding window")
    return MaskMod(lambda b, h, q, kv: (q >= kv) & (q - kv <= w), f"sliding:{w}")


def document(doc_ids) -> MaskMod:
    """doc[q_idx] == doc[kv_idx]: packed sequences see only their own document. doc_ids: (N,)
    or (B, N) integers, one per position (queries and keys share the packed positions)."""
    ids = np.asarray(doc_ids)
    if ids.dtype.kind not in "iu" or ids.ndim not in (1, 2):
        raise InputError(f"document ids are integers of shape (N,) or (B, N); got {ids.dtype} "
                         f"of shape {ids.shape}")

    def fn(b, h, q, kv):
        if ids.ndim == 1:
            return ids[q] == ids[kv]
        return ids[b, q] == ids[b, kv]

    return MaskMod(fn, "document")


def prefix_lm(prefix: int) -> MaskMod:
    """kv_idx < P or causal: the first P keys seen by every query (attention-gym's prefix LM)."""
    p = _count(prefix, "prefix length")
    return MaskMod(lambda b, h, q, kv: (kv < p) | (q >= kv), f"prefix-lm:{p}")


def chunked(size: int) -> MaskMod:
    """q_idx // C == kv_idx // C: attention within chunks of C positions (and with causal,
    Llama 4's chunked causal attention)."""
    c = _count(size, "chunk size", least=1)
    return MaskMod(lambda b, h, q, kv: q // c == kv // c, f"chunked:{c}")


def _positive(x, what: str) -> float:
    x = float(x)
    if not (math.isfinite(x) and x > 0):
        raise InputError(f"{what} must be a positive finite number, not {x}")
    return x


def _count(x, what: str, least: int = 0) -> int:
    if isinstance(x, float) and not x.is_integer():
        raise InputError(f"{what} must be a whole number, not {x}")
    x = int(x)
    if x < least:
        raise InputError(f"{what} must be at least {least}, not {x}")
    return x


def from_spec(spec: str, kind: str, load: Callable, function: Callable, heads: int):
    """A ScoreMod (kind "score") or MaskMod ("mask") from a command-line spec: a built-in's
    name and parameter ("softcap:30", "alibi", "alibi:SLOPES.npy", "sliding:128",
    "document:IDS.npy") or "python:FILE.py:FUNCTION". load(path) reads an array,
    function(path, name) a user's function (cli/ does the reading); heads fills ALiBi's
    standard slopes. Example: from_spec("softcap:30", "score", …).name -> "softcap:30"
    """
    table = SCORE_MODS if kind == "score" else MASK_MODS
    flag = f"`{kind}_mod`"  # the CLI prints it as its flag (--score-mod, --mask-mod)
    name, _, param = spec.partition(":")
    if name == "python":
        path, _, fn_name = param.rpartition(":")
        if not path or not fn_name:
            raise InputError(f"{flag} python:FILE.py:FUNCTION names a file and a function in "
                             f"it; got {spec!r}")
        fn = function(path, fn_name)
        return (ScoreMod if kind == "score" else MaskMod).of(fn, f"python:{param}")
    if name not in table:
        raise InputError(f"{flag} {spec!r}: the built-ins are {', '.join(table)}, or "
                         "python:FILE.py:FUNCTION")
    build, takes = table[name]
    if takes is None or (takes == "optional array" and not param):
        if param:
            raise InputError(f"{flag} {name} takes no parameter; got {spec!r}")
        return build(alibi_standard(heads)) if takes else build()
    if not param:
        raise InputError(f"{flag} {name} needs a parameter: {name}:"
                         f"{'N' if takes == 'number' else 'FILE.npy'}")
    if takes == "number":
        try:
            value = float(param)
        except ValueError:
            raise InputError(f"{flag} {spec!r}: {param!r} is not a number") from None
        return build(value)
    return build(load(param))


def alibi_standard(heads: int) -> np.ndarray:
    """ALiBi's standard slopes for `heads` heads (options.alibi_auto's, Press et al.)."""
    from .options import alibi_auto

    return alibi_auto(heads)


# name -> (builder, what its parameter is: None, "number", "array", "optional array")
SCORE_MODS = {"softcap": (softcap, "number"), "alibi": (alibi, "optional array"),
              "relative-bias": (relative_bias, "array"), "tanh-gate": (tanh_gate, None)}
MASK_MODS = {"causal": (causal, None), "sliding": (sliding, "number"),
             "document": (document, "array"), "prefix-lm": (prefix_lm, "number"),
             "chunked": (chunked, "number")}

__all__ = ["MASK_MODS", "SCORE_MODS", "MaskMod", "ScoreMod", "TileMod", "about_mods", "all_of",
           "from_spec", "modded_scores", "probe_indices"]
