"""The step records: a block of scores or an attention K/V tile folded into the state (`Step`),
the same fields for many blocks at once as columns of arrays (`StepColumns`), and a tile of the
backward pass (`GradStep`).

`osm trace` records one `Step` per block of the traced row, `osm attention` one per K/V tile
of the traced query row; the tables, the JSON, the CSV and step mode all read these records.
The fields are the state before and after the step (m_prev → m, l_prev → l), the rescale
factor alpha = exp(m_prev − m) and what the step saw. The backward pass's tiles share the
field names where the idea is the same (block, start, stop, masked).

Leaves out: computing the step (state.py), turning it into text (present/).

Example: online_softmax(np.array([1., 2., 5., 3.]), 2).steps[1].alpha == exp(2 - 5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from .state import kept, moved


@dataclass(frozen=True)
class Step:
    """One block (trace) or K/V tile (attention) as the traced row saw it.

    block: the block's index (for attention, the K/V tile's); start:stop its keys.
    block_max: the largest score of the block (-inf for a tile the mask hides).
    alpha: the factor the old state was multiplied by, exp(m_prev − m) (1 for a masked tile).
    masked: the mask hides the whole tile, so it was skipped, not computed (attention).
    values: the block's scores (trace); block_m, block_l, block_weight: the merge form's own
    statistics of the block and the weight exp(m⁽ᵏ⁾ − m) it entered with (form merge only);
    o, o_norm: the first components and the norm of the unnormalised O after the tile
    (attention only).
    """

    block: int
    start: int
    stop: int
    block_max: float
    m_prev: float
    m: float
    alpha: float
    l_prev: float
    l: float
    masked: bool = False
    values: np.ndarray | None = None
    block_m: float | None = None
    block_l: float | None = None
    block_weight: float | None = None
    o: np.ndarray | None = None
    o_norm: float | None = None
    sink: bool = False  # not a tile: the sink joining the denominator (block_max is its logit)
    pages: tuple | None = None  # paged KV: the physical pages the tile's keys came from
    p_max: float | None = None  # FP8: the row's largest P of the tile before rounding (offset in)
    saturated: int | None = None  # FP8: how many of those P exceed the dtype's largest finite
    kind: str | None = None  # under a mask_mod: the tile's block-mask kind, "full" or "partial"
    query: int | None = None  # attention: the traced query row this step is of

    @property
    def rescaled(self) -> bool:
        """The finite running max moved here, so the old state was actually scaled by α < 1."""
        return bool(moved(self.m_prev, self.m))

    @property
    def lazy_skipped(self) -> bool:
        """The block max passed m but m was kept: a lazy rescale skipped
        (docs/numerics.md#lazy-rescale). An eager step would have moved m and rescaled here;
        with threshold τ the block max stayed within m + τ, so exp(s − m) ≤ e^τ."""
        return bool(kept(self.block_max, self.m_prev, self.m))


@dataclass(frozen=True)
class StepColumns:
    """Consecutive steps of a traced row as columns: entry i of each array is step i's field of
    the same name in `Step` (a long trace's steps come a chunk of columns at a time, and the
    JSON and CSV are written from them whole columns at once). block_m, block_l and
    block_weight are None outside the merge form; `step(i)` makes the Step record itself.

    Example: StepColumns.from_steps(trace.steps).step(1) == trace.steps[1] (but for values)
    """

    block: np.ndarray  # int64
    start: np.ndarray  # int64
    stop: np.ndarray  # int64
    block_max: np.ndarray
    m_prev: np.ndarray
    m: np.ndarray
    alpha: np.ndarray
    l_prev: np.ndarray
    l: np.ndarray
    block_m: np.ndarray | None = None
    block_l: np.ndarray | None = None
    block_weight: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.block)

    @property
    def rescaled(self) -> np.ndarray:
        """Step.rescaled of every step (bool array)."""
        return moved(self.m_prev, self.m)

    @property
    def lazy_skipped(self) -> np.ndarray:
        """Step.lazy_skipped of every step (bool array)."""
        return kept(self.block_max, self.m_prev, self.m)

    def step(self, i: int, values: np.ndarray | None = None) -> Step:
        """Step i as its record; values: the block's scores, as the trace records them."""
        merge = {} if self.block_l is None else {
            "block_m": float(self.block_m[i]), "block_l": float(self.block_l[i]),
            "block_weight": float(self.block_weight[i])}
        return Step(int(self.block[i]), int(self.start[i]), int(self.stop[i]),
                    float(self.block_max[i]), float(self.m_prev[i]), float(self.m[i]),
                    float(self.alpha[i]), float(self.l_prev[i]), float(self.l[i]),
                    values=values, **merge)

    def take(self, index) -> StepColumns:
        """The steps at `index` (a slice or an index array), as columns."""
        return StepColumns(*(None if x is None else x[index] for x in self._arrays()))

    @classmethod
    def from_steps(cls, steps: Sequence[Step]) -> StepColumns:
        """Columns of Step records (of one form: all or none have block_l)."""
        def col(name, dtype=np.float64):
            return np.array([getattr(s, name) for s in steps], dtype=dtype)

        merge = bool(steps) and steps[0].block_l is not None
        return cls(*(col(n, np.int64) for n in ("block", "start", "stop")),
                   *(col(n) for n in ("block_max", "m_prev", "m", "alpha", "l_prev", "l")),
                   *((col(n) for n in ("block_m", "block_l", "block_weight")) if merge else ()))

    @classmethod
    def concat(cls, parts: Sequence[StepColumns]) -> StepColumns:
        """The steps of `parts` one after the other (at least one part)."""
        return cls(*(None if xs[0] is None else np.concatenate(xs)
                     for xs in zip(*(p._arrays() for p in parts), strict=True)))

    def _arrays(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))


