"""The records `attention` and `attention_backward` return, nested: the tensors at the top (out,
lse; dq, dk, dv, delta, dsink) and beside them the run as four small frozen records, the same
classes in both where they mean the same:

- `Shapes`: the shapes of Q, K and V as given.
- `RunOptions`: what was asked: softmax_scale, causal and its alignment, the window, the mask,
  the kernels' inputs (softcap, ALiBi, sinks, score_mod / mask_mod, a packed batch), the kernel
  preset and its split-KV, the masked rows' LSE convention.
- `Tiles`: block_q, block_k and how many tiles were computed, skipped (the mask hides them),
  partial (a mask applied on them) and walked in all.
- `Counters`: rescales (a finite running max moved), fully masked rows, (row, tile) visits.
- `AttentionTrace`, `BackwardTrace`: where the trace is (batch, head, first query), every
  traced query row and its steps (the first row's as `steps`), the forward's outputs of those
  rows; the backward's traced key and its kv head.

Every record is built by keyword only. The flat names of osm 0.2 (`res.tiles_computed`,
`res.scale`, `res.traced`, …) still read, as deprecated properties (one release), each saying
its new place; `res.trace` is now the trace record, whose steps are `res.trace.steps`.

Leaves out: computing any of it (forward.py, backward.py, precision/), showing it (notebook.py,
present/).

Example: attention(q, k, v, causal=True).tiles.skipped
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from osm_cli.core.notebook import Notebook
from osm_cli.core.record import GradStep, Step


@dataclass(frozen=True, kw_only=True)
class Shapes:
    """The shapes of Q, K and V as given (in their layout)."""

    q: tuple
    k: tuple
    v: tuple


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What the run was asked (docs/numerics.md#scale, #causal-alignment, #masks, #softcap,
    #alibi, #sinks): the options that change the scores, in a few words each."""

    softmax_scale: float  # the score scale, 1/√d unless given (never α: a step's `alpha`)
    causal: bool = False
    causal_align: str = "bottom-right"
    window: tuple | None = None  # (left, right); a negative side is unbounded
    mask: str = "none"  # the user's mask in a few words (masks.mask_about)
    softcap: float | None = None
    alibi: bool = False
    sinks: bool = False
    mods: str = ""  # the score_mod and mask_mod in a few words (mods.about_mods); "" for none
    batch: str = ""  # a packed or paged batch in a few words (packed.about); "" for dense
    kernel: str = ""  # the kernel preset whose loop ran (precision/presets.py); "" osm's own
    splits: int = 1  # key ranges run apart and merged (FA2's split-KV kernel)
    masked_lse: str = "neg-inf"  # the LSE of a fully masked row, by name (forward)
    one_shot: bool = False  # plain attention (precision naive): no tiles


@dataclass(frozen=True, kw_only=True)
class Tiles:
    """The tiling and the tiles walked: (Q tile, K/V tile) pairs over every batch and kv head
    group counted once (docs/numerics.md#tile-skipping)."""

    block_q: int
    block_k: int
    computed: int = 0
    skipped: int = 0  # the mask hides the whole tile: never computed
    partial: int = 0  # of computed: those a mask was applied on (mask_mod's count)
    total: int = 0


@dataclass(frozen=True, kw_only=True)
class Counters:
    """What the loop counted over all rows; None: not counted (the backward has no running
    max to rescale and does not count visits)."""

    masked_rows: int = 0  # query rows every key is hidden from (forward: LSE by masked_lse)
    rescales: int | None = None  # (row, tile) updates that moved a finite running max
    row_visits: int | None = None  # (query row, K/V tile) pairs computed (FA1 Prop. 4's count)


@dataclass(frozen=True, kw_only=True)
class Traced:
    """The traced query rows: `at` = (batch, head, first query), `queries` every traced row of
    that head as asked, `rows` each one's steps in that order, `steps` the first row's."""

    at: tuple = (0, 0, 0)
    queries: tuple[int, ...] = ()
    rows: tuple[tuple, ...] = ()

    @property
    def steps(self) -> tuple:
        """The first traced row's steps (rows[0]); () without a trace."""
        return self.rows[0] if self.rows else ()


@dataclass(frozen=True, kw_only=True)
class AttentionTrace(Traced):
    """The forward's traced rows: each row's Steps (one per K/V tile, then a sink) and their
    outputs O / l, (rows, dv)."""

    rows: tuple[tuple[Step, ...], ...] = ()
    outs: np.ndarray | None = None

    @property
    def out(self) -> np.ndarray | None:
        """The first traced row's output (outs[0])."""
        return None if self.outs is None else self.outs[0]

    # osm 0.2's `res.trace` was the first row's steps: read as that sequence, with a warning
    def __len__(self) -> int:
        return len(_old_steps(self))

    def __getitem__(self, i):
        return _old_steps(self)[i]

    def __iter__(self):
        return iter(_old_steps(self))


