"""The one-shot attention reference: softmax(scale·Q·Kᵀ + mask)·V and its LSE, and the errors
of a run against it.

Computed in float64 a chunk of query rows at a time (the full t × s matrix is never held),
with the same score_tile, masks and GQA head map as the tiled forward. With `rnd` each op is
rounded instead, which is how precision/model.py's plain same-dtype attention is made.
Leaves out: tiles (forward.py), the softmax oracles themselves (core/reference.py).

Example: out, lse = reference(q, k, v, ScoreOptions(causal=True))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from osm_cli.core.reference import logsumexp, max_abs_diff, stable_softmax

from .forward import Attention
from .masks import check_score_range, make_band, scale_q, score_tile
from .options import MASKED_LSE, ScoreOptions, split_options
from .shapes import bhnd_inputs, broadcast_mask, check_finite, from_bhnd, kv_head


def reference(q, k, v, opts: ScoreOptions | None = None, *, rnd: Callable | None = None,
              carry=np.float64, **options) -> tuple[np.ndarray, np.ndarray]:
    """The float64 one-shot (out, lse) for the same conventions as `attention`, shaped alike.

    opts (or its fields as keywords: causal=True, …) as attention's. With rnd and carry each
    op is rounded instead (precision/model.py's plain). Rows with every key masked give output
    0 and LSE -inf.
    """
    if options or opts is None:
        opts = split_options(options, opts)[0]
    q4, k4, v4 = bhnd_inputs(q, k, v, opts.layout)
    b, hq, t, d = q4.shape
    hk, s = k4.shape[1], k4.shape[2]
    q_max, k_max = (check_finite(x, name) for x, name in ((q4, "Q"), (k4, "K")))
    check_score_range(q4, k4, opts.scale_for(d), carry, q_max, k_max)
    heads = kv_head(np.arange(hq), hq, hk)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    full_mask = None if opts.mask is None else broadcast_mask(np.asarray(opts.mask),
                                                              (b, hq, t, s))
    out, lse = _one_shot(q4, k4[:, heads], v4[:, heads], opts.scale_for(d),
                         None if band is None else (lambda i0, i1: band.visible(i0, i1, 0, s)),
                         full_mask, rnd=rnd, carry=carry)
    nd = np.asarray(q).ndim
    return from_bhnd(out, nd, opts.layout), from_bhnd(lse[..., None], nd, opts.layout)[..., 0]


def _one_shot(q, k, v, scale: float, visible=None, mask=None, rows_per_chunk: int | None = None,
              *, rnd: Callable | None = None, carry=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """reference on (B, H, N, d) arrays whose K/V heads already match Q's (a broadcast view is
    fine). visible(i0, i1) gives the (i1 - i0, s) band or None; mask is (B, H, t, s) or None."""
    carry = np.dtype(carry)
    to = rnd or (lambda x: np.asarray(x, dtype=carry))
    b, h, t, _ = q.shape
    s = k.shape[2]
    out = np.zeros((b, h, t, v.shape[-1]), dtype=carry)
    lse = np.full((b, h, t), -np.inf, dtype=carry)
    if s == 0:  # no keys at all: every row is fully masked
        return out, lse
    chunk = rows_per_chunk or max(1, (1 << 22) // max(1, b * h * s))
    kT = to(k).swapaxes(-1, -2)
    vc = to(v)
    for i0 in range(0, t, chunk):
        i1 = min(t, i0 + chunk)
        sc = score_tile(scale_q(q[..., i0:i1, :], scale, carry, to), kT,
                        None if visible is None else visible(i0, i1),
                        None if mask is None else mask[..., i0:i1, :], to)
        out[..., i0:i1, :] = to(to(stable_softmax(sc)) @ vc)
        lse[..., i0:i1] = logsumexp(sc)
    return out, lse


def errors(res: Attention, ref_out: np.ndarray, ref_lse: np.ndarray) -> dict:
    """Max abs and max relative (to max |ref|) error of O, max abs error of LSE.

    The reference's fully masked rows take the same LSE convention as the run.
    """
    diff = np.abs(res.out.astype(np.float64) - ref_out)
    scale = float(np.abs(ref_out).max()) if ref_out.size else 0.0
    ref_lse = np.where(np.isneginf(ref_lse), MASKED_LSE[res.masked_lse], ref_lse)
    return {
        "max_abs_err": float(diff.max()) if diff.size else 0.0,
        "max_rel_err": float(diff.max()) / scale if scale else 0.0,
        "max_lse_err": max_abs_diff(res.lse, ref_lse),
    }


__all__ = ["errors", "reference"]
