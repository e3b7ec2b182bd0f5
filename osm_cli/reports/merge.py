"""What `osm merge` reports of a merge of split-KV partials: the merge, each split summarised
(empty rows, FA2's +inf markers, LSE and weight ranges) and one row in detail.

Leaves out: the merge itself (core/merge.py), files (io/), tables and JSON (present/).

Example: merge_report([o0, o1], [lse0, lse1]).empty_rows
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.core.merge import Merged, merge_detail, stack_parts
from osm_cli.errors import InputError


@dataclass(frozen=True)
class SplitStat:
    """One split of a merge, summarised over its rows (what `osm merge` tabulates)."""

    split: int
    rows: int
    empty: int  # rows where this split saw no key (LSE -inf or +inf)
    pos_inf: int  # of which written as +inf (FA2's marker)
    lse_min: float | None  # over the non-empty rows (None when none: JSON's null, never "nan")
    lse_max: float | None
    weight_min: float | None  # exp(LSE_s − L) over rows with any visible key (None when none)
    weight_max: float | None
    weight_mean: float | None


def split_stats(merged: Merged, lses) -> tuple[SplitStat, ...]:
    """Per split: empty rows, +inf markers, LSE range and weight range. lses: the LSEs as given."""
    lse = np.asarray(stack_parts(lses, "LSEs"), dtype=np.float64)
    live = ~np.isneginf(merged.lse)  # rows that some split saw
    stats = []
    for n in range(lse.shape[0]):
        seen = lse[n][~merged.empty[n]]
        w = merged.weights[n][live]
        stats.append(SplitStat(
            n, int(lse[n].size), int(merged.empty[n].sum()), int(np.isposinf(lse[n]).sum()),
            float(seen.min()) if seen.size else None, float(seen.max()) if seen.size else None,
            float(w.min()) if w.size else None, float(w.max()) if w.size else None,
            float(w.mean()) if w.size else None,
        ))
    return tuple(stats)


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
        raise InputError(f"`row` {row} is out of range; the partials have {merged.lse.size} "
                         "row(s)")
    flat_lse = merged.lse.reshape(-1)
    return MergeReport(
        merged, stats, row, tuple(float(np.asarray(x).reshape(-1)[row]) for x in lses),
        tuple(float(w) for w in merged.weights.reshape(len(stats), -1)[:, row]),
        float(flat_lse[row]), merged.out.reshape(flat_lse.size, -1)[row],
        int(np.isneginf(flat_lse).sum()),
    )


__all__ = ["MergeReport", "SplitStat", "merge_report", "split_stats"]
