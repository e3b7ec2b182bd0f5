"""Packed and paged inputs, as the kernels take them, cut into the dense problems osm runs one
sequence at a time (docs/numerics.md#varlen, #paged-kv).

- varlen (flash_attn_varlen_func): the batch's sequences end to end, Q (total_q, H, d) and K/V
  (total_k, Hkv, d); cu_seqlens_q / cu_seqlens_k, integers of length B + 1 starting at 0,
  put sequence b at rows cu[b]:cu[b + 1]; seqused_k, if given, limits the keys each one uses.
- paged KV (flash_attn_with_kvcache, FlashInfer): K/V caches of pages (num_pages, page_size,
  Hkv, d) ("nhd"; FlashInfer's "hnd" is (num_pages, Hkv, page_size, d)); page_table
  (B, max_pages) lists each sequence's pages in order; seqused_k its used length.
- Q may be packed (with cu_seqlens_q) or batched (B, t, H, d); K/V packed, paged or batched
  (B, s, Hkv, d), whose keys seqused_k may limit too.
Causal and the window apply per sequence, bottom-right against the keys it uses. A sequence
with queries and no keys has fully masked rows; one without queries has no rows at all.

`plan_packing` checks everything once; `gather` gives one sequence as dense (1, H, n, d)
arrays; the scatter functions put per-sequence results back in the packed shapes. Leaves out:
running anything (forward.py, backward.py and reference.py call these).

Example: plan_packing(q, k, v, Packing(cu_seqlens_q=cu, cu_seqlens_k=cu)).seqs[1].t
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from osm_cli.errors import InputError, ShapeError

from .names import KV_LAYOUTS


@dataclass(frozen=True)
class Packing:
    """How a batch is laid out, in the kernels' own argument names (None: not used)."""

    cu_seqlens_q: np.ndarray | None = None
    cu_seqlens_k: np.ndarray | None = None
    seqused_k: np.ndarray | None = None
    page_table: np.ndarray | None = None
    kv_layout: str = "nhd"  # a paged cache's: nhd (num_pages, page_size, Hkv, d) or hnd

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self)
                   if f.name != "kv_layout")


@dataclass(frozen=True)
class Seq:
    """One sequence as a dense problem: its query rows, and the key rows of the K/V storage
    (flattened to (rows, Hkv, d)) it reads, in key order; pages: the physical page of each."""

    index: int
    q_rows: np.ndarray  # rows of Q flattened to (rows, H, d)
    k_rows: np.ndarray
    pages: np.ndarray | None = None

    @property
    def t(self) -> int:
        return len(self.q_rows)

    @property
    def s(self) -> int:
        return len(self.k_rows)


@dataclass(frozen=True)
class Packed:
    """A checked packed batch: its sequences, and how Q and K/V are stored."""

    seqs: tuple[Seq, ...]
    q_shape: tuple  # Q as given: (total_q, H, d) packed, or (B, t, H, d)
    kv_shape: tuple  # K as given
    v_shape: tuple
    q_packed: bool
    kv_mode: str  # "packed", "paged" or "batched"
    kv_layout: str
    page_size: int = 0


def _ints(x, name: str, ndim: int) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "iu" or a.ndim != ndim:
        what = "a vector" if ndim == 1 else "a matrix"
        raise InputError(f"{name} must be {what} of integers; it has dtype {a.dtype} and shape "
                         f"{tuple(a.shape)}")
    return a.astype(np.int64)


def _cu(cu, name: str, total: int) -> np.ndarray:
    """cu_seqlens checked: starting at 0, non-decreasing, ending at the packed length."""
    c = _ints(cu, name, 1)
    if c.size < 1 or c[0] != 0:
        raise InputError(f"{name} must start at 0; it starts at {c[0] if c.size else 'nothing'}")
    if (np.diff(c) < 0).any():
        at = int(np.flatnonzero(np.diff(c) < 0)[0])
        raise InputError(f"{name} must be non-decreasing; it falls from {c[at]} to {c[at + 1]} "
                         f"at index {at + 1}")
    if c[-1] != total:
        raise InputError(f"{name} ends at {c[-1]}, but the packed tensor has {total} rows")
    return c


