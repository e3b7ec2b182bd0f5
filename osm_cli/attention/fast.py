"""The forward's loop over K/V tiles with the rescale step fused in place: core.state's
rescale_step, operation for operation in the same order and dtype, so the same bits.

core/state.py writes the update as the papers do, a new array for every quantity, and that is
the form to read. This is the form to run: each quantity of one Q tile (m, l, O, α, the block
max, P, P·V) has one buffer that every K/V tile writes over (`out=` everywhere, S included,
through score_tile's out), and the old and new m swap places instead of being copied. Two
changes are exact by construction: the block max is an fmax reduction (the same maximum, as
S holds no NaN, and quicker), and the −inf guard is applied to a copy of m_new in place.
tests/test_fast.py runs both loops and asks for identical bits, traces and counters.
Leaves out: the merge form and float masks that widen S (forward.py runs those through
core.state as written), the schedule over Q tiles (forward.py).

Example: fused_q_tile(plan, 0, out5, lse5) fills the rows 0:block_q of out5 and lse5
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from osm_cli.core.record import Step
from osm_cli.core.state import State, finalize, moved

from .plan import Counts, Plan, q_rows, row_step, tiles


class _Tile:
    """The running state (m, l, O) of one Q tile's rows and the scratch its steps write over."""

    def __init__(self, shape: tuple[int, int], dv: int, dtype: np.dtype):
        self.m = np.full(shape, -np.inf, dtype=dtype)  # the textbook start: m = -inf, l = 0
        self.l = np.zeros(shape, dtype=dtype)
        self.o = np.zeros((*shape, dv), dtype=dtype)
        self.m_new, self.alpha, self.block_max, self.ref, self.p_sum = (
            np.empty(shape, dtype=dtype) for _ in range(5))
        self.pv = np.empty((*shape, dv), dtype=dtype)
        self._s: dict[int, np.ndarray] = {}

    def s(self, width: int) -> np.ndarray:
        """The S buffer for a tile of `width` keys, contiguous like a new array would be."""
        if width not in self._s:
            self._s[width] = np.empty((*self.m.shape, width), dtype=self.m.dtype)
        return self._s[width]

    def step(self, s: np.ndarray, v: np.ndarray, threshold: float,
             p_round: Callable | None) -> None:
        """rescale_step(State(m, l, O), s, v) into m_new, l, O, alpha and block_max; s
        becomes P. Each line is the textbook's, with the array it writes named."""
        m, m_new, ref, alpha = self.m, self.m_new, self.ref, self.alpha
        np.fmax.reduce(s, axis=-1, out=self.block_max)
        if threshold > 0:
            np.add(m, threshold, out=m_new)
            moves = self.block_max > m_new
            np.maximum(m, self.block_max, out=m_new)
            np.copyto(m_new, m, where=~moves)
        else:
            np.maximum(m, self.block_max, out=m_new)
        np.copyto(ref, m_new)
        np.copyto(ref, 0, where=np.isneginf(m_new))  # state._ref: subtract 0 while m is -inf
        with np.errstate(over="ignore"):  # s - m below -max rounds to -inf, whose exp is 0
            np.exp(np.subtract(m, ref, out=alpha), out=alpha)
            np.subtract(s, ref[..., None], out=s)
        np.exp(s, out=s)
        np.add.reduce(s, axis=-1, out=self.p_sum)
        np.add(np.multiply(self.l, alpha, out=self.l), self.p_sum, out=self.l)
        np.matmul(s if p_round is None else p_round(s), v, out=self.pv)
        np.add(np.multiply(self.o, alpha[..., None], out=self.o), self.pv, out=self.o)

    def swap(self) -> None:
        """m_new becomes m; the old m's buffer is the next step's m_new."""
        self.m, self.m_new = self.m_new, self.m


def fused_q_tile(plan: Plan, i0: int, out5: np.ndarray, lse5: np.ndarray, *,
                 threshold: float = 0.0, p_round: Callable | None = None
                 ) -> tuple[list[Step], Counts]:
    """forward._q_tile with the rescale form, fused: the query rows i0:i0+bq of out5 and lse5
    written, the traced row's steps and the counts returned (the same as _q_tile's)."""
    b, hk, g = plan.groups
    qt, n, at = q_rows(plan, i0)
    st = _Tile(qt.shape[:-1], plan.v3.shape[-1], plan.accum)
    steps: list[Step] = []
    counts = Counts()
    for bounds, s, v in tiles(plan, i0, qt, st.s):
        if s is None:
            counts.skipped += 1
            if at is not None:
                m, l = st.m[at], st.l[at]
                steps.append(row_step(bounds, -np.inf, m, m, 1.0, l, l, st.o[at], True))
            continue
        l_prev = st.l[at] if at is not None else None
        st.step(s, v, threshold, p_round)
        counts.computed += 1
        counts.row_visits += n
        counts.rescales += int(np.count_nonzero(moved(st.m, st.m_new)))
        if at is not None:
            steps.append(row_step(bounds, st.block_max[at], st.m[at], st.m_new[at],
                                  st.alpha[at], l_prev, st.l[at], st.o[at]))
        st.swap()
    lse, o = finalize(State(st.m, st.l, st.o))
    out5[..., i0:i0 + n, :] = o.reshape(b, hk, g, n, out5.shape[-1])
    lse5[..., i0:i0 + n] = lse.reshape(b, hk, g, n)
    return steps, counts


__all__ = ["fused_q_tile"]
