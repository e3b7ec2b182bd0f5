"""The FlashAttention-1 I/O cost model (FA1 §3.2, Theorem 2; docs/numerics.md#io-model): bytes
moved to and from HBM by standard attention and by tiled attention, and what one tile holds.

Counts follow the paper's algorithms line by line, in elements, times the bytes per element:
- standard forward (FA1 Algorithm 0): read Q, K; write S; read S, write P; read P, V; write O.
  2·t·d + 2·n·d + 4·t·n elements (4Nd + 4N² for t = n = N).
- standard backward (Algorithm 3): dV = PᵀdO, dP = dO·Vᵀ, dS, dQ = dS·K, dK = dSᵀQ, each a pass
  through HBM: 4·t·d + 4·n·d + 7·t·n elements.
- tiled forward (Algorithm 1): O, l, m initialised in HBM; K_j, V_j read once; for each of the
  T_c = ceil(n / B_c) key blocks every query row reads Q_i, O_i, l_i, m_i and writes O_i, l_i, m_i:
  t·(d + 2) + 2·n·d + T_c·t·(3d + 4) elements, Θ(N²d²/M) with FA1's B_c = ceil(M / 4d).
- tiled backward (Algorithm 4): dQ, dK, dV initialised; K_j, V_j read and dK_j, dV_j written once;
  per key block every row reads Q_i, O_i, dO_i, dQ_i, l_i, m_i and writes dQ_i:
  t·d + 6·n·d + T_c·t·(5d + 2) elements.
t is the number of query rows, n of keys (both N in the paper). `elementwise_passes` adds, to the
standard forms, separate kernels (a mask, dropout) that each read and write the t×n matrix once
per direction, as an unfused PyTorch attention does.

`fa1_traffic` follows the tiled loops step by step (K/V tiles outer, Q tiles inner, as FA1's
Algorithms 1 and 4): the elements read and written so far after each (K/V tile, Q tile) pair,
which the interactive page (present/page.py) shows beside the trace.

It is a model: no caches, no kernel launch or recomputation overheads, exact block counts.
Leaves out: running anything (sweep.py), printing (present/).

Example: hbm_bytes_standard(1024, 64, 16, 64, 2) = 9_126_805_504 bytes (forward, fp16).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from osm_cli.errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
}
MAX_BYTES = 1024**5  # 1 PiB: far beyond any on-chip memory, and exact as a float
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size in bytes: "192KiB" = 196608, "192KB" = 192000, "192K" = 196608 (K, M, G binary),
    "228 KiB", "1.5MiB", or a plain number of bytes.
    """
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InputError(
            f"{text!r} is not a size; use bytes or a unit: B, KiB, MiB, GiB (1024-based), "
            "KB, MB, GB (1000-based), e.g. 192KiB"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if not value <= MAX_BYTES:  # 1e400 reads as inf
        raise InputError(f"{text!r} is too large; a size is at most 1 PiB here")
    if value < 1 or value != int(value):
        raise InputError(f"{text!r} is not a whole number of bytes (at least 1)")
    return int(value)


def fa1_blocks(M: int, d: int) -> tuple[int, int]:
    """FA1's tile sizes for an SRAM of M elements: (B_r, B_c) = (min(ceil(M/4d), d), ceil(M/4d)).

    Example: fa1_blocks(98304, 64) = (64, 384)  (192 KiB of fp16)
    """
    if M < 1:
        raise InputError(f"the SRAM holds {M} elements; it must hold at least one")
    if d < 1:
        raise InputError(f"head dim d = {d}; it must be at least 1")
    b_c = math.ceil(M / (4 * d))
    return min(b_c, d), b_c


def hbm_bytes_standard(
    N: int, d: int, heads: int = 1, batch: int = 1, dtype_bytes: int = 2, *,
    n_q: int | None = None, backward: bool = False, elementwise_passes: int = 0,
) -> int:
    """HBM bytes read + written by standard attention (Algorithm 0, + Algorithm 3 if backward).

    N keys, n_q query rows (default N), head dim d. Θ(N·d + N²) per head.
    """
    t = N if n_q is None else n_q
    n = N
    elems = 2 * t * d + 2 * n * d + 4 * t * n + 2 * elementwise_passes * t * n
    if backward:
        elems += 4 * t * d + 4 * n * d + 7 * t * n + 2 * elementwise_passes * t * n
    return elems * heads * batch * dtype_bytes


def hbm_bytes_flash(
    N: int, d: int, M: int | None = None, heads: int = 1, batch: int = 1, dtype_bytes: int = 2,
    *, block_k: int | None = None, n_q: int | None = None, backward: bool = False,
    row_visits: int | None = None,
) -> int:
    """HBM bytes read + written by tiled attention (Algorithm 1, + Algorithm 4 if backward).

    The key block B_c is `block_k`, or FA1's ceil(M / 4d) for an SRAM of M elements.
    Θ(N²·d² / M) per head. The query block B_r does not change the traffic, only the tile.
    row_visits (per head) replaces T_c·t, the (query row, key block) pairs visited: with the
    tiles a mask hides skipped it is FA1's block-sparse count (Proposition 4, Algorithm 5: K_j,
    V_j still read once, Q_i, O_i, l_i, m_i only for the tiles computed).
    """
    if block_k is None:
        if M is None:
            raise InputError("give the SRAM size M (elements) or the key block size")
        block_k = fa1_blocks(M, d)[1]
    t = N if n_q is None else n_q
    n = N
    visits = math.ceil(n / block_k) * t if row_visits is None else row_visits
    elems = t * (d + 2) + 2 * n * d + visits * (3 * d + 4)
    if backward:
        elems += t * d + 6 * n * d + visits * (5 * d + 2)
    return elems * heads * batch * dtype_bytes


def fa1_traffic(t: int, n: int, d: int, block_q: int, block_k: int, skip=None, *,
                backward: bool = False, order=None) -> tuple:
    """Elements (read, written) between HBM and SRAM so far, per head, along FA1's tiled loop:
    two (n_k, n_q) int arrays whose [j, i] entry counts everything up to and including the pair
    (K/V tile order[j], Q tile i), the K/V tiles outer (visited in `order`, default forward)
    and the Q tiles inner. skip (n_q, n_k) marks tiles a mask hides: skipped, as FA1's
    block-sparse Algorithm 5 (K_j, V_j still read). The last entries add up to
    hbm_bytes_flash's elements (backward=True: Algorithm 4's part alone).

    Forward (Algorithm 1): O, l, m written once at the start, t·(d + 2); per K/V tile, K_j and V_j
    read; per computed pair, each row reads Q_i, O_i, l_i, m_i (2d + 2) and writes O_i, l_i, m_i
    (d + 2). Backward (Algorithm 4): dQ, dK, dV written at the start, t·d + 2·n·d; per K/V tile,
    K_j and V_j read and, after its last Q tile, dK_j and dV_j written; per computed pair each
    row reads Q_i, O_i, dO_i, dQ_i, l_i, m_i (4d + 2) and writes dQ_i (d).

    Example: fa1_traffic(4, 4, 2, 2, 2)[0][-1, -1] + fa1_traffic(4, 4, 2, 2, 2)[1][-1, -1]
    == hbm_bytes_flash(4, 2, block_k=2, n_q=4, dtype_bytes=1) == 112
    """
    import numpy as np  # here: `osm --help` reads this module's parse_size without numpy

    n_q, n_k = -(-t // block_q), -(-n // block_k)
    rows = np.minimum(block_q, t - block_q * np.arange(n_q))  # the last tiles may be short
    cols = np.minimum(block_k, n - block_k * np.arange(n_k))
    order = np.arange(n_k) if order is None else np.asarray(order, dtype=np.int64)
    done = np.ones((n_q, n_k), dtype=bool) if skip is None else ~np.asarray(skip, dtype=bool)
    visits = (done[:, order].T * rows).astype(np.int64)  # (n_k, n_q) rows computed per pair
    per_read, per_write = (4 * d + 2, d) if backward else (2 * d + 2, d + 2)
    read, written = visits * per_read, visits * per_write
    read[:, 0] += 2 * cols[order] * d  # K_j and V_j, read as the tile starts
    if backward:
        written[:, -1] += 2 * cols[order] * d  # dK_j and dV_j, once its Q tiles are done
    start = t * d + 2 * n * d if backward else t * (d + 2)
    return read.ravel().cumsum().reshape(read.shape), start + written.ravel().cumsum().reshape(
        written.shape)


def tile_bytes(block_q: int, block_k: int, d: int, dtype_bytes: int = 2, acc_bytes: int = 4) -> int:
    """On-chip working set of one tile step: Q_i (B_r×d), K_j and V_j (B_c×d) in the input dtype;
    S/P (B_r×B_c), the O accumulator (B_r×d), m and l (B_r) in fp32 (`acc_bytes`).

    Example: tile_bytes(128, 64, 64) = 2·(128·64 + 2·64·64) + 4·(128·64 + 128·64 + 2·128)
    = 32768 + 66560 = 99328
    """
    return dtype_bytes * (block_q * d + 2 * block_k * d) + acc_bytes * (
        block_q * block_k + block_q * d + 2 * block_q
    )


def attention_flops(N: int, d: int, heads: int = 1, batch: int = 1, *, n_q: int | None = None,
                    backward: bool = False) -> int:
    """Matmul FLOPs: 4·t·n·d per head forward (QKᵀ and PV); the backward is 2.5× that."""
    t = N if n_q is None else n_q
    fwd = 4 * t * N * d * heads * batch
    return fwd + (5 * fwd // 2 if backward else 0)


@dataclass(frozen=True)
class Cost:
    """The cost model of one attention shape: what `osm cost` shows."""

    N: int
    d: int
    heads: int
    batch: int
    dtype_bytes: int
    sram_bytes: int
    block_q: int  # FA1's B_r
    block_k: int  # FA1's B_c
    standard_fwd: int
    flash_fwd: int
    standard_fwd_bwd: int
    flash_fwd_bwd: int
    standard_fwd_bwd_passes: int  # with a mask and dropout as separate kernels
    flops_fwd: int
    flops_fwd_bwd: int


def cost(N: int, d: int, heads: int = 1, batch: int = 1, dtype_bytes: int = 2,
         sram_bytes: int = 192 * 1024, elementwise_passes: int = 2) -> Cost:
    """Every number of the model for one shape, with FA1's tiles for `sram_bytes` of SRAM."""
    if min(N, d, heads, batch, dtype_bytes) < 1:
        raise InputError("N, d, heads, batch and bytes per element must be at least 1")
    M = sram_bytes // dtype_bytes
    if M < 1:
        raise InputError(f"`sram` {sram_bytes} B holds no element of {dtype_bytes} bytes "
                         "(`dtype_bytes`); give a larger `sram`")
    b_r, b_c = fa1_blocks(M, d)
    shape = (N, d, heads, batch, dtype_bytes)
    return Cost(
        N, d, heads, batch, dtype_bytes, sram_bytes, b_r, b_c,
        hbm_bytes_standard(*shape),
        hbm_bytes_flash(N, d, M, heads, batch, dtype_bytes),
        hbm_bytes_standard(*shape, backward=True),
        hbm_bytes_flash(N, d, M, heads, batch, dtype_bytes, backward=True),
        hbm_bytes_standard(*shape, backward=True, elementwise_passes=elementwise_passes),
        attention_flops(N, d, heads, batch),
        attention_flops(N, d, heads, batch, backward=True),
    )


__all__ = [
    "Cost", "attention_flops", "cost", "fa1_blocks", "fa1_traffic", "hbm_bytes_flash",
    "hbm_bytes_standard", "parse_size", "tile_bytes",
]
