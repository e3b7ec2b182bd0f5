"""Where a judged tensor fails (osm check): its rows over the bound summarised by structure.

`locate` turns a (B, H, rows) boolean of the rows over the bound into a `Location` record:
which batches, heads and (varlen) sequences, which Q tiles (K/V tiles for dK, dV) at the
kernel's block size or at 64 and 128 rows when unknown, and the patterns a kernel engineer
looks for ("every other Q tile of 64 rows", "the last K/V tile", "the first 3 query rows",
"rows that see no key"). `tile_map` attributes one head's failing Q tiles to the K/V tile whose
contribution explains the error (a tile counted twice or dropped moves a row along that tile's
own direction w_j·(O_j − O)), as a matrix of marks the present layer draws.

Leaves out: judging (check.py, rule.py), naming conventions (probe.py), printing (present/).

Example: locate(over, "out", rows="query", block=64).summary -> "every other Q tile of 64 rows …"
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCKS = (64, 128)  # the tile sizes tried when the kernel's are unknown
MAP_LIMIT = 64  # tiles per side a tile map shows


@dataclass(frozen=True)
class Location:
    """One tensor's failing rows, by structure. rows: "query" or "key"."""

    tensor: str
    rows: str
    rows_over: int
    total_rows: int
    batches: tuple[int, ...]  # batches with a failing row
    n_batches: int
    heads: tuple[tuple[int, int], ...]  # (batch, head) with a failing row
    n_heads: int  # heads per batch
    sequences: tuple[int, ...] | None  # varlen: the failing sequences (None: dense)
    n_sequences: int
    block: int  # the tile size the tiles are counted at
    tiles: tuple[int, ...]  # failing tiles (query tiles for "query" rows, K/V tiles for "key")
    n_tiles: int
    patterns: tuple[str, ...]  # the structure found, in words, most telling first

    @property
    def summary(self) -> str:
        """One line: the patterns, then the heads (the JSON's and the fail line's `where`)."""
        return "; ".join(self.patterns)


@dataclass(frozen=True)
class TileMap:
    """The traced head's (Q tile, K/V tile) pairs: marks[i][j] is " " (a tile no row of Q tile
    i sees), "." (seen, fine), "#" (the K/V tile that explains Q tile i's error), "~" (Q tile i
    fails but no single K/V tile explains it)."""

    batch: int
    head: int
    block_q: int
    block_k: int
    marks: tuple[str, ...]
    explained: tuple[tuple[int, int], ...]  # the "#" pairs
    patterns: tuple[str, ...]


def _ranges(xs) -> str:
    """'1, 3–5, 9' for a sorted list of ints (at most 8 pieces, then '…')."""
    xs = sorted(int(x) for x in xs)
    parts, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}–{xs[j]}")
        i = j + 1
    return ", ".join(parts[:8]) + (", …" if len(parts) > 8 else "")


def _tiles_phrase(tiles: list[int], n: int, block: int, kind: str) -> str:
    """The failing tiles of n, in words: every, every other, the first, the last, or a list."""
    what = f"{kind} tile{'s' if len(tiles) != 1 else ''} of {block} rows"
    if len(tiles) == n:
        return f"every {kind} tile ({n} of {block} rows)"
    if len(tiles) >= 2 and n >= 4 and tiles == list(range(tiles[0], n, 2)) and tiles[0] < 2:
        return f"every other {kind} tile of {block} rows (tiles {_ranges(tiles[:3])}, …)"
    if tiles == [n - 1]:
        return f"the last {kind} tile of {block} rows (tile {n - 1} of {n})"
    if tiles == [0]:
        return f"the first {kind} tile of {block} rows (of {n})"
    return f"{what} {_ranges(tiles)} (of {n})"


