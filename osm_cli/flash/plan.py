"""The plan of a tiled run and the one walk over its tiles that every tile loop shares.

`make_plan` checks Q, K, V and the options once and fixes the tiles. This module is the only
place that decides how the tiles are walked: `q_groups` stacks consecutive Q tiles into one
loop step; `walk` visits the K/V tiles in order for such a stack and says, for each, its
bounds and its kind for every Q tile of the stack ('full', 'partial' or 'skip': the causal
band, the window and the user's mask decide, masks.tile_kind); `Plan.visible` and
`Plan.mask_tile` are the mask slices a partial tile applies; `Plan.rows_in` finds the traced
rows in a stack of rows. Every loop runs on these: osm's own forward (forward.py, the update
step of core.state as written), the fused forward (fast.py), the kernel presets' emulations
(precision/emulate.py) and the backward (backward.py); none decides a bound, a kind or a skip
itself. `tiles` is the walk with osm's scores made (masks.score_tile); `q_rows` one Q tile's
rows scaled and stacked for matmul; `row_step` a traced row's Step for one tile.
Leaves out: the update itself (core/state.py, fast.py, textbook.py), the loop's schedule and
the result (forward.py).

Example: plan = make_plan(q, k, v, ScoreOptions(causal=True), Tiling(), Hooks(), (0, 0, 0))
         [t.kinds for t in walk(plan, (0, 128))] -> [('full', 'full'), ('partial', 'full'), …]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from osm_cli.core.record import Step
from osm_cli.core.state import State, with_sink
from osm_cli.errors import InputError, ShapeError

from .masks import (
    Band,
    alibi_bias,
    check_mask,
    check_score_range,
    make_band,
    scale_q,
    score_tile,
    tile_kind,
    with_mask_mod,
)
from .mods import MaskMod, ScoreMod, TileMod
from .options import Hooks, ScoreOptions, Tiling, check_alibi_reach
from .shapes import bhnd_inputs, broadcast_mask, check_finite, check_traced, kv_head

O_SHOWN = 3  # components of O a trace step keeps
STACK_ROWS = 2048  # query rows a stacked step aims for; S is then 1 MiB of float32 (in L2)


@dataclass
class Counts:
    """What one Q tile's loop counted: K/V tiles computed (partial ones among them) and
    skipped, rescales, row visits."""

    computed: int = 0
    skipped: int = 0
    rescales: int = 0
    row_visits: int = 0
    partial: int = 0  # of the computed: tiles a mask is applied on (the others are full)

    def __iadd__(self, other: Counts) -> Counts:
        self.computed += other.computed
        self.partial += other.partial
        self.skipped += other.skipped
        self.rescales += other.rescales
        self.row_visits += other.row_visits
        return self


@dataclass(frozen=True)
class Plan:
    """Everything the tile loop needs, fixed once: the inputs grouped by kv head, the tiles,
    the masks, the state's dtype and where the traced row is."""

    q5: np.ndarray  # (B, Hkv, g, t, d): the g query heads that share a kv head
    k3: np.ndarray  # (B·Hkv, s, d)
    v3: np.ndarray  # (B·Hkv, s, dv)
    t: int
    bq: int
    bk: int
    k0: int
    k1: int
    starts: tuple[int, ...]  # first key of each K/V tile, in the order visited
    band: Band | None
    user_mask: np.ndarray | None  # (B, Hkv, g, t, s)
    accum: np.dtype
    scale: float
    traced: tuple  # (batch, head, query) or (-1, -1, -1): the first traced row
    at_row: tuple  # the traced rows' head as (batch, kv head, query head within its group)
    softcap: float | None = None  # scores become softcap·tanh(S / softcap)
    slopes: np.ndarray | None = None  # ALiBi: (B·Hkv, g), one slope per query head
    sinks: np.ndarray | None = None  # (B·Hkv, g): each query head's sink logit
    offset: int = 0  # s − t: where query i's diagonal meets the keys (ALiBi's distance)
    score_mod: ScoreMod | None = None  # FlexAttention's functions (mods.py)
    mask_mod: MaskMod | None = None
    queries: tuple[int, ...] = ()  # every traced query row of the traced head, as asked

    def bias(self, i0: int, i1: int, j0: int, j1: int, g0: int = 0,
             g1: int | None = None) -> np.ndarray | None:
        """ALiBi's bias for the rows i0:i1 of every query head of kv groups g0:g1 (stacked as
        the tiles are, g·n rows) and keys j0:j1; None without ALiBi."""
        if self.slopes is None:
            return None
        g = self.q5.shape[2]
        n = i1 - i0
        rows = np.tile(np.arange(i0, i1), g)
        per_row = np.repeat(self.slopes[g0:g1], n, axis=-1)  # (G', g·n)
        return alibi_bias(per_row, rows, j0, j1, self.offset, self.accum)

    def sink_rows(self, n: int, g0: int = 0, g1: int | None = None) -> np.ndarray | None:
        """The sink of every row of a tile stack of n queries per head: (G', g·n)."""
        return None if self.sinks is None else np.repeat(self.sinks[g0:g1], n, axis=-1)

    @property
    def groups(self) -> tuple[int, int, int]:
        b, hk, g = self.q5.shape[:3]
        return b, hk, g

    @property
    def q_starts(self) -> range:
        """The first query row of each Q tile."""
        return range(0, self.t, self.bq)

    def q_end(self, i0: int) -> int:
        """The end of the Q tile that starts at row i0 (the last one may be short)."""
        return min(self.t, i0 + self.bq)

    def visible(self, i0: int, i1: int, j0: int, j1: int) -> np.ndarray | None:
        """The band's keys seen by the rows i0:i1 of every query head of a kv group, stacked as
        the tiles are: (g·(i1 − i0), j1 − j0), True = seen (a partial tile's mask); None
        without a band."""
        if self.band is None:
            return None
        return np.tile(self.band.visible(i0, i1, j0, j1), (self.q5.shape[2], 1))

    def mask_tile(self, i0: int, i1: int, j0: int, j1: int, g0: int = 0,
                  g1: int | None = None, partial: bool = True) -> np.ndarray | None:
        """The user's mask for the rows i0:i1 and keys j0:j1 of kv groups g0:g1, stacked as the
        tiles are: (G', g·(i1 − i0), j1 − j0), and-ed with the mask_mod on a partial tile (a
        full one needs none); None without a mask."""
        b, hk, g = self.groups
        um = None
        if self.user_mask is not None:
            um = self.user_mask.reshape(b * hk, g, self.t, -1)[g0:g1, :, i0:i1, j0:j1]
            um = um.reshape(um.shape[0], g * (i1 - i0), j1 - j0)
        if self.mask_mod is None or not partial:
            return um
        idx = self.index(i0, i1, j0, j1, g0, g1)
        seen = np.broadcast_to(self.mask_mod(*idx), np.broadcast_shapes(*(x.shape for x in idx)))
        return with_mask_mod(um, seen.reshape(seen.shape[0], g * (i1 - i0), j1 - j0))

    def index(self, i0: int, i1: int, j0: int, j1: int, g0: int = 0,
              g1: int | None = None) -> tuple[np.ndarray, ...]:
        """FlexAttention's (b, h, q_idx, kv_idx) for the rows i0:i1 and keys j0:j1 of kv
        groups g0:g1, broadcastable to (G', g, i1 − i0, j1 − j0): the tiles' g·n rows with
        the g query heads of a group apart."""
        b, hk, g = self.groups
        grp = np.arange(b * hk)[g0:g1].reshape(-1, 1, 1, 1)
        heads = (grp % hk) * g + np.arange(g).reshape(1, g, 1, 1)
        return (grp // hk, heads, np.arange(i0, i1).reshape(1, 1, -1, 1),
                np.arange(j0, j1).reshape(1, 1, 1, -1))

    def tile_mod(self, i0: int, i1: int, j0: int, j1: int, g0: int = 0,
                 g1: int | None = None) -> TileMod | None:
        """The score_mod bound to a tile's indices (mods.TileMod); None without one."""
        if self.score_mod is None:
            return None
        return TileMod(self.score_mod, self.index(i0, i1, j0, j1, g0, g1), self.groups[2])

    def mod_kind(self, i0: int, i1: int, j0: int, j1: int) -> str:
        """The mask_mod's kind for a tile over every batch and head: 'skip' where it hides
        every key, 'full' where it hides none, else 'partial' ('full' without a mask_mod)."""
        if self.mask_mod is None:
            return "full"
        seen = self.mask_mod(*self.index(i0, i1, j0, j1))
        return "full" if seen.all() else "partial" if seen.any() else "skip"

    @property
    def traced_group(self) -> int:
        """The kv group (batch·Hkv + kv head) of the traced row; -1 without one."""
        if self.traced[0] < 0:
            return -1
        return self.at_row[0] * self.groups[1] + self.at_row[1]

    def rows_in(self, i0: int, i1: int) -> list[tuple[int, tuple[int, int]]]:
        """The traced rows in a stack of the rows i0:i1 of every head (g·(i1 − i0) rows a kv
        group, as q_rows and the tiles stack them): (query, (kv group, row)) for each, in the
        order asked; [] when none is there."""
        if self.traced[0] < 0:
            return []
        return [(qi, (self.traced_group, self.at_row[2] * (i1 - i0) + qi - i0))
                for qi in self.queries if i0 <= qi < i1]

    def tile_work(self, i0: int) -> int:
        """How many K/V tiles the Q tile at i0 computes (the causal band and window skip some;
        the user's mask is not looked at): for scheduling the heaviest tiles first."""
        if self.band is None:
            return len(self.starts)
        i1 = self.q_end(i0)
        return sum(self.band.tile(i0, i1, j0, j1) != "skip" for _, j0, j1 in self.kv_tiles)

    @property
    def kv_tiles(self) -> list[tuple[int, int, int]]:
        """(tile index, first key, stop) of every K/V tile, in the order visited."""
        return [((j0 - self.k0) // self.bk, j0, min(self.k1, j0 + self.bk)) for j0 in self.starts]


def make_plan(q, k, v, opts: ScoreOptions, tiling: Tiling, hooks: Hooks, trace_at) -> Plan:
    """Check the inputs and fix what every Q tile shares."""
    q4, k4, v4 = bhnd_inputs(q, k, v, opts.layout)
    b, hq, t, d = q4.shape
    hk, s, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    g = hq // hk
    bq, bk = tiling.blocks(d)
    accum = hooks.accum
    if accum is None:
        accum = np.float64 if np.float64 in (q4.dtype, k4.dtype, v4.dtype) else np.float32
    q_max, k_max, _ = (check_finite(x, name) for x, name in ((q4, "Q"), (k4, "K"), (v4, "V")))
    check_score_range(q4, k4, opts.scale_for(d), accum, q_max, k_max)
    check_alibi_reach(opts.alibi_slopes, t, s)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    mask = check_mask(opts.mask)
    user_mask = None
    if mask is not None:
        user_mask = broadcast_mask(mask, (b, hq, t, s)).reshape(b, hk, g, t, s)
    k0, k1 = (0, s) if tiling.keys is None else tiling.keys
    if not 0 <= k0 <= k1 <= s:
        raise InputError(f"key range {k0}:{k1} is outside 0:{s}")
    starts = list(range(k0, k1, bk))
    if tiling.order is not None:
        if sorted(int(i) for i in tiling.order) != list(range(len(starts))):
            raise InputError(f"order must be a permutation of the {len(starts)} K/V tiles")
        starts = [starts[int(i)] for i in tiling.order]
    if tiling.reverse:
        starts = starts[::-1]
    trace_at = check_traced(trace_at, (b, hq, t))
    tb, th, qs = trace_at if trace_at is not None else (-1, -1, ())
    ti = qs[0] if qs else -1
    slopes, sinks = (per_head(x, name, b, hq, hk, accum) for x, name in (
        (opts.alibi_slopes, "alibi_slopes"), (opts.sinks, "sinks")))
    # One matmul per kv head: the g query heads that share it are stacked as rows of one tile
    # (G = B·Hkv batches of g·n rows), so BLAS sees a few large 3-D products, not many small ones.
    return Plan(
        q4.reshape(b, hk, g, t, d), k4.reshape(b * hk, s, d), v4.reshape(b * hk, s, dv), t,
        bq, bk, k0, k1, tuple(starts), band, user_mask, np.dtype(accum), opts.scale_for(d),
        (tb, th, ti), (tb, kv_head(th, hq, hk), th % g), opts.softcap, slopes, sinks, s - t,
        opts.score_mod, opts.mask_mod, qs,
    )


def per_head(x, name: str, b: int, hq: int, hk: int, dtype) -> np.ndarray | None:
    """ALiBi slopes ((H,) or (B, H)) or sinks ((H,)) as (B·Hkv, g), one per query head of
    each kv group; a ShapeError when they do not fit Q's heads (docs/numerics.md#alibi)."""
    if x is None:
        return None
    x = np.asarray(x, dtype=np.float64)
    shapes = [(hq,)] + ([(b, hq)] if name == "alibi_slopes" else [])
    if x.shape not in shapes:
        want = " or ".join(str(sh) for sh in shapes)
        raise ShapeError(f"{name} has shape {tuple(x.shape)}; Q has {hq} heads (batch {b}), "
                         f"so it must be {want}")
    return np.broadcast_to(x, (b, hq)).reshape(b * hk, hq // hk).astype(dtype)


@dataclass(frozen=True)
class KVTile:
    """One K/V tile as a stack of Q tiles meets it: its bounds and its kind for each of them."""

    index: int
    j0: int
    j1: int
    kinds: tuple[str, ...]  # 'full', 'partial' or 'skip', per Q tile of the stack

    @property
    def bounds(self) -> tuple[int, int, int]:
        return self.index, self.j0, self.j1

    @property
    def seen(self) -> tuple[int, int] | None:
        """(c0, c1): the Q tiles stack[c0:c1] from the first to the last that see a key of this
        tile; None when it is hidden from all of them (skipped)."""
        seen = [c for c, kind in enumerate(self.kinds) if kind != "skip"]
        return (seen[0], seen[-1] + 1) if seen else None

    @property
    def kind(self) -> str:
        """The stack's kind: 'skip' when every Q tile skips it, 'full' when every one sees all
        of it, else 'partial'. For a band this is its kind for the stack's rows as one tile."""
        if all(k == "skip" for k in self.kinds):
            return "skip"
        return "full" if all(k == "full" for k in self.kinds) else "partial"


def walk(plan: Plan, stack: tuple[int, ...]) -> Iterator[KVTile]:
    """The K/V tiles in visiting order for the Q tiles whose first rows are `stack` (q_groups),
    each with its kind for every one of them (masks.tile_kind: the band by its bounds, the
    user's mask by that tile of it over all batches and heads)."""
    for index, j0, j1 in plan.kv_tiles:
        kinds = []
        for i0 in stack:
            i1 = plan.q_end(i0)
            um = None if plan.user_mask is None else plan.user_mask[..., i0:i1, j0:j1]
            kind = tile_kind(plan.band, um, i0, i1, j0, j1)
            if kind != "skip" and plan.mask_mod is not None:
                kind = _both(kind, plan.mod_kind(i0, i1, j0, j1))
            kinds.append(kind)
        yield KVTile(index, j0, j1, tuple(kinds))


def _both(a: str, b: str) -> str:
    """The kind of a tile under two masks at once (a key seen when both let it through)."""
    if "skip" in (a, b):
        return "skip"
    return "full" if a == b == "full" else "partial"


def q_groups(plan: Plan, *, ragged: bool = False) -> list[tuple[int, ...]]:
    """The Q tiles (their first rows) in the stacks that one loop step runs.

    Consecutive Q tiles are stacked up to STACK_ROWS rows a step over all heads (for one head
    of 128-row tiles, 16 of them): numpy then pays its per-call cost once for all of them,
    while each row stays its own softmax. Under a causal band or a window a K/V tile may be
    hidden from the first or last tiles of a stack, never from one between two that see it
    (walk's seen); a user's mask or mask_mod can hide it from any of them, so it runs one tile
    a step (and a score_mod, whose indices are one tile's).
    ragged=False (the fused forward, which stacks tiles on an axis of their own): tiles of one
    length, the short last one alone, and one tile a step under ALiBi (the tiles' bias is made
    for the stack's first rows). ragged=True (the kernel emulations, which stack rows): the
    last tile joins its stack, ALiBi included.
    """
    b, hk, g = plan.groups
    size = 1
    one = plan.user_mask is not None or plan.mask_mod is not None or plan.score_mod is not None
    if not one and (ragged or plan.slopes is None):
        size = max(1, STACK_ROWS // max(1, b * hk * g * plan.bq))
    starts = list(plan.q_starts)
    if ragged:
        return [tuple(starts[i:i + size]) for i in range(0, len(starts), size)]
    whole = [i0 for i0 in starts if i0 + plan.bq <= plan.t]
    short = [(i0,) for i0 in starts if i0 + plan.bq > plan.t]
    return [tuple(whole[i:i + size]) for i in range(0, len(whole), size)] + short


def q_rows(plan: Plan, i0: int) -> tuple[np.ndarray, int, list]:
    """The Q tile at i0 as (B·Hkv, g·n, d) rows, scaled (masks.scale_q); its row count n; and
    where the traced rows sit in it (plan.rows_in: (query, (batch·kv head, row)) each)."""
    b, hk, g = plan.groups
    i1 = plan.q_end(i0)
    d = plan.q5.shape[-1]
    qt = scale_q(plan.q5[..., i0:i1, :], plan.scale, plan.accum).reshape(b * hk, g * (i1 - i0), d)
    return qt, i1 - i0, plan.rows_in(i0, i1)


def tiles(plan: Plan, group: tuple[int, ...], qt: np.ndarray,
          out: Callable[[int], np.ndarray] | None = None) -> Iterator[tuple]:
    """walk with osm's scores: for the Q tiles whose first rows are `group` (all of one length;
    qt their rows stacked, (tiles, B·Hkv, g·n, d)), (tile, S, V rows) per K/V tile.

    tile is walk's KVTile; S = masks.score_tile for group[c0:c1] (tile.seen), (c1 − c0,
    B·Hkv, g·n, width), the band and mask_mod applied where one of them is partial; S and V
    are None where the tile is skipped. out(width), if given, is the buffer S is written into
    (score_tile's out), of the whole group.
    """
    n = qt.shape[-2] // plan.groups[2]
    one = plan.user_mask is not None or plan.mask_mod is not None or plan.score_mod is not None
    if one and len(group) > 1:
        raise ValueError("a user's mask, mask_mod or score_mod runs one Q tile at a time")
    for tile in walk(plan, group):
        j0, j1 = tile.j0, tile.j1
        if tile.seen is None:
            yield tile, None, None
            continue
        c0, c1 = tile.seen
        partial = "partial" in tile.kinds[c0:c1]
        vis = None
        if partial and plan.band is not None:  # each Q tile's own band
            vis = np.stack([plan.visible(i0, i0 + n, j0, j1) for i0 in group[c0:c1]])[:, None]
        um = plan.mask_tile(group[0], group[0] + n, j0, j1, partial=partial)
        kT = plan.k3[:, j0:j1, :].astype(plan.accum, copy=False).swapaxes(-1, -2)
        # ALiBi's bias depends on the rows: such runs stack no Q tiles (q_groups)
        bias = plan.bias(group[0], group[0] + n, j0, j1)
        s = score_tile(qt[c0:c1], kT, vis, None if um is None else um[None],
                       out=None if out is None else out(j1 - j0)[c0:c1],
                       softcap=plan.softcap, bias=bias,
                       mod=plan.tile_mod(group[0], group[0] + n, j0, j1))
        yield tile, s, plan.v3[:, j0:j1, :].astype(plan.accum, copy=False)


def marked(plan: Plan, kind: str) -> dict:
    """The kind a traced Step is marked with under a mask_mod (Step.kind, FlexAttention's
    block-mask kinds: "full" or "partial"; a skipped tile is masked); {} otherwise, so other
    runs' traces are as before."""
    return {} if plan.mask_mod is None or kind == "skip" else {"kind": kind}


def row_step(bounds: tuple, block_max, m_prev, m, alpha, l_prev, l, o: np.ndarray,
             masked: bool = False, sink: bool = False, query: int | None = None) -> Step:
    """A traced row's Step for one K/V tile, from its values (o: the row's O after it; query:
    which traced row it is)."""
    o = np.asarray(o, dtype=np.float64)
    return Step(*bounds, float(block_max), float(m_prev), float(m), float(alpha), float(l_prev),
                float(l), masked=masked, o=o[:O_SHOWN].copy(), o_norm=_norm(o), sink=sink,
                query=query)


def sink_step(plan: Plan, state: State, n: int, ats: list) -> tuple[State, list[Step]]:
    """The sinks joined to a Q tile's final state (core.state.with_sink), and each traced row's
    Step for it (block -1: no keys; block_max is the sink) for the rows in this tile (ats:
    (query, index) pairs). state's arrays are (…, B·Hkv, g·n): a stack of Q tiles shares the
    plan's sinks."""
    sinks = plan.sink_rows(n)
    new, alpha = with_sink(state, np.broadcast_to(sinks, state.m.shape))
    return new, [row_step((-1, 0, 0), sinks[at[-2:]], state.m[at], new.m[at], alpha[at],
                          state.l[at], new.l[at], new.o[at], sink=True, query=qi)
                 for qi, at in ats]


def _norm(x: np.ndarray) -> float:
    """‖x‖ without overflow on the way (x near 1e300): when the plain norm overflows, again
    scaled by its largest magnitude first."""
    with np.errstate(over="ignore"):
        plain = float(np.linalg.norm(x))
        top = float(np.abs(x).max(initial=0.0))
        if math.isfinite(plain) or not math.isfinite(top):
            return plain
        return top * float(np.linalg.norm(x / top))  # beyond float64 itself: inf, shown so


__all__ = [
    "O_SHOWN", "STACK_ROWS", "Counts", "KVTile", "Plan", "make_plan", "marked", "per_head",
    "q_groups",
    "q_rows", "row_step", "sink_step", "tiles", "walk",
]
