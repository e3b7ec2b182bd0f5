"""The running state (m, l, O) and the two ways to fold a block of scores into it.

This is the algorithm, once: `osm trace` folds score blocks into (m, l), `osm attention` folds
score tiles and their V rows into (m, l, O), both with these functions. Names are the papers':
m (running max), l (running sum of exp(s − m)), O (unnormalised output), alpha (the factor
exp(m_old − m_new) applied to the old state). See docs/numerics.md#state.

- `rescale_step` is form A: move m first, rescale, then add exp(s − m_new).
- `merge_step` is form B (FA1 Algorithm 1): the block gets its own (m, l, O), which `combine`
  merges into the running state. `combine` is associative and commutative up to rounding
  (docs/numerics.md#update-forms, #order).

Every function works on a batch of rows at once: m and l have shape (rows,), O (rows, dv).
Leaves out: the fold over blocks (fold.py), references (reference.py), files, printing, and
rounding models (precision/).

Example: fold [2, 4] then [1, 3] -> m = 4, l = e^-2 + 1 + e^-3 + e^-1 = 1.5530018.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .names import FORMS  # noqa: F401  (its home is names.py; re-exported for fold.py and others)


@dataclass(frozen=True)
class State:
    """The running state of each row: m, l and (for attention) O."""

    m: np.ndarray
    l: np.ndarray
    o: np.ndarray | None = None


@dataclass(frozen=True)
class Update:
    """One block folded into the state, with what it took (all arrays over rows).

    alpha is the factor the old state was multiplied by, exp(m_old - m_new). The merge form also
    has the block's own statistics m^(k), l^(k) and the weight exp(m^(k) - m_new) it entered with.
    """

    state: State
    block_max: np.ndarray
    alpha: np.ndarray
    block_m: np.ndarray | None = None
    block_l: np.ndarray | None = None
    block_weight: np.ndarray | None = None


def initial_state(rows: int | tuple, dv: int | None = None, dtype=np.float64) -> State:
    """The textbook start: m = -inf, l = 0, O = 0 (not Triton's l = 1). rows: a count or a shape."""
    shape = (rows,) if isinstance(rows, int) else tuple(rows)
    m = np.full(shape, -np.inf, dtype=dtype)
    o = None if dv is None else np.zeros((*shape, dv), dtype=dtype)
    return State(m, np.zeros(shape, dtype=dtype), o)


def _ref(m: np.ndarray) -> np.ndarray:
    """m as a reference point to subtract: 0 where m is -inf.

    While a row has seen only -inf scores, m_new is -inf and m - m_new would be
    (-inf) - (-inf) = nan. FA2 subtracts 0 instead, so exp(-inf - 0) = 0: alpha and p are 0,
    and the all-zero state stays all zero.
    """
    return np.where(np.isneginf(m), np.zeros((), m.dtype), m)


def moved(m_prev, m):
    """Where the running max moved from a finite value, so the old state was scaled by α < 1.

    Moving from -inf is no rescale: there was nothing to scale. Works on floats and arrays.
    """
    return (m != m_prev) & np.isfinite(m_prev)


def kept(block_max, m_prev, m):
    """Where a block's max passed the running max but m was kept (a lazy rescale skipped, FA4)."""
    return np.isfinite(m_prev) & (block_max > m_prev) & (m == m_prev)


def block_max(s: np.ndarray, out: np.ndarray | None = None, *,
              nan_free: bool = False) -> np.ndarray:
    """The largest score of each row of a block (its last axis), +0.0 where that is a zero of
    either sign: the block max of [−0.0, 0.0] is +0.0, as IEEE 754-2019's maximum orders
    −0 < +0 (docs/numerics.md#state). numpy's max returns whichever zero it meets first, and
    which one that is depends on how its SIMD loop splits the row, so two folds of the same
    scores could report −0.0 and 0.0; every fold takes its block max here. Adding +0.0 turns
    −0.0 into +0.0 and leaves every other value (±inf, NaN included) as it is. nan_free: the
    scores hold no NaN, so np.fmax, quicker, gives the same maximum. out: written in place.

    Example: block_max(np.array([[-0.0, 0.0, -1.0]])) -> [0.] (not [-0.])
    """
    op = np.fmax if nan_free else np.maximum
    m = op.reduce(s, axis=-1, out=out)
    zero = np.zeros((), dtype=s.dtype)
    return np.add(m, zero, out=m) if isinstance(m, np.ndarray) and m.ndim else m + zero


def _pv(p: np.ndarray, v: np.ndarray, p_round: Callable | None) -> np.ndarray:
    # A real kernel rounds P to the input dtype before the P·V matmul
    # (docs/numerics.md#precision-model).
    # p_round returns the rounded values in p's own (float32) dtype, so the matmul accumulates in
    # float32 as the tensor cores do; products of two 16-bit values are exact in float32.
    return (p if p_round is None else p_round(p)) @ v


def rescale_step(
    state: State,
    s: np.ndarray,
    v: np.ndarray | None = None,
    *,
    threshold: float = 0.0,
    p_round: Callable | None = None,
) -> Update:
    """Form A: m_new = max(m, max(s)); alpha = exp(m - m_new); l = l·alpha + Σ exp(s - m_new).

    s has shape (rows, block); v, if given, (block, dv) or (rows, block, dv) and O is updated too.
    With threshold τ > 0 (FA4's lazy rescale, natural-log units) m only moves when the block max
    exceeds it by more than τ; exp(s - m) then stays below e^τ and the final O / l is unchanged.
    """
    top = block_max(s)
    if threshold > 0:
        moves = top > state.m + threshold
        m_new = np.where(moves, np.maximum(state.m, top), state.m)
    else:
        m_new = np.maximum(state.m, top)
    ref = _ref(m_new)
    with np.errstate(over="ignore"):  # s - m below -max rounds to -inf, whose exp is rightly 0
        alpha = np.exp(state.m - ref)
        p = np.subtract(s, ref[..., None])
    np.exp(p, out=p)
    l = state.l * alpha + p.sum(axis=-1)
    o = None
    if v is not None:
        o = state.o * alpha[..., None] + _pv(p, v, p_round)
    return Update(State(m_new, l, o), top, alpha)


def block_state(
    s: np.ndarray, v: np.ndarray | None = None, *, p_round: Callable | None = None
) -> State:
    """A block's own statistics: m^(k) = max(s), l^(k) = Σ exp(s - m^(k)), O^(k) likewise with v."""
    m = block_max(s)
    with np.errstate(over="ignore"):
        p = np.exp(s - _ref(m)[..., None])
    o = None if v is None else _pv(p, v, p_round)
    return State(m, p.sum(axis=-1), o)


def combine(a: State, b: State) -> tuple[State, np.ndarray, np.ndarray]:
    """Merge two partial states: m = max(m_a, m_b); each side enters weighted by exp(m_side - m).

    Returns (merged, weight_a, weight_b). Rows where both sides are empty stay (-inf, 0, 0).
    """
    m = np.maximum(a.m, b.m)
    ref = _ref(m)
    with np.errstate(over="ignore"):
        wa, wb = np.exp(a.m - ref), np.exp(b.m - ref)
    l = a.l * wa + b.l * wb
    o = None
    if a.o is not None and b.o is not None:
        o = a.o * wa[..., None] + b.o * wb[..., None]
    return State(m, l, o), wa, wb


def merge_step(
    state: State, s: np.ndarray, v: np.ndarray | None = None, *, p_round: Callable | None = None
) -> Update:
    """Form B: the block's own (m^(k), l^(k), O^(k)) merged into the running state by `combine`."""
    own = block_state(s, v, p_round=p_round)
    merged, w_old, w_block = combine(state, own)
    return Update(merged, own.m, w_old, own.m, own.l, w_block)


def with_sink(state: State, sink: np.ndarray) -> tuple[State, np.ndarray]:
    """The state with a sink logit in the softmax's denominator only (docs/numerics.md#sinks):
    a key of score `sink` whose V row is 0, merged like any block by `combine`. m = max(m, sink),
    l = l·α + exp(sink − m), O = O·α: the output's numerator gets nothing. Returns (state, α).

    Example: with_sink(State(np.array([0.]), np.array([1.])), np.array([0.]))[0].l -> [2.]
    """
    sink = np.asarray(sink, dtype=state.m.dtype)
    o = None if state.o is None else np.zeros_like(state.o)
    merged, alpha, _ = combine(state, State(sink, np.ones_like(sink), o))
    return merged, alpha


def finalize(state: State) -> tuple[np.ndarray, np.ndarray | None]:
    """(LSE, O / l) from a final state. LSE = m + ln l (natural log).

    A row that saw only -inf (or no keys) has l = 0: its output is 0, its LSE -inf.
    """
    empty = state.l == 0
    with np.errstate(divide="ignore"):
        lse = state.m + np.log(state.l)
    lse = np.where(empty, -np.inf, lse)
    out = None
    if state.o is not None:
        safe_l = np.where(empty, 1, state.l)
        out = state.o / safe_l[..., None]
    return lse, out


def probabilities(scores: np.ndarray, state: State) -> np.ndarray:
    """exp(s - m) / l for every score, from the final (m, l); 0 on rows that are fully masked."""
    empty = state.l == 0
    with np.errstate(over="ignore"):
        p = np.exp(scores - _ref(state.m)[..., None])
    return np.where(empty[..., None], 0.0, p / np.where(empty, 1, state.l)[..., None])
