"""The numbers a backward tile shows under --explain (core.record.GradDetail), taken from the
tile's own update: P, dP, dS on the traced query row's keys or the traced key's column, D of
those rows, and the gradients' leading components before and after the tile (score scale in,
as they are finally written).

Leaves out: the loop (backward.py), the lines (reports/explain.py).
"""

from __future__ import annotations

import numpy as np

from osm_cli.core.record import DETAIL_SHOWN, GradDetail

from .plan import O_SHOWN, Plan


def _head(x) -> np.ndarray:
    return np.array(x, dtype=np.float64).ravel()[:DETAIL_SHOWN]


def _lead(x) -> np.ndarray:
    return np.array(x, dtype=np.float64)[..., :O_SHOWN]


def query_detail(plan: Plan, up, d_row: float, r: int, at: int, dq_before, dq_after,
                 keys: int) -> GradDetail:
    """Traced query row r (of kv group `at` in the tile's stack) over the tile's keys: its P,
    dP, dS, its D, and dQ_i's contribution scale·dS·K_j with dQ_i after it."""
    dq_add = plan.scale * _lead(up.dq[at, r])
    return GradDetail(
        _head(up.p[at, r]), _head(up.dp[at, r]) if up.dp is not None else np.array([]),
        np.array([d_row], dtype=np.float64), _head(up.ds[at, r]), keys,
        (("dQ_i", _lead(dq_before), dq_add, _lead(dq_after)),), factor=_factor(plan))


def key_rows(plan: Plan, dk_j, dv_j, at: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """dK_j and dV_j of key c of the tile as written (scaled, summed over the kv group's query
    heads): their leading components, to take before and after a Q tile."""
    return (plan.scale * _lead(dk_j[at, :, c].sum(axis=0)), _lead(dv_j[at, :, c].sum(axis=0)))


def key_detail(plan: Plan, up, d_rows, at: int, c: int, head: int, n: int, before: tuple,
               after: tuple) -> GradDetail:
    """The traced key's column c over the Q tile's n rows of query head `head` (within its kv
    group: rows head·n to head·n + n of the stack): P, dP, dS, the rows' D, and dV_j, dK_j
    before, the tile's share (after − before: a kernel chains its accumulators) and after."""
    rows = slice(head * n, (head + 1) * n)
    (dk0, dv0), (dk1, dv1) = before, after
    return GradDetail(
        _head(up.p[at, rows, c]), _head(up.dp[at, rows, c]) if up.dp is not None else
        np.array([]), _head(d_rows), _head(up.ds[at, rows, c]), n,
        (("dV_j", dv0, dv1 - dv0, dv1), ("dK_j", dk0, dk1 - dk0, dk1)),
        heads=plan.groups[2], factor=_factor(plan))


def _factor(plan: Plan) -> bool:
    """dS carries a score transform's derivative (softcap's 1 − tanh², a score_mod's)."""
    return plan.softcap is not None or plan.score_mod is not None


__all__ = ["key_detail", "key_rows", "query_detail"]
