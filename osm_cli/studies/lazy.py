"""Lazy rescaling (FA4): how many rescales a threshold τ saves, and what it costs
(docs/numerics.md#lazy-rescale).

With τ > 0, core.state.rescale_step keeps a stale m while the block max exceeds it by at most τ, so
every exp(s − m) stays ≤ e^τ and the final O / l equals the eager one to rounding. This module
compares a lazy trace with the eager one. τ is in natural-log units (FA4's 8 in log2 is 5.545).
Leaves out: the update itself (core/state.py), printing (present/).

Example: lazy_report(np.array([0., 1., 2., 3.]), 1, 2.5).rescales_saved == 2
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.fold import Trace, online_softmax
from osm_cli.core.reference import max_abs_diff


@dataclass(frozen=True)
class LazyReport:
    """A lazy (τ) run of the traced row beside the eager (τ = 0) one."""

    threshold: float  # τ, natural log
    rescales: int  # steps of the lazy trace that rescaled the old state
    rescales_eager: int
    skipped: int  # steps where the block max passed m but m was kept
    max_excess: float  # largest block max − m in the lazy trace: exp(s − m) ≤ e^this (-inf: none)
    max_abs_diff: float  # max |p_lazy − p_eager| over every row

    @property
    def rescales_saved(self) -> int:
        return self.rescales_eager - self.rescales


def lazy_report(
    scores: np.ndarray, block: int, threshold: float, *, row: int = 0,
    order: np.ndarray | None = None, lazy: Trace | None = None,
) -> tuple[LazyReport, Trace]:
    """(report, eager trace) for a lazy run with τ = threshold; `lazy` reuses a run already made."""
    if lazy is None:
        lazy = online_softmax(scores, block, "rescale", row=row, order=order, threshold=threshold)
    eager = online_softmax(scores, block, "rescale", row=row, order=order)
    excess = [s.block_max - s.m for s in lazy.steps if np.isfinite(s.m)]
    return LazyReport(
        threshold,
        sum(s.rescaled for s in lazy.steps),
        sum(s.rescaled for s in eager.steps),
        sum(s.lazy_skipped for s in lazy.steps),
        float(max(excess, default=-np.inf)),
        max_abs_diff(lazy.probabilities, eager.probabilities),
    ), eager


__all__ = ["LazyReport", "lazy_report"]
