"""The fold over blocks: online softmax of a score vector or matrix, one `Step` per block.

`online_softmax` cuts each row into blocks of `block` scores, folds them into (m, l) with one
of state.py's two update forms, in a given block order and with an optional lazy-rescale
threshold, and records the traced row's steps. This is what `osm trace` shows. `Folding` is the
loop itself, a step at a time; its `columns()` gives the steps a chunk at a time as columns,
through fastfold.py's vectorized loop where that computes the same fold (the eager rescale form
in forward order), else through this one.
Leaves out: the update itself (state.py), tiles of attention (flash/), printing.

Example: online_softmax(np.array([1., 2., 5., 3.]), 2).steps[1].alpha == exp(2 - 5)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from osm_cli.errors import ShapeError

from .fastfold import EagerFold, eligible
from .inputs import as_numbers
from .notebook import Notebook, trace_tables
from .record import Step, StepColumns
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
class Trace(Notebook):
    """The result of `online_softmax`: steps of the traced row and final values of every row.
    In Jupyter it shows as its step table and final state (notebook.py)."""

    form: str
    block: int
    row: int
    steps: tuple[Step, ...]  # every step, or (keep=K) the first K and the last K
    m: np.ndarray
    l: np.ndarray
    lse: np.ndarray
    probabilities: np.ndarray | None  # None when not asked for (computed later, chunk by chunk)
    rescales: int = 0  # (row, block) steps, over every row, that moved a finite running max
    n_steps: int | None = None  # how many steps there were (None: len(steps))

    @property
    def step_count(self) -> int:
        return len(self.steps) if self.n_steps is None else self.n_steps

    def _tables(self):
        return trace_tables(self)


def block_bounds(n: int, block: int, order: np.ndarray | None = None) -> Iterator[tuple]:
    """(block index, start, stop) for blocks of `block` scores, in `order` if given."""
    count = -(-n // block)
    for k in range(count) if order is None else order:
        yield int(k), int(k) * block, min(n, (int(k) + 1) * block)


def fold(
    state: State, blocks: Iterable[tuple], step: Callable[..., Update], **step_kw
) -> Iterator[tuple[object, State, Update | None, State]]:
    """The loop over blocks, once, for trace and attention: fold each block into the state.

    blocks yields (key, s, v): s the block's scores (rows, block), v its V rows or None, and
    s None for a block the mask hides, which is skipped. Yields (key, state before, update,
    state after) for every block (update None where skipped); step is state.rescale_step or
    merge_step, called with step_kw. The last state after is the final state.
    """
    for key, s, v in blocks:
        up = None if s is None else step(state, s, v, **step_kw)
        after = state if up is None else up.state
        yield key, state, up, after
        state = after


class Folding:
    """Online softmax over the rows of `scores` as it happens: iterating yields the traced row's
    Step for each block, one at a time (so a long trace is never held whole); once done,
    `state` is the final state of every row and `rescales` counts the (row, block) steps that
    moved a finite running max. See online_softmax for the arguments."""

    def __init__(self, scores: np.ndarray, block: int = 2, form: str = "rescale", *,
                 row: int = 0, order: np.ndarray | None = None, threshold: float = 0.0):
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, not {form!r}")
        if block < 1:
            raise ValueError("block must be at least 1")
        scores = as_numbers(scores, "scores")
        if scores.ndim > 2:  # the fast fold and the records take rows of one row each
            raise ShapeError(f"scores must be one row (1-D) or rows (2-D), not {scores.ndim}-D "
                             f"of shape {scores.shape}")
        self.s2 = np.atleast_2d(scores)
        block = min(int(block), max(1, self.s2.shape[1]))  # longer than the row: one block
        self.block, self.form, self.row, self.order = block, form, row, order
        self.step_kw = {"threshold": threshold} if form == "rescale" else {}
        self.state = initial_state(self.s2.shape[0], dtype=self.s2.dtype)
        self.rescales = 0

    def __iter__(self) -> Iterator[Step]:
        s2, row = self.s2, self.row
        blocks = ((b, s2[:, b[1]:b[2]], None)
                  for b in block_bounds(s2.shape[1], self.block, self.order))
        step = rescale_step if self.form == "rescale" else merge_step
        for (k, start, stop), prev, up, new in fold(self.state, blocks, step, **self.step_kw):
            self.rescales += int(np.count_nonzero(moved(prev.m, new.m)))
            self.state = new
            yield Step(
                k, start, stop, float(up.block_max[row]), float(prev.m[row]), float(new.m[row]),
                float(up.alpha[row]), float(prev.l[row]), float(new.l[row]),
                values=np.array(s2[row, start:stop]),
                **{name: None if x is None else float(x[row]) for name, x in (
                    ("block_m", up.block_m), ("block_l", up.block_l),
                    ("block_weight", up.block_weight))},
            )

    def columns(self, batch: int = 4096) -> Iterator[StepColumns]:
        """The traced row's steps as columns, a chunk at a time (StepColumns); then `state` and
        `rescales` as after iterating. The eager rescale form in forward order runs
        fastfold.EagerFold, the same fold bit for bit; every other runs this loop, `batch`
        steps a chunk (the columns leave out each block's values)."""
        if eligible(self.s2, self.form, self.order, self.step_kw.get("threshold", 0.0)):
            run = EagerFold(self.s2, self.block, self.row)
            yield from run
            self.state, self.rescales = run.state, run.rescales
            return
        steps: list[Step] = []
        for st in self:
            steps.append(st)
            if len(steps) == batch:
                yield StepColumns.from_steps(steps)
                steps = []
        if steps:
            yield StepColumns.from_steps(steps)

    def records(self, cols: StepColumns) -> list[Step]:
        """The Step records of `cols`, each with its block's values (as iterating makes them)."""
        row = self.s2[self.row]
        bounds = zip(cols.start.tolist(), cols.stop.tolist(), strict=True)
        return [cols.step(i, np.array(row[a:b])) for i, (a, b) in enumerate(bounds)]


def _ends(chunks: Iterable[StepColumns], keep: int | None):
    """(head, tail, count) of a run's columns: all of them as head (keep None), or the first
    `keep` steps and the last `keep` after them (None where there are none)."""
    parts: list[StepColumns] = []
    tail: deque[StepColumns] = deque()
    count = held = 0
    for cols in chunks:
        if keep is None or count < keep:
            cut = len(cols) if keep is None else min(len(cols), keep - count)
            parts.append(cols.take(slice(0, cut)))
            cols = cols.take(slice(cut, None))
            count += cut
        if len(cols):
            tail.append(cols)
            held += len(cols)
            count += len(cols)
            while len(tail) > 1 and held - len(tail[0]) >= keep:  # no longer among the last
                held -= len(tail.popleft())
    head = StepColumns.concat(parts) if parts else None
    last = StepColumns.concat(list(tail)).take(slice(-keep, None)) if tail and keep else None
    return head, last, count


def online_softmax(
    scores: np.ndarray,
    block: int = 2,
    form: str = "rescale",
    *,
    row: int = 0,
    order: np.ndarray | None = None,
    threshold: float = 0.0,
    keep: int | None = None,
    with_probabilities: bool = True,
) -> Trace:
    """Run online softmax over the rows of `scores` (1-D or 2-D) in blocks of `block` scores.

    Returns a Trace whose steps are the traced row's (`row`), and whose m, l, lse and
    probabilities cover all rows (shaped like the input without / with its last axis). keep=K
    keeps only the first and last K steps (Trace.n_steps counts them all), and
    with_probabilities=False leaves the probabilities out: together they bound the memory of a
    trace of a very long row to its state.

    Example: online_softmax(np.array([1., 2., 5., 3.]), 2).steps[1].alpha == exp(2 - 5)
    """
    scores = as_numbers(scores, "scores")  # [1, 2, 5, 3] and integers as float64
    run = Folding(scores, block, form, row=row, order=order, threshold=threshold)
    block = run.block
    head, tail, count = _ends(run.columns(), keep)
    steps = tuple(st for part in (head, tail) if part is not None for st in run.records(part))
    state = run.state
    lse, _ = finalize(state)
    probs = probabilities(run.s2, state) if with_probabilities else None
    if np.ndim(scores) == 1:
        return Trace(form, block, row, steps, state.m[0], state.l[0], lse[0],
                     None if probs is None else probs[0], run.rescales, count)
    return Trace(form, block, row, steps, state.m, state.l, lse, probs, run.rescales, count)
