"""The backward step: one (Q tile, K/V tile) pair's share of dQ, dK and dV (FA2 Algorithm 2).

The forward kept only O and the LSE of each query row; the backward recomputes the rest, tile by
tile (docs/numerics.md#backward):

    P  = exp(S − LSE)          the forward's probabilities, already normalised
    dV_j += Pᵀ·dO_i
    dP = dO_i·V_jᵀ
    dS = P ∘ (dP − D_i)        D_i = rowsum(dO_i ∘ O_i), computed once per row (`delta`)
    dQ_i += dS·K_j             (times the score scale, applied once at the end)
    dK_j += dSᵀ·Q_i            (likewise)

`backward_step` is that update for a batch of tiles at once, as state.rescale_step is for the
forward: arrays in, the tile's contributions out. A fully masked row has LSE −inf in osm (and
+inf in FA2, which is why FA2 stores it): both give P = 0 for the whole row, with no NaN.
Leaves out: the loop over tiles and the masks (flash/backward.py), rounding models
(precision/), the closed-form reference (flash/reference.py).

Example: backward_step(s, lse, delta, q, k, v, do).dv is Pᵀ·dO for the tile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from osm_cli.errors import InputError


@dataclass(frozen=True)
class GradUpdate:
    """What one tile contributed, before the score scale: dv = Pᵀ·dO, dk = dSᵀ·Q, dq = dS·K.

    p, dp and ds are the tile's P, dP = dO·Vᵀ and dS (rows, keys), as the traces read them.
    With heads (g > 1) dv and dk are per query head, (…, g, keys, d): summing them over g is
    GQA's sum.
    """

    p: np.ndarray
    ds: np.ndarray
    dv: np.ndarray
    dk: np.ndarray
    dq: np.ndarray
    dp: np.ndarray | None = None


def delta(do: np.ndarray, o: np.ndarray, dtype=None) -> np.ndarray:
    """D = rowsum(dO ∘ O) along the last axis, in `dtype` (default: o's).

    It stands in for rowsum(P ∘ dP), which the softmax derivative needs:
    Σ_j P_ij·dP_ij = Σ_j P_ij·(dO_i·v_j) = dO_i·O_i. Example: delta([[1., 2.]], [[3., 4.]]) -> [11.]
    """
    dt = np.dtype(dtype or np.result_type(o))
    return np.einsum("...d,...d->...", np.asarray(do, dtype=dt), np.asarray(o, dtype=dt))


def lse_for_p(lse: np.ndarray) -> np.ndarray:
    """The LSE to subtract when recomputing P: −inf (a fully masked row, osm's and FA3's marker)
    read as +inf (FA2's), so exp(S − LSE) = exp(−inf) = 0 instead of exp(−inf + inf) = NaN."""
    lse = np.asarray(lse)
    return np.where(np.isneginf(lse), np.array(np.inf, lse.dtype), lse)


def backward_step(
    s: np.ndarray, lse: np.ndarray, d: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
    do: np.ndarray, *, heads: int = 1, p_round: Callable | None = None,
    ds_round: Callable | None = None, ds_factor: np.ndarray | None = None,
) -> GradUpdate:
    """The backward update of one tile, for a batch of tiles (leading axes) at once.

    s: the masked, scaled scores (…, rows, keys); lse and d: per row (…, rows), lse already
    through lse_for_p; q (…, rows, d), do (…, rows, dv): the tile's query rows; k (…, keys, d),
    v (…, keys, dv): its keys. heads = g stacks g query heads as rows (g blocks of rows/g, as
    the forward does for GQA): dv and dk come back per head. p_round rounds P before Pᵀ·dO and
    ds_round rounds dS before dS·K and dSᵀ·Q (a kernel's 16-bit tensor-core operands);
    ds_factor, if given, multiplies dS first (the derivative of a score transform).
    """
    with np.errstate(over="ignore"):  # a score far below the LSE underflows to 0, rightly
        p = np.exp(s - lse[..., None])
    if np.isinf(p).any():  # an LSE far below its row's scores: refused, not NaN gradients
        row = np.unravel_index(int(np.argmax(np.isinf(p).any(axis=-1))), p.shape[:-1])
        big = np.log(np.finfo(p.dtype).max)
        raise InputError(
            f"an LSE of {float(lse[row]):.6g} is below its row's largest score "
            f"{float(s[row].max()):.6g} by more than ln(max {p.dtype.name}) = {big:.4g}, so "
            "exp(S − LSE) overflows: an LSE is at least the largest score of its row (give the "
            "LSE the forward wrote, natural log; docs/inputs.md#kernel-inputs)")
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - d[..., None])
    if ds_factor is not None:
        ds = ds * ds_factor
    pr = p if p_round is None else p_round(p)
    dsr = ds if ds_round is None else ds_round(ds)
    dq = dsr @ k
    lead, rows = s.shape[:-2], s.shape[-2]
    per = rows // heads

    def by_head(x):  # (…, rows, n) -> (…, g, rows/g, n), each head's rows apart
        return x.reshape(*lead, heads, per, x.shape[-1])

    dv = np.swapaxes(by_head(pr), -1, -2) @ by_head(do)
    dk = np.swapaxes(by_head(dsr), -1, -2) @ by_head(q)
    return GradUpdate(p, ds, dv, dk, dq, dp)


__all__ = ["GradUpdate", "backward_step", "delta", "lse_for_p"]
