"""The one step record: a block of scores, or an attention K/V tile, folded into the state.

`osm trace` records one `Step` per block of the traced row, `osm attention` one per K/V tile
of the traced query row; the tables, the JSON, the CSV and step mode all read these records.
The fields are the state before and after the step (m_prev → m, l_prev → l), the rescale
factor alpha = exp(m_prev − m) and what the step saw. The backward pass's tiles will be
recorded with the same field names.

Leaves out: computing the step (state.py), turning it into text (present/).

Example: online_softmax(np.array([1., 2., 5., 3.]), 2).steps[1].alpha == exp(2 - 5)
"""

from __future__ import annotations

from dataclasses import dataclass

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


__all__ = ["Step"]
