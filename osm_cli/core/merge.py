"""Merging partial results: split-KV (Flash-Decoding) and any grouping of online states.

Two views of one fact: partial softmax results over disjoint sets of keys merge exactly.

- `merge_detail` / `merge_partials` merge *normalised* partial outputs O_s with their
  log-sum-exps LSE_s, as a split-KV kernel (Flash-Decoding, FlashInfer's merge_state) writes
  them: L = logsumexp_s LSE_s, out = Σ_s exp(LSE_s − L)·O_s (docs/numerics.md#split-kv-merge).
  A chunk with no visible keys has LSE −inf (or +inf, FA2's marker for it, read as −inf) and
  weight 0; all chunks empty gives O = 0, LSE = −inf, never NaN.
- `tree_merge` / `fold_merge` merge *unnormalised* online states (m, l, O) with state.combine,
  pairwise or left to right (docs/numerics.md#order).

Leaves out: files (io/), printing (present/), attention's split-KV run (flash/split.py),
what `osm merge` reports (reports/merge.py), the order check (studies/order.py).

Example: merge_partials([[1.], [3.]], [0., 0.]) -> (array([2.]), array(0.6931...)) (= ln 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from osm_cli.errors import InputError, ShapeError

from .fold import block_bounds
from .names import LSE_BASES
from .state import State, block_state, combine, finalize, initial_state, probabilities


@dataclass(frozen=True)
class Merged:
    """A merge of S partials: out (..., dv), lse (...) in `lse_base`, weights (S, ...).

    weights[s] = exp(LSE_s − L) (2^(LSE_s − L) in base 2): the share of split s in each row;
    they sum to 1 on every row that has a visible key and are all 0 on an empty row.
    """

    out: np.ndarray
    lse: np.ndarray
    weights: np.ndarray
    empty: np.ndarray  # (S, ...) True where split s had no visible key (LSE ±inf)
    lse_base: str


def stack_parts(xs, name: str) -> np.ndarray:
    if isinstance(xs, np.ndarray):
        return xs
    try:
        return np.stack([np.asarray(x) for x in xs])
    except ValueError:
        shapes = ", ".join(str(tuple(np.shape(x))) for x in xs)
        raise ShapeError(f"the {name} have different shapes: {shapes}") from None


def merge_detail(outs, lses, lse_base: str = "e", dtype=np.float64) -> Merged:
    """Merge partial outputs and LSEs; see `Merged`. outs (S, ..., dv), lses (S, ...).

    Either argument may be a list of S arrays or one stacked array. Computed in `dtype` (float64;
    precision/kernels.py's FA2 model merges in float32, as FA2's combine kernel does); the LSE stays
    in the base it came in (FlashInfer's is log2, FA's and PyTorch's natural).
    """
    if lse_base not in LSE_BASES:
        raise InputError(f"lse_base must be 'e' or '2', not {lse_base!r}")
    o = stack_parts(outs, "outputs")
    lse = stack_parts(lses, "LSEs")
    if o.ndim < 2 or len(o) == 0:
        raise ShapeError(
            f"outputs must be (splits, ..., dv) with at least one split, not {o.shape}"
        )
    if o.shape[:-1] != lse.shape:
        raise ShapeError(
            f"each output's leading shape {o.shape[1:-1]} must equal its LSE's shape "
            f"{lse.shape[1:]} (output (..., dv), LSE (...))"
        )
    o = np.asarray(o, dtype=dtype)
    lse = np.asarray(lse, dtype=dtype)
    if np.isnan(lse).any():
        raise InputError("an LSE is NaN; a partial result with NaN cannot be merged")
    exp, log = (np.exp, np.log) if lse_base == "e" else (np.exp2, np.log2)
    empty = np.isinf(lse)  # -inf: no visible key; +inf: FA2 writes that for an empty chunk
    lse = np.where(empty, -np.inf, lse)
    top = lse.max(axis=0)
    ref = np.where(np.isneginf(top), lse.dtype.type(0), top)  # all empty: subtract 0, not -inf
    shifted = exp(lse - ref)  # ≤ 1, exactly 0 for the empty splits
    total = shifted.sum(axis=0)
    none = total == 0
    with np.errstate(divide="ignore"):
        merged_lse = np.where(none, -np.inf, ref + log(np.where(none, 1.0, total)))
    weights = shifted / np.where(none, 1.0, total)
    # An empty split's O may hold anything (0 in FA, garbage elsewhere): weight 0 must mean 0.
    with np.errstate(invalid="ignore", over="ignore"):
        contrib = np.where(weights[..., None] > 0, weights[..., None] * o, 0.0)
    return Merged(contrib.sum(axis=0), merged_lse, weights, empty, lse_base)


def merge_partials(outs, lses, lse_base: str = "e") -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of merged partials: L = logsumexp_s LSE_s, out = Σ_s exp(LSE_s − L)·O_s.

    Example: merge_partials([[1., 0.], [0., 1.]], [np.log(3), np.log(1)]) -> ([0.75, 0.25], ln 4)
    """
    m = merge_detail(outs, lses, lse_base)
    return m.out, m.lse


def split_edges(n: int, splits: int) -> np.ndarray:
    """The splits + 1 key indices that cut n keys into `splits` near-equal chunks (some empty
    when splits > n). Example: split_edges(8, 3) -> [0, 3, 5, 8]"""
    if splits < 1:
        raise InputError(f"splits must be at least 1, not {splits}")
    return np.linspace(0, n, splits + 1).round().astype(int)


def partials(scores: np.ndarray, v: np.ndarray, splits: int) -> tuple[np.ndarray, np.ndarray]:
    """Split the keys of scores (rows, n) and v (n, dv) into `splits` near-equal chunks and run
    each to a normalised (O_s, LSE_s), as a split-KV kernel does.

    Returns outs (S, rows, dv) and lses (S, rows).

    A chunk with no keys (splits > n) or only -inf scores gets O = 0, LSE = -inf.
    """
    s = np.atleast_2d(scores)
    edges = split_edges(s.shape[-1], splits)
    outs, lses = [], []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if a == b:
            st = initial_state(s.shape[0], v.shape[-1])
        else:
            st = block_state(s[:, a:b], v[a:b])
        lse, out = finalize(st)
        outs.append(out)
        lses.append(lse)
    return np.stack(outs), np.stack(lses)


def fold_merge(states: Sequence[State]) -> State:
    """((s0 ⊕ s1) ⊕ s2) ⊕ … : the sequential fold of the merge form."""
    if not states:
        raise InputError("nothing to merge: no states")
    acc = states[0]
    for st in states[1:]:
        acc = combine(acc, st)[0]
    return acc


def tree_merge(states: Sequence[State]) -> State:
    """Pairwise merge, (s0 ⊕ s1) ⊕ (s2 ⊕ s3) …, level by level; an odd one out moves up as is.

    Same result as fold_merge to rounding: combine is associative and commutative
    (docs/numerics.md#order).
    """
    if not states:
        raise InputError("nothing to merge: no states")
    level = list(states)
    while len(level) > 1:
        nxt = [combine(a, b)[0] for a, b in zip(level[0::2], level[1::2], strict=False)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def tree_softmax(scores: np.ndarray, block: int) -> tuple[State, np.ndarray]:
    """Each block's own (m, l) merged pairwise: (state, probabilities) over all rows of scores."""
    s = np.atleast_2d(scores)
    n = s.shape[-1]
    states = [block_state(s[:, a:b]) for _, a, b in block_bounds(n, block)]
    st = tree_merge(states)
    return st, probabilities(s, st)


__all__ = [
    "LSE_BASES", "Merged", "fold_merge", "merge_detail", "merge_partials", "partials",
    "split_edges", "tree_merge", "tree_softmax",
]
