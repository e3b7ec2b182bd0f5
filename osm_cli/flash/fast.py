"""The forward's loop over K/V tiles with the rescale step fused in place: core.state's
rescale_step, operation for operation in the same order and dtype, so the same bits.

core/state.py writes the update as the papers do, a new array for every quantity, and that is
the form to read. This is the form to run: each quantity of one Q tile (m, l, O, α, the block
max, P, P·V) has one buffer that every K/V tile writes over (`out=` everywhere, S included,
through score_tile's out), and m_new is copied back into m for the next tile. Two changes are
exact by construction: the block max is an fmax reduction (state.block_max's nan_free: the
same maximum, as S holds no NaN, and quicker), and the −inf guard is applied to a copy of
m_new in place.
tests/flash/test_fast.py runs both loops and asks for identical bits, traces and counters.
Consecutive Q tiles are stacked and run as one loop, up to 2048 rows a step (plan.q_groups),
and the tiles, their kinds and the traced row come from plan.py's walk.
Leaves out: the merge form and float masks that widen S (forward.py runs those through
core.state as written), the schedule over Q tiles (forward.py).

Example: fused_q_tiles(plan, (0, 128), out5, lse5) fills the rows 0:256 of out5 and lse5
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from osm_cli.core.record import Step
from osm_cli.core.state import State, finalize, moved

from .plan import Counts, Plan, marked, q_rows, row_step, sink_step, tiles
from .rows import NUMPY, RowOps, row_ops


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

    def step(self, c: slice, s: np.ndarray, v: np.ndarray, threshold: float,
             p_round: Callable | None, ops: RowOps = NUMPY) -> None:
        """rescale_step(State(m, l, O), s, v) for the stacked Q tiles c, into m_new, l, O,
        alpha and block_max; s becomes P. Each line is the textbook's, with the array it
        writes named; ops does the row operations (rows.py: numpy's, or the same bits
        compiled)."""
        m, m_new, ref, alpha = self.m[c], self.m_new[c], self.ref[c], self.alpha[c]
        block_max, l, o, pv = self.block_max[c], self.l[c], self.o[c], self.pv[c]
        ops.block_max(s, block_max)
        if threshold > 0:
            np.add(m, threshold, out=m_new)
            moves = block_max > m_new
            np.maximum(m, block_max, out=m_new)
            np.copyto(m_new, m, where=~moves)
        else:
            np.maximum(m, block_max, out=m_new)
        np.copyto(ref, m_new)
        np.copyto(ref, 0, where=np.isneginf(m_new))  # state._ref: subtract 0 while m is -inf
        with np.errstate(over="ignore"):  # s - m below -max rounds to -inf, whose exp is 0
            np.exp(np.subtract(m, ref, out=alpha), out=alpha)
            ops.subtract(s, ref)
        np.exp(s, out=s)
        ops.row_sums(s, self.p_sum[c])
        np.add(np.multiply(l, alpha, out=l), self.p_sum[c], out=l)
        np.matmul(s if p_round is None else p_round(s), v, out=pv)
        ops.rescale_add(o, alpha, pv)


def fused_q_tiles(plan: Plan, group: tuple[int, ...], out5: np.ndarray, lse5: np.ndarray, *,
                  threshold: float = 0.0, p_round: Callable | None = None,
                  ops: RowOps | None = None) -> tuple[list[Step], Counts]:
    """forward._q_tile with the rescale form, fused, for the Q tiles of `group` (of one
    length, from plan.q_groups) stacked: their rows of out5 and lse5 written, the traced rows'
    steps and the counts returned (the same as _q_tile's for each tile, added up). A K/V tile
    hidden from the traced row's own Q tile shows as skipped in its trace. ops: the row
    operations (rows.py; None: plan_ops(plan))."""
    ops = plan_ops(plan) if ops is None else ops
    b, hk, g = plan.groups
    rows = [q_rows(plan, i0) for i0 in group]
    qt = np.stack([r[0] for r in rows])  # (tiles, B·Hkv, g·n, d); K and V broadcast over tiles
    n = rows[0][1]
    ats = [(qi, (c, *at)) for c, r in enumerate(rows) for qi, at in r[2]]
    st = _Tile(qt.shape[:-1], plan.v3.shape[-1], plan.accum)
    steps: list[Step] = []
    counts = Counts()
    for tile, s, v in tiles(plan, group, qt, st.s):
        bounds = tile.bounds
        c = slice(*(tile.seen or (0, 0)))  # the stacked Q tiles that see this K/V tile
        width = c.stop - c.start
        counts.skipped += len(group) - width
        seen = [(qi, at) for qi, at in ats if c.start <= at[0] < c.stop]
        for qi, at in ats:
            if not c.start <= at[0] < c.stop:
                m, l = st.m[at], st.l[at]
                steps.append(row_step(bounds, -np.inf, m, m, 1.0, l, l, st.o[at], True,
                                      query=qi))
        if s is None:
            continue
        l_prev = [st.l[at] for _, at in seen]
        st.step(c, s, v, threshold, p_round, ops)
        counts.computed += width
        counts.partial += tile.kinds[c].count("partial")
        counts.row_visits += n * width
        counts.rescales += int(np.count_nonzero(moved(st.m[c], st.m_new[c])))
        for (qi, at), lp in zip(seen, l_prev, strict=True):
            steps.append(replace(row_step(bounds, st.block_max[at], st.m[at], st.m_new[at],
                                          st.alpha[at], lp, st.l[at], st.o[at], query=qi),
                                 **marked(plan, tile.kinds[at[0]])))
        np.copyto(st.m[c], st.m_new[c])
    final = State(st.m, st.l, st.o)
    if plan.sinks is not None:
        final, step = sink_step(plan, final, n, ats)
        steps += step
    lse, o = finalize(final)
    for c, i0 in enumerate(group):
        out5[..., i0:i0 + n, :] = o[c].reshape(b, hk, g, n, out5.shape[-1])
        lse5[..., i0:i0 + n] = lse[c].reshape(b, hk, g, n)
    return steps, counts


def plan_ops(plan: Plan) -> RowOps:
    """The row operations for a plan's run (rows.row_ops by its count of scores)."""
    b, hk, g = plan.groups
    return row_ops(b * hk * g * plan.t * (plan.k1 - plan.k0), plan.score_mod is not None)


__all__ = ["fused_q_tiles", "plan_ops"]
