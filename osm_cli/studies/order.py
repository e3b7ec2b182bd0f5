"""Block order and grouping: any order of the blocks and any grouping of the merges give the
one-shot result to rounding (docs/numerics.md#order).

`block_order` gives the blocks forward, reversed or shuffled; `order_check` runs online softmax
forward, in that order and as a pairwise tree merge of each block's own state, and reports the
largest differences between them. Leaves out: the merge itself (core/merge.py), printing.

Example: order_check(np.array([[1., 2., 5., 3.]]), 1, order="reverse").p_order < 1e-15
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.fold import Trace, online_softmax
from osm_cli.core.merge import tree_softmax
from osm_cli.core.reference import max_abs_diff
from osm_cli.core.state import finalize
from osm_cli.errors import InputError

from .names import ORDERS


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


__all__ = ["ORDERS", "OrderCheck", "block_order", "order_check"]
