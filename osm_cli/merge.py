"""Split-KV merge (Flash-Decoding) and the order/grouping independence of partial states.

Two views of one fact: partial softmax results over disjoint sets of keys can be merged exactly.

- `merge_partials` merges *normalised* partial outputs O_s with their log-sum-exps LSE_s, as a
  split-KV kernel (Flash-Decoding, FlashInfer's merge_state) writes them (NUMERICS §4):
  L = logsumexp_s LSE_s, out = Σ_s exp(LSE_s − L)·O_s. A chunk with no visible keys has
  LSE −inf (or +inf, FA2's marker for it, read as −inf) and weight 0; all chunks empty gives
  O = 0, LSE = −inf, never NaN. `merge_report` is what `osm merge` shows of such a merge.
- `tree_merge` / `fold_merge` merge *unnormalised* online states (m, l, O) with online.combine,
  pairwise or left to right; `order_check` shows that any block order and any grouping give the
  one-shot result to rounding.

Leaves out: files (io.py), printing (render.py), attention tiling (attention.py).

Example: merge_partials([[1.], [3.]], [0., 0.]) -> (array([2.]), array(0.6931...)) (= ln 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError, ShapeError
from .online import (
    State,
    Trace,
    block_bounds,
    block_state,
    combine,
    finalize,
    initial_state,
    online_softmax,
    probabilities,
)
from .reference import max_abs_diff

LSE_BASES = ("e", "2")
ORDERS = ("forward", "reverse", "shuffle")


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


def _stack(xs, name: str) -> np.ndarray:
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
    precision.py's kernel model merges in float32, as FA2's combine kernel does); the LSE stays
    in the base it came in (FlashInfer's is log2, FA's and PyTorch's natural).
    """
    if lse_base not in LSE_BASES:
        raise InputError(f"lse_base must be 'e' or '2', not {lse_base!r}")
    o = _stack(outs, "outputs")
    lse = _stack(lses, "LSEs")
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


@dataclass(frozen=True)
class SplitStat:
    """One split of a merge, summarised over its rows (what `osm merge` tabulates)."""

    split: int
    rows: int
    empty: int  # rows where this split saw no key (LSE -inf or +inf)
    pos_inf: int  # of which written as +inf (FA2's marker)
    lse_min: float  # over the non-empty rows (nan when none)
    lse_max: float
    weight_min: float  # exp(LSE_s − L) over rows with any visible key (nan when none)
    weight_max: float
    weight_mean: float


def split_stats(merged: Merged, lses) -> tuple[SplitStat, ...]:
    """Per split: empty rows, +inf markers, LSE range and weight range. lses: the LSEs as given."""
    lse = np.asarray(_stack(lses, "LSEs"), dtype=np.float64)
    live = ~np.isneginf(merged.lse)  # rows that some split saw
    stats = []
    for n in range(lse.shape[0]):
        seen = lse[n][~merged.empty[n]]
        w = merged.weights[n][live]
        stats.append(SplitStat(
            n, int(lse[n].size), int(merged.empty[n].sum()), int(np.isposinf(lse[n]).sum()),
            float(seen.min()) if seen.size else np.nan, float(seen.max()) if seen.size else np.nan,
            float(w.min()) if w.size else np.nan, float(w.max()) if w.size else np.nan,
            float(w.mean()) if w.size else np.nan,
        ))
    return tuple(stats)


# ---------------------------------------------------------------------------------------------
# Order and grouping of unnormalised states


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

    Same result as fold_merge to rounding: combine is associative and commutative (NUMERICS §1).
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


def block_order(count: int, order: str = "forward", seed: int = 0) -> np.ndarray:
    """Block indices 0..count-1 in `order`: forward, reverse, or a seeded shuffle."""
    if order == "forward":
        return np.arange(count)
    if order == "reverse":
        return np.arange(count)[::-1].copy()
    if order == "shuffle":
        return np.random.default_rng(seed).permutation(count)
    raise InputError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")


@dataclass(frozen=True)
class OrderCheck:
    """Forward fold vs the chosen order vs a pairwise tree merge, over every row.

    Differences are max |Δ| of the probabilities and of the LSE (natural log).
    """

    order: str
    indices: np.ndarray
    p_order: float  # forward vs chosen order
    p_tree: float  # forward vs tree
    p_order_tree: float  # chosen order vs tree
    lse_order: float
    lse_tree: float


def tree_softmax(scores: np.ndarray, block: int) -> tuple[State, np.ndarray]:
    """Each block's own (m, l) merged pairwise: (state, probabilities) over all rows of scores."""
    s = np.atleast_2d(scores)
    n = s.shape[-1]
    states = [block_state(s[:, a:b]) for _, a, b in block_bounds(n, block)]
    st = tree_merge(states)
    return st, probabilities(s, st)


def order_check(
    scores: np.ndarray, block: int, form: str = "rescale", order: str = "forward", seed: int = 0,
    threshold: float = 0.0, chosen: Trace | None = None,
) -> OrderCheck:
    """Run forward, in `order`, and as a tree; report the largest differences between them.

    `chosen` reuses a run in that order already made (online_softmax with the same arguments).
    """
    s = np.atleast_2d(scores)
    count = -(-s.shape[-1] // block)
    idx = block_order(count, order, seed)
    fwd = online_softmax(s, block, form, threshold=threshold)
    if chosen is None:
        chosen = online_softmax(s, block, form, order=idx, threshold=threshold)
    tree_state, tree_p = tree_softmax(s, block)
    tree_lse, _ = finalize(tree_state)
    return OrderCheck(
        order, idx,
        max_abs_diff(fwd.probabilities, chosen.probabilities),
        max_abs_diff(fwd.probabilities, tree_p),
        max_abs_diff(chosen.probabilities, tree_p),
        max_abs_diff(fwd.lse, chosen.lse),
        max_abs_diff(fwd.lse, tree_lse),
    )


# ---------------------------------------------------------------------------------------------
# What osm merge shows


@dataclass(frozen=True)
class MergeReport:
    """What `osm merge` shows: the merge, each split summarised, and one row in detail."""

    merged: Merged
    stats: tuple[SplitStat, ...]
    row: int  # a flat index over O's leading axes
    row_lses: tuple[float, ...]  # each split's LSE at `row`, as given
    row_weights: tuple[float, ...]  # each split's merge weight at `row`
    row_lse: float  # the merged LSE at `row`
    row_out: np.ndarray  # the merged O at `row`
    empty_rows: int  # rows no split saw (O = 0, LSE = -inf)


def merge_report(outs, lses, lse_base: str = "e", row: int = 0) -> MergeReport:
    """merge_detail and split_stats of the partials, and each split's LSE at `row`."""
    merged = merge_detail(outs, lses, lse_base)
    stats = split_stats(merged, lses)
    if row >= merged.lse.size:
        raise InputError(f"--row {row} is out of range; the partials have {merged.lse.size} "
                         "row(s)")
    flat_lse = merged.lse.reshape(-1)
    return MergeReport(
        merged, stats, row, tuple(float(np.asarray(x).reshape(-1)[row]) for x in lses),
        tuple(float(w) for w in merged.weights.reshape(len(stats), -1)[:, row]),
        float(flat_lse[row]), merged.out.reshape(flat_lse.size, -1)[row],
        int(np.isneginf(flat_lse).sum()),
    )


__all__ = [
    "LSE_BASES", "ORDERS", "MergeReport", "Merged", "OrderCheck", "SplitStat", "block_order",
    "fold_merge", "merge_detail", "merge_partials", "merge_report", "order_check", "partials",
    "split_stats", "tree_merge", "tree_softmax",
]