def plan_packing(q, k, v, packing: Packing) -> Packed:
    """Check a packed or paged batch against Q, K, V and cut it into its sequences."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    p = packing
    if p.kv_layout not in KV_LAYOUTS:
        raise InputError(f"kv layout must be one of {', '.join(KV_LAYOUTS)}, not {p.kv_layout!r}")
    if p.page_table is not None and p.cu_seqlens_k is not None:
        raise InputError("cu_seqlens_k describes packed K/V and page_table a paged cache; give "
                         "one (a paged cache's lengths are seqused_k)")
    q_packed = p.cu_seqlens_q is not None
    if q.ndim != (3 if q_packed else 4):
        raise ShapeError(f"Q has shape {tuple(q.shape)}; with "
                         f"{'cu_seqlens_q' if q_packed else 'packed or paged K/V'} it must be "
                         f"{'(total_q, H, d)' if q_packed else '(B, t, H, d)'}")
    q_rows = _q_rows(q, p)
    mode = "paged" if p.page_table is not None else (
        "packed" if p.cu_seqlens_k is not None else "batched")
    k_rows, pages, page_size = _k_rows(k, v, p, mode, len(q_rows))
    seqs = tuple(Seq(b, qr, kr, None if pages is None else pages[b])
                 for b, (qr, kr) in enumerate(zip(q_rows, k_rows, strict=True)))
    return Packed(seqs, tuple(q.shape), tuple(k.shape), tuple(v.shape), q_packed, mode,
                  p.kv_layout, page_size)


def _q_rows(q: np.ndarray, p: Packing) -> list[np.ndarray]:
    if p.cu_seqlens_q is None:
        b, t = q.shape[:2]
        return [np.arange(i * t, (i + 1) * t) for i in range(b)]
    cu = _cu(p.cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    return [np.arange(cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def _k_rows(k, v, p: Packing, mode: str, batch: int):
    """Each sequence's key rows of K flattened to (rows, Hkv, d), its pages, the page size."""
    need = {"packed": 3, "paged": 4, "batched": 4}[mode]
    for x, name in ((k, "K"), (v, "V")):
        if x.ndim != need:
            shape = {"packed": "(total_k, Hkv, d)", "batched": "(B, s, Hkv, d)",
                     "paged": "(num_pages, page_size, Hkv, d)" if p.kv_layout == "nhd"
                     else "(num_pages, Hkv, page_size, d)"}[mode]
            raise ShapeError(f"{name} has shape {tuple(x.shape)}; {mode} K/V is {shape}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ShapeError(f"K {tuple(k.shape)} and V {tuple(v.shape)} differ before the head dim")
    pages = None
    page_size = 0
    if mode == "packed":
        cu = _cu(p.cu_seqlens_k, "cu_seqlens_k", k.shape[0])
        _same_batch(len(cu) - 1, batch, "cu_seqlens_k")
        avail = np.diff(cu)
        rows = [np.arange(cu[i], cu[i + 1]) for i in range(batch)]
    elif mode == "batched":
        _same_batch(k.shape[0], batch, "K's batch")
        s = k.shape[1]
        avail = np.full(batch, s)
        rows = [np.arange(i * s, (i + 1) * s) for i in range(batch)]
    else:
        table = _ints(p.page_table, "page_table", 2)
        _same_batch(table.shape[0], batch, "page_table")
        if p.seqused_k is None:
            raise InputError("a paged K/V cache needs seqused_k (each sequence's used length)")
        num_pages = k.shape[0]
        page_size = k.shape[1] if p.kv_layout == "nhd" else k.shape[2]
        if page_size == 0 or num_pages == 0:  # docs/inputs.md#zero-size-inputs
            raise ShapeError(f"the paged K/V cache has {num_pages} pages of {page_size} keys; "
                             "a cache needs at least one page of at least one key")
        avail = np.full(batch, table.shape[1] * page_size)
        rows, pages = [], []
        used = _ints(p.seqused_k, "seqused_k", 1)
        for b in range(batch):
            n = int(min(max(used[b], 0), avail[b])) if used.size == batch else 0
            first = -(-n // page_size)
            ids = table[b, :first]
            bad = (ids < 0) | (ids >= num_pages)
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                raise InputError(f"page_table[{b}, {j}] = {ids[j]} is not a page of the cache "
                                 f"(0 to {num_pages - 1})")
            keys = np.arange(n)
            phys = ids[keys // page_size] if n else np.zeros(0, np.int64)
            rows.append(phys * page_size + keys % page_size)
            pages.append(phys)
    if p.seqused_k is not None:
        used = _ints(p.seqused_k, "seqused_k", 1)
        _same_batch(len(used), batch, "seqused_k")
        if (used < 0).any():
            b = int(np.flatnonzero(used < 0)[0])
            raise InputError(f"seqused_k[{b}] = {used[b]} is negative")
        if (used > avail).any():
            b = int(np.flatnonzero(used > avail)[0])
            where = {"paged": "its pages hold", "packed": "cu_seqlens_k gives",
                     "batched": "K holds"}[mode]
            raise InputError(f"seqused_k[{b}] = {used[b]}, more keys than sequence {b} has "
                             f"({where} {avail[b]})")
        rows = [r[:u] for r, u in zip(rows, used, strict=True)]
    return rows, pages, page_size


def _same_batch(n: int, batch: int, name: str) -> None:
    if n != batch:
        raise ShapeError(f"{name} gives {n} sequences, but Q has {batch}")


def flat_kv(x: np.ndarray, packed: Packed) -> np.ndarray:
    """K or V storage as (rows, Hkv, d): a packed tensor as it is, a batch or the pages end to
    end (hnd pages reordered to nhd)."""
    x = np.asarray(x)
    if packed.kv_mode == "paged" and packed.kv_layout == "hnd":
        x = x.swapaxes(1, 2)
    return x.reshape(-1, *x.shape[-2:])


def gather(packed: Packed, seq: Seq, q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequence `seq` as dense (1, H, t, d), (1, Hkv, s, d), (1, Hkv, s, dv) arrays."""
    qf = np.asarray(q).reshape(-1, *np.shape(q)[-2:])
    kf, vf = flat_kv(k, packed), flat_kv(v, packed)
    return tuple(x[rows].swapaxes(0, 1)[None] for x, rows in (
        (qf, seq.q_rows), (kf, seq.k_rows), (vf, seq.k_rows)))


def rows_of(packed: Packed, seq: Seq, x) -> np.ndarray:
    """An array stored like Q (dO, O, a gradient of Q) cut to sequence seq: (1, H, t, ·)."""
    xf = np.asarray(x).reshape(-1, *np.shape(x)[-2:])
    return xf[seq.q_rows].swapaxes(0, 1)[None]


def each_sequence(packed: Packed, run, q, k, v, *like_q, trace_at=None) -> list:
    """run(seq, q_b, k_b, v_b, *like_q_b, trace_b) for every sequence: its dense arrays, the
    arrays stored like Q cut to it, and the traced (0, head, queries) in it or None. trace_at is
    (sequence, head, query or queries), the queries counted within its sequence."""
    from .shapes import traced_rows  # options.py imports this module, and shapes.py options.py

    trace_at = traced_rows(trace_at)
    if trace_at is not None:
        b, h, qs = trace_at
        if not 0 <= b < len(packed.seqs):
            raise InputError(f"traced sequence {b} is outside the batch's {len(packed.seqs)}")
        for i in qs:
            if not 0 <= i < packed.seqs[b].t:
                raise InputError(f"traced query {i} is outside sequence {b}'s "
                                 f"{packed.seqs[b].t} queries")
    out = []
    for seq in packed.seqs:
        tr = None if trace_at is None or trace_at[0] != seq.index else (0, *trace_at[1:])
        out.append(run(seq, *gather(packed, seq, q, k, v),
                       *(rows_of(packed, seq, x) for x in like_q), tr))
    return out


def traced_row(packed: Packed, x, traced: tuple, key: int | None = None) -> np.ndarray:
    """The traced (sequence, head, query) row of an array stored like Q; with key=j, key j of
    that sequence in an array stored like K (head = the kv head)."""
    b, h, i = traced
    seq = packed.seqs[b]
    if key is not None:
        return flat_kv(x, packed)[seq.k_rows[key], h]
    return np.asarray(x).reshape(-1, *np.shape(x)[-2:])[seq.q_rows[i], h]


def tile_pages(seq: Seq, start: int, stop: int) -> tuple[int, ...] | None:
    """The physical pages keys start:stop of a paged sequence came from, in key order."""
    if seq.pages is None:
        return None
    return tuple(int(x) for x in dict.fromkeys(seq.pages[start:stop].tolist()))


def about(packed: Packed) -> str:
    """The batch layout in a few words, for the summaries."""
    tq = [s.t for s in packed.seqs]
    tk = [s.s for s in packed.seqs]
    kind = {"packed": "varlen", "paged": f"paged KV ({packed.kv_layout}, page size "
            f"{packed.page_size})", "batched": "batched K/V"}[packed.kv_mode]
    return (f"{kind}: {len(packed.seqs)} sequences, queries {min(tq, default=0)}–"
            f"{max(tq, default=0)}, keys {min(tk, default=0)}–{max(tk, default=0)}")


def scatter_rows(packed: Packed, parts: list, dtype, width: int) -> np.ndarray:
    """Per-sequence (1, H, t, width) results (O, or a gradient of Q) as Q is stored."""
    rows = sum(s.t for s in packed.seqs) if packed.q_packed else int(np.prod(packed.q_shape[:2]))
    h = packed.q_shape[-2]
    out = np.zeros((rows, h, width), dtype=dtype)
    for seq, part in zip(packed.seqs, parts, strict=True):
        out[seq.q_rows] = np.asarray(part)[0].swapaxes(0, 1)
    return out.reshape(*packed.q_shape[:-1], width)


def scatter_lse(packed: Packed, parts: list, dtype) -> np.ndarray:
    """Per-sequence (1, H, t) LSEs (or D) as FlashAttention returns them: (H, total_q) for
    packed Q, (B, H, t) for batched Q."""
    h = packed.q_shape[-2]
    rows = packed.q_shape[0] if packed.q_packed else int(np.prod(packed.q_shape[:2]))
    out = np.zeros((h, rows), dtype=dtype)
    for seq, part in zip(packed.seqs, parts, strict=True):
        out[:, seq.q_rows] = np.asarray(part)[0]
    if packed.q_packed:
        return out
    b, t = packed.q_shape[:2]
    return out.reshape(h, b, t).swapaxes(0, 1)


def lse_parts(packed: Packed, lse) -> list[np.ndarray]:
    """A kernel's LSE as FlashAttention returns it, cut per sequence as (1, H, t)."""
    lse = np.asarray(lse)
    h = packed.q_shape[-2]
    want = (h, packed.q_shape[0]) if packed.q_packed else (packed.q_shape[0], h,
                                                            packed.q_shape[1])
    if lse.shape != want:
        raise ShapeError(f"LSE has shape {tuple(lse.shape)}; for this packed batch it is "
                         f"{want} (FlashAttention's layout)")
    flat = lse if packed.q_packed else lse.swapaxes(0, 1).reshape(h, -1)
    return [flat[:, seq.q_rows][None] for seq in packed.seqs]


def scatter_kv(packed: Packed, parts: list, like: np.ndarray) -> np.ndarray:
    """Per-sequence (1, Hkv, s, d) gradients of K or V added into K's (or V's) storage shape:
    each key row gets the sum over every sequence that read it (a shared page, say)."""
    like = np.asarray(like)
    flat = np.zeros(flat_kv(like, packed).shape)
    for seq, part in zip(packed.seqs, parts, strict=True):
        np.add.at(flat, seq.k_rows, np.asarray(part, dtype=np.float64)[0].swapaxes(0, 1))
    if packed.kv_mode == "paged" and packed.kv_layout == "hnd":
        n, hk, ps, d = like.shape
        return flat.reshape(n, ps, hk, d).swapaxes(1, 2)
    return flat.reshape(like.shape)


__all__ = ["KV_LAYOUTS", "Packed", "Packing", "Seq", "about", "each_sequence", "flat_kv",
           "gather", "lse_parts", "plan_packing", "rows_of", "scatter_kv", "scatter_lse",
           "scatter_rows", "tile_pages", "traced_row"]