def _old_steps(tr: AttentionTrace) -> tuple:
    warnings.warn("Attention.trace is the trace record since osm 0.3: its steps are "
                  "trace.steps", DeprecationWarning, stacklevel=3)
    return tr.steps


@dataclass(frozen=True, kw_only=True)
class BackwardTrace(Traced):
    """The backward's traces: the query rows' GradSteps over the K/V tiles (dQ_i), and the key
    row `key` of kv head `kv_head` (the one the traced query head reads), its GradSteps over
    the Q tiles (dK_j, dV_j, summed over the group's g query heads)."""

    rows: tuple[tuple[GradStep, ...], ...] = ()
    key: int = 0
    kv_head: int = 0
    group: int = 1  # query heads per kv head (GQA's g)
    key_steps: tuple[GradStep, ...] = ()


def _deprecated(cls, flat: dict[str, str]):
    """Add osm 0.2's flat names to cls as read-only properties that warn and read the nested
    field ("tiles.computed")."""
    def prop(name: str, path: str):
        sub, attr = path.split(".")

        def get(self):
            warnings.warn(f"{cls.__name__}.{name} is deprecated since osm 0.3: use "
                          f".{path}", DeprecationWarning, stacklevel=2)
            return getattr(getattr(self, sub), attr)

        return property(get, doc=f"Deprecated (osm 0.3): .{path}")

    for name, path in flat.items():
        setattr(cls, name, prop(name, path))
    return cls


_SHARED = {
    "scale": "options.softmax_scale", "shape_q": "shapes.q", "shape_k": "shapes.k",
    "shape_v": "shapes.v", "causal": "options.causal", "align": "options.causal_align",
    "window": "options.window", "mask": "options.mask", "softcap": "options.softcap",
    "alibi": "options.alibi", "sinks": "options.sinks", "mods": "options.mods",
    "batch": "options.batch", "block_q": "tiles.block_q", "block_k": "tiles.block_k",
    "tiles_computed": "tiles.computed", "tiles_skipped": "tiles.skipped",
    "tiles_partial": "tiles.partial", "tiles_total": "tiles.total",
    "masked_rows": "counters.masked_rows", "traced": "trace.at", "queries": "trace.queries",
}


@dataclass(frozen=True, kw_only=True)
class Attention(Notebook):
    """What `attention` returns: out and lse, and the run (in Jupyter, as the summary and the
    traced row's tile table: notebook.py)."""

    out: np.ndarray
    lse: np.ndarray
    shapes: Shapes
    options: RunOptions
    tiles: Tiles
    counters: Counters
    trace: AttentionTrace = AttentionTrace()

    def _tables(self):
        from .notebook import attention_tables

        return attention_tables(self)


_deprecated(Attention, {
    **_SHARED, "masked_lse": "options.masked_lse", "kernel": "options.kernel",
    "splits": "options.splits", "one_shot": "options.one_shot",
    "rescales": "counters.rescales", "row_visits": "counters.row_visits",
    "trace_out": "trace.out", "traces": "trace.rows", "trace_outs": "trace.outs"})


@dataclass(frozen=True, kw_only=True)
class Backward(Notebook):
    """What `attention_backward` returns: the gradients, D, the forward's O and LSE it used,
    and the run (in Jupyter, as the summary and the two traces' tables: notebook.py)."""

    dq: np.ndarray  # shaped like q
    dk: np.ndarray  # shaped like k (GQA: summed over the query heads that read each kv head)
    dv: np.ndarray  # shaped like v
    delta: np.ndarray  # D = rowsum(dO ∘ O), shaped like the LSE
    out: np.ndarray  # the forward's O the backward used (osm's own, or the kernel's given)
    lse: np.ndarray  # and its LSE
    own_forward: bool  # out and lse came from osm's own forward (not given)
    dsink: np.ndarray | None = None  # with sinks: dL/dsink per query head, (H,)
    shapes: Shapes
    options: RunOptions
    tiles: Tiles
    counters: Counters
    trace: BackwardTrace = BackwardTrace()

    def _tables(self):
        from .notebook import backward_tables

        return backward_tables(self)


_deprecated(Backward, {
    **_SHARED, "key_trace": "trace.key_steps", "query_trace": "trace.steps",
    "query_traces": "trace.rows", "traced_key": "trace.key", "kv_head": "trace.kv_head",
    "group": "trace.group"})

__all__ = ["Attention", "AttentionTrace", "Backward", "BackwardTrace", "Counters", "RunOptions",
           "Shapes", "Tiles", "Traced"]
