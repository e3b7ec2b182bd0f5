"""The fold over blocks: online softmax of a score vector or matrix, one `Step` per block.

`online_softmax` cuts each row into blocks of `block` scores, folds them into (m, l) with one
of state.py's two update forms, in a given block order and with an optional lazy-rescale
threshold, and records the traced row's steps. This is what `osm trace` shows.
Leaves out: the update itself (state.py), tiles of attention (attention/), printing.

Example: online_softmax(np.array([1., 2., 5., 3.]), 2).steps[1].alpha == exp(2 - 5)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .record import Step
from .state import (
    FORMS,
    State,
    Update,
    finalize,
    initial_state,
    merge_step,
    moved,
    probabilities,
    rescale_step,
)


@dataclass(frozen=True)
class Trace:
    """The result of `online_softmax`: steps of the traced row and final values of every row."""

    form: str
    block: int
    row: int
    steps: tuple[Step, ...]
    m: np.ndarray
    l: np.ndarray
    lse: np.ndarray
    probabilities: np.ndarray
    rescales: int = 0  # (row, block) steps, over every row, that moved a finite running max


def block_bounds(n: int, block: int, order: np.ndarray | None = None) -> Iterator[tuple]:
    """(block index, start, stop) for blocks of `block` scores, in `order` if given."""
    count = -(-n // block)
    for k in range(count) if order is None else order:
        yield int(k), int(k) * block, min(n, (int(k) + 1) * block)


def fold(
    state: State,
    blocks: Iterable[tuple],
    step: Callable[..., Update],
    on_step: Callable[[object, State, Update | None], None] | None = None,
    **step_kw,
) -> State:
    """The loop over blocks, once, for trace and attention: fold each block into the state.

    blocks yields (key, s, v): s the block's scores (rows, block), v its V rows or None, and
    s None for a block the mask hides, which is skipped. on_step(key, state before, update)
    sees every block (update None where skipped); step is state.rescale_step or merge_step,
    called with step_kw. Returns the final state.
    """
    for key, s, v in blocks:
        up = None if s is None else step(state, s, v, **step_kw)
        if on_step is not None:
            on_step(key, state, up)
        if up is not None:
            state = up.state
    return state


def online_softmax(
    scores: np.ndarray,
    block: int = 2,
    form: str = "rescale",
    *,
    row: int = 0,
    order: np.ndarray | None = None,
    threshold: float = 0.0,
) -> Trace:
    """Run online softmax over the rows of `scores` (1-D or 2-D) in blocks of `block` scores.

    Returns a Trace whose steps are the traced row's (`row`), and whose m, l, lse and
    probabilities cover all rows (shaped like the input without / with its last axis).

    Example: online_softmax(np.array([1., 2., 5., 3.]), 2).steps[1].alpha == exp(2 - 5)
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, not {form!r}")
    if block < 1:
        raise ValueError("block must be at least 1")
    s2 = np.atleast_2d(scores)
    steps: list[Step] = []
    rescales = 0

    def record(bounds, prev: State, up: Update) -> None:
        nonlocal rescales
        (k, start, stop), new = bounds, up.state
        rescales += int(np.count_nonzero(moved(prev.m, new.m)))
        steps.append(Step(
            k, start, stop, float(up.block_max[row]), float(prev.m[row]), float(new.m[row]),
            float(up.alpha[row]), float(prev.l[row]), float(new.l[row]),
            values=s2[row, start:stop],
            **{name: None if x is None else float(x[row]) for name, x in (
                ("block_m", up.block_m), ("block_l", up.block_l),
                ("block_weight", up.block_weight))},
        ))

    blocks = ((b, s2[:, b[1]:b[2]], None) for b in block_bounds(s2.shape[1], block, order))
    step_kw = {"threshold": threshold} if form == "rescale" else {}
    state = fold(initial_state(s2.shape[0], dtype=s2.dtype), blocks,
                 rescale_step if form == "rescale" else merge_step, record, **step_kw)
    lse, _ = finalize(state)
    probs = probabilities(s2, state)
    if scores.ndim == 1:
        return Trace(form, block, row, tuple(steps), state.m[0], state.l[0], lse[0], probs[0],
                     rescales)
    return Trace(form, block, row, tuple(steps), state.m, state.l, lse, probs, rescales)