DETAIL_SHOWN = 8  # entries of P, dP, D, dS a GradDetail keeps (the explanation shows a few)


@dataclass(frozen=True)
class GradDetail:
    """A backward tile's numbers on the traced row, for --explain: the first entries of P (the
    forward's probabilities, recomputed as exp(S − LSE)), dP = dO·Vᵀ, D = rowsum(dO∘O) and
    dS = P∘(dP − D), along the traced query row's keys (a query trace) or the traced key's
    column over the Q tile's rows of the traced query head (a key trace), `count` of them in
    the tile; `adds` holds (name, the tile's contribution, the value after it) for the
    gradients' leading components, as finally written (score scale in); heads: the query heads
    whose rows the key's sums run over (GQA's g); factor: dS carries a score transform's
    derivative (softcap, score_mod)."""

    p: np.ndarray
    dp: np.ndarray
    d: np.ndarray
    ds: np.ndarray
    count: int
    adds: tuple
    heads: int = 1
    factor: bool = False


@dataclass(frozen=True)
class GradStep:
    """One tile of the backward pass as a traced key row or query row saw it.

    Key trace (dK_j, dV_j of one key, accumulating over the Q tiles): start:stop are the Q
    tile's query rows, dk_norm and dv_norm ‖dK_j‖ and ‖dV_j‖ after the tile. Query trace (dQ_i,
    accumulating over the K/V tiles): start:stop are the tile's keys, dq_norm ‖dQ_i‖ after it.
    p_max is the largest recomputed P = exp(S − LSE) the traced row or key saw in the tile and
    ds_sum Σ dS over it (0 and 0 for a tile the mask hides: masked, skipped as in the forward).
    The norms include the score scale: they are of the gradients as finally written.
    """

    block: int
    start: int
    stop: int
    masked: bool
    p_max: float
    ds_sum: float
    dk_norm: float | None = None
    dv_norm: float | None = None
    dq_norm: float | None = None
    query: int | None = None  # a query trace: the traced query row this step is of
    detail: GradDetail | None = field(default=None, compare=False)  # --explain's numbers
    kind: str | None = None  # under a mask_mod: the tile's block-mask kind, "full" or "partial"


__all__ = ["DETAIL_SHOWN", "GradDetail", "GradStep", "Step", "StepColumns"]