def _pick_block(idx: np.ndarray, size: int, block: int | None) -> int:
    """The kernel's block, or of 64 and 128 the one whose failing tiles are fullest (failing
    rows / rows of the failing tiles; the larger on a tie)."""
    if block:
        return int(block)
    best, fill = BLOCKS[0], -1.0
    for b in BLOCKS:
        tiles = np.unique(idx // b)
        rows = sum(min(size, (t + 1) * b) - t * b for t in tiles)
        f = len(idx) / rows if rows else 0.0
        if f >= fill - 1e-12:
            best, fill = b, f
    return best


def locate(over: np.ndarray, tensor: str, *, rows: str = "query", block: int | None = None,
           cu_seqlens: np.ndarray | None = None, no_key: np.ndarray | None = None) -> Location:
    """Summarise `over` ((B, H, rows) bool: rows over the bound) by structure.

    rows: "query" (out, lse, dq) or "key" (dk, dv). block: the kernel's tile size along those
    rows (None: 64 or 128, the fuller). cu_seqlens: a varlen batch's offsets (over is then
    (1, H, total)): rows become (sequence, row). no_key: (B, H, rows) bool of the query rows
    that see no key (fully masked), named as such when they are the failing ones.
    """
    over = np.asarray(over, dtype=bool)
    b_n, h_n, r_n = over.shape
    heads = tuple((int(b), int(h)) for b, h in zip(*np.nonzero(over.any(axis=-1)), strict=True))
    batches = tuple(sorted({b for b, _ in heads}))
    kind = "Q" if rows == "query" else "K/V"
    idx = np.nonzero(over.any(axis=(0, 1)))[0]
    seqs, n_seq, patterns = None, 0, []
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        n_seq = len(cu) - 1
        seq_of = np.searchsorted(cu, idx, side="right") - 1
        seqs = tuple(int(s) for s in np.unique(seq_of))
        local = idx - cu[seq_of]
        size = int(np.diff(cu).max(initial=0))
        if seqs:
            full = all(np.count_nonzero(seq_of == s) == cu[s + 1] - cu[s] for s in seqs)
            patterns.append(f"sequence{'s' if len(seqs) > 1 else ''} {_ranges(seqs)} of "
                            f"{n_seq}" + (f" (every {rows} row)" if full else ""))
        idx_local = np.unique(local)
    else:
        idx_local, size = idx, r_n
    blk = _pick_block(idx_local, size, block)
    tiles = sorted({int(t) for t in idx_local // blk})
    n_tiles = max(1, -(-size // blk))
    if no_key is not None and idx.size:
        nk = np.asarray(no_key, dtype=bool)
        if nk.any() and not (over & ~nk).any():
            patterns.insert(0, f"rows that see no key ({int(np.count_nonzero(over))} of "
                               f"{int(np.count_nonzero(nk))} such rows)")
    if idx_local.size and not (cu_seqlens is not None and patterns and "every" in patterns[-1]):
        first = idx_local[0] == 0 and idx_local[-1] == len(idx_local) - 1
        last = idx_local[-1] == size - 1 and idx_local[0] == size - len(idx_local)
        if first and len(idx_local) < min(blk, size):
            patterns.append(f"the first {len(idx_local)} {rows} rows")
        elif last and len(idx_local) < min(blk, size):
            patterns.append(f"the last {len(idx_local)} {rows} rows")
        elif len(idx_local) < size and len(tiles) == n_tiles:
            patterns.append(f"{len(idx_local)} of {size} {rows} rows, in every {kind} tile of "
                            f"{blk} rows ({n_tiles})")
        elif len(idx_local) < size:
            patterns.append(_tiles_phrase(tiles, n_tiles, blk, kind))
            if rows == "key":
                patterns.append(f"keys {_ranges(idx_local)}")
        else:
            patterns.append(f"every {rows} row")
    if idx.size:
        patterns.append(_heads_phrase(heads, b_n, h_n))
    return Location(tensor, rows, int(np.count_nonzero(over)), int(over.size), batches, b_n,
                    heads, h_n, seqs, n_seq, blk, tuple(tiles), n_tiles, tuple(patterns))


def _heads_phrase(heads, b_n: int, h_n: int) -> str:
    """'every head (8)', 'every head (8) of every batch (2)', 'head 3 of 8',
    'heads 1, 5 of 8 in batches 0–1 of 2': each count beside what it counts."""
    hs = sorted({h for _, h in heads})
    bs = sorted({b for b, _ in heads})
    if len(heads) == b_n * h_n:
        return f"every head ({h_n})" + (f" of every batch ({b_n})" if b_n > 1 else "")
    what = f"head{'s' if len(hs) > 1 else ''} {_ranges(hs)} of {h_n}"
    if b_n > 1:
        what += f" in batch{'es' if len(bs) > 1 else ''} {_ranges(bs)} of {b_n}"
    return what


def tile_map(q, k, v, out, ref, over_rows, *, scale: float, visible, block_q: int,
             block_k: int, batch: int = 0, head: int = 0, share: float = 0.75) -> TileMap:
    """Which K/V tile explains each failing Q tile of one head (float64 (t, d), (s, d), (s, dv)
    arrays q, k, v, the kernel's out and the reference ref (t, dv); over_rows (t,) bool).

    Counting K/V tile j twice, or dropping it, moves row i along D_j = w_j·(O_j − ref_i), w_j
    the tile's share of the row's softmax and O_j its normalised partial output. A failing Q
    tile's error is attributed to tile j when projecting each row's error onto D_j leaves at
    most 1 − `share` of the error's energy. visible(i0, i1) -> (i1 − i0, s) bool or None.
    """
    t, s = q.shape[0], k.shape[0]
    nq, nk = max(1, -(-t // block_q)), max(1, -(-s // block_k))
    marks, explained = [], []
    for qi in range(min(nq, MAP_LIMIT)):
        i0, i1 = qi * block_q, min(t, (qi + 1) * block_q)
        vis = None if visible is None else visible(i0, i1)
        if vis is None:
            seen = [True] * nk
        else:
            cols = np.pad(vis.any(axis=0), (0, nk * block_k - s))
            seen = [bool(x) for x in cols.reshape(nk, block_k).any(axis=1)]
        row = ["." if x else " " for x in seen[:MAP_LIMIT]]
        fail = over_rows[i0:i1]
        if fail.any():
            row = ["~" if x else " " for x in seen[:MAP_LIMIT]]
            sc = (q[i0:i1][fail] * scale) @ k.T
            if vis is not None:
                sc = np.where(vis[fail], sc, -np.inf)
            j = _explaining_tile(sc, v, out[i0:i1][fail] - ref[i0:i1][fail],
                                 ref[i0:i1][fail], block_k, seen, share)
            if j is not None:
                explained.append((qi, j))
                row = ["." if x else " " for x in seen[:MAP_LIMIT]]
                if j < MAP_LIMIT:
                    row[j] = "#"
        marks.append("".join(row))
    return TileMap(batch, head, block_q, block_k, tuple(marks), tuple(explained),
                   _map_patterns(explained, nk, visible, block_q, block_k, t))


def _explaining_tile(sc, v, err, ref, block_k: int, seen, share: float) -> int | None:
    """The K/V tile j whose direction D_j = w_j·(O_j − ref) explains `err` (rows × dv) best,
    if it leaves at most 1 − share of its energy; None otherwise. Least squares per row: what
    D_j leaves of e is |e|² − (e·D_j)² / |D_j|², for every tile at once."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = sc.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(sc - m)
        total = p.sum(axis=-1, keepdims=True)
    energy = float((err * err).sum())
    if not energy or not np.isfinite(energy):
        return None
    r, s = p.shape
    nk = len(seen)
    pad = nk * block_k - s
    pp = np.pad(p, ((0, 0), (0, pad))).reshape(r, nk, block_k)
    vv = np.pad(v, ((0, pad), (0, 0))).reshape(nk, block_k, v.shape[-1])
    w = pp.sum(axis=-1)  # (rows, nk)
    with np.errstate(invalid="ignore", divide="ignore"):
        oj = np.einsum("rjk,jkd->rjd", pp, vv) / np.where(w > 0, w, 1.0)[..., None]
        d = (w / total)[..., None] * (oj - ref[:, None, :])
        dd = (d * d).sum(axis=-1)
        ed = np.einsum("rd,rjd->rj", err, d)
        gain = np.where(dd > 0, ed * ed / np.where(dd > 0, dd, 1.0), 0.0).sum(axis=0)
    gain = np.where(np.asarray(seen, dtype=bool), gain, -np.inf)
    best = int(np.argmax(gain))
    return best if energy - gain[best] <= (1 - share) * energy else None


def _map_patterns(explained, nk: int, visible, block_q: int, block_k: int, t: int) -> tuple:
    """The tile map in words: 'the last K/V tile', 'the diagonal K/V tile', 'K/V tile 3'."""
    if not explained:
        return ()
    js = sorted({j for _, j in explained})
    if js == [nk - 1]:
        return (f"the last K/V tile of {block_k} rows (tile {nk - 1}) explains the error",)
    if js == [0]:
        return (f"the first K/V tile of {block_k} rows explains the error",)
    if visible is not None:
        last_seen = {}
        for qi, _ in explained:
            i0, i1 = qi * block_q, min(t, (qi + 1) * block_q)
            vis = visible(i0, i1)
            cols = np.nonzero(vis.any(axis=0))[0] if vis is not None else [nk * block_k - 1]
            last_seen[qi] = int(cols[-1]) // block_k if len(cols) else -1
        if all(last_seen[qi] == j for qi, j in explained):
            return ("each failing Q tile's own last (diagonal) K/V tile explains its error",)
    return (f"K/V tile{'s' if len(js) > 1 else ''} {_ranges(js)} of {block_k} rows explain "
            "the error",)


__all__ = ["BLOCKS", "Location", "TileMap", "locate", "tile_map"]
