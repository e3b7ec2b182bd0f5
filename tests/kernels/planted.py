"""Attention kernels written for osm's tests: a correct blockwise online-softmax kernel in numpy
(FlashAttention's contract and keyword names) and the same kernel with one planted bug each,
the bugs real kernels shipped with; shared by the tests of `osm check` and `osm battery`.

`flash(q, k, v, **kw) -> (out, lse)` takes FlashAttention's arguments: q (B, N, H, d), k and v
(B, N_k, Hkv, d); or varlen (total, H, d) with cu_seqlens_q / cu_seqlens_k (and seqused_k); or
a paged cache (num_pages, page_size, Hkv, d) with page_table and seqused_k. Scores: scale ->
softcap -> ALiBi (−slope·|i + s − t − j|) -> causal/window, bottom-right aligned; a learnable
sink joins the denominator after the last tile; a row that sees no key gives out 0 and LSE +inf
(FA2's convention). Accumulation in float32, the output in the inputs' dtype, LSE float32
(B, H, N) (or (H, total) for varlen). `flash.osm_backward(q, k, v, out, lse, dout, **kw)` gives
(dq, dk, dv) for the dense, causal and GQA cases (numpy has no autograd).

`planted(name)` is that kernel with bug `name` (BUGS lists them, with the feature that shows
it); `flash_torch` is a torch-CPU kernel of the same contract whose gradients come from
autograd, and `planted_torch("dq_head")` scales one head's dQ by 1.1.
Leaves out: judging anything (osm does that).
"""

from __future__ import annotations

import functools
import math

import numpy as np

BLOCK = 64  # block_q = block_k: the tile loop's tiles

# bug -> what it does (the tests check that the battery names the right feature or tensor)
BUGS = {
    "lse_base2": "stores the LSE in base 2 (m·log2 e + log2 l), as FlashInfer and Triton do",
    "causal_topleft": "aligns the causal mask top-left (key j ≤ query i) instead of bottom-right",
    "scale_1_over_d": "scales the scores by 1/d instead of 1/√d, ignoring softmax_scale",
    "gqa_mod": "maps query head h to K/V head h % Hkv instead of h // (H / Hkv)",
    "softcap_after_mask": "applies the softcap after the mask: masked scores become −softcap",
    "double_count": "counts the first K/V tile twice on every other Q tile",
    "last_tile_drop": "drops the last K/V tile when there is more than one",
    "bf16_accumulation": "accumulates O in bfloat16 instead of float32",
    "head_scale": "multiplies head 1's output by 1.001",
    "masked_rows": "gives a row that sees no key the mean of V instead of 0",
    "dq_head": "multiplies head 0's dQ by 1.1",
    "varlen_shift": "reads sequence b's keys from cu_seqlens_k[b] + 1 (one row late)",
    "score_mod_unscaled": "applies score_mod to q·k before softmax_scale, not after",
    "mask_last_tile": "skips mask_mod on the last K/V tile when it is partial (a block mask "
                      "that declares that tile full)",
}


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, bug):
    """Each sequence as dense (t, H, d) Q and (s, Hkv, d) K, V, and where its rows go."""
    q, k, v = _f32(q), _f32(k), _f32(v)
    if cu_seqlens_q is not None:
        cq = np.asarray(cu_seqlens_q)
        qs = [(q[cq[b]:cq[b + 1]], slice(int(cq[b]), int(cq[b + 1]))) for b in range(len(cq) - 1)]
    else:
        qs = [(q[b], b) for b in range(q.shape[0])]
    ks = []
    for b in range(len(qs)):
        if page_table is not None:
            pages = np.asarray(page_table)[b]
            kb = k[pages].reshape(-1, *k.shape[2:])
            vb = v[pages].reshape(-1, *v.shape[2:])
        elif cu_seqlens_k is not None:
            ck = np.asarray(cu_seqlens_k)
            lo, hi = int(ck[b]), int(ck[b + 1])
            if bug == "varlen_shift":
                lo, hi = min(lo + 1, k.shape[0]), min(hi + 1, k.shape[0])
            kb, vb = k[lo:hi], v[lo:hi]
        else:
            kb, vb = k[b], v[b]
        if seqused_k is not None:
            n = int(np.asarray(seqused_k)[b])
            kb, vb = kb[:n], vb[:n]
        ks.append((kb, vb))
    return qs, ks


def _visible(t: int, s: int, i0: int, i1: int, j0: int, j1: int, causal: bool, window,
             bug) -> np.ndarray | None:
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    i = np.arange(i0, i1)[:, None] + (0 if bug == "causal_topleft" else s - t)
    j = np.arange(j0, j1)[None, :]
    ok = np.ones((i1 - i0, j1 - j0), dtype=bool)
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    return ok


def _attend(q, k, v, scale, causal, window, softcap, slopes, sink, bug, score_mod=None,
            mask_mod=None, b=0):
    """One sequence (batch b): q (t, H, d), k, v (s, Hkv, d) float32 -> o (t, H, d), lse
    (H, t); score_mod and mask_mod FlexAttention's, on numpy index arrays."""
    t, h, d = q.shape
    s, hk = k.shape[0], k.shape[1]
    group = h // max(hk, 1)
    heads = np.arange(h) % hk if bug == "gqa_mod" else np.arange(h) // max(group, 1)
    qh = q.transpose(1, 0, 2)  # (H, t, d)
    kh = k.transpose(1, 0, 2)[heads] if s else np.zeros((h, 0, d), np.float32)
    vh = v.transpose(1, 0, 2)[heads] if s else np.zeros((h, 0, d), np.float32)
    o = np.zeros((h, t, d), np.float32)
    lse = np.zeros((h, t), np.float32)
    n_k = -(-s // BLOCK)
    for qi, i0 in enumerate(range(0, t, BLOCK)):
        i1 = min(i0 + BLOCK, t)
        m = np.full((h, i1 - i0), -np.inf, np.float32)
        l = np.zeros((h, i1 - i0), np.float32)
        acc = np.zeros((h, i1 - i0, d), np.float32)
        tiles = list(range(n_k))
        if bug == "last_tile_drop" and n_k > 1:
            tiles = tiles[:-1]
        if bug == "double_count" and qi % 2 == 1 and tiles:
            tiles = [tiles[0], *tiles]
        for kj in tiles:
            j0, j1 = kj * BLOCK, min(kj * BLOCK + BLOCK, s)
            sc = (qh[:, i0:i1] @ kh[:, j0:j1].transpose(0, 2, 1)) * np.float32(scale)
            vis = _visible(t, s, i0, i1, j0, j1, causal, window, bug)
            if softcap and bug != "softcap_after_mask":
                sc = np.float32(softcap) * np.tanh(sc / np.float32(softcap))
            if slopes is not None:
                dist = np.abs(np.arange(i0, i1)[:, None] + s - t - np.arange(j0, j1)[None, :])
                sc = sc - slopes[:, None, None].astype(np.float32) * dist.astype(np.float32)
            idx = (np.asarray(b), np.arange(h)[:, None, None], np.arange(i0, i1)[None, :, None],
                   np.arange(j0, j1)[None, None, :])
            if score_mod is not None:
                if bug == "score_mod_unscaled":
                    sc = np.float32(scale) * score_mod(sc / np.float32(scale), *idx)
                else:
                    sc = score_mod(sc, *idx)
                sc = np.asarray(sc, np.float32)
            if mask_mod is not None and not (bug == "mask_last_tile" and kj == n_k - 1
                                             and s % BLOCK):
                seen_mod = np.broadcast_to(mask_mod(*idx), sc.shape)
                vis = seen_mod if vis is None else vis & seen_mod
            if vis is not None:
                sc = np.where(vis, sc, np.float32(-np.inf))
            if softcap and bug == "softcap_after_mask":
                sc = np.float32(softcap) * np.tanh(sc / np.float32(softcap))
            m_new = np.maximum(m, sc.max(axis=-1, initial=-np.inf))
            safe = np.where(np.isneginf(m_new), 0, m_new)
            alpha = np.exp(m - safe)
            p = np.exp(sc - safe[..., None])
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ vh[:, j0:j1]
            if bug == "bf16_accumulation":
                import ml_dtypes

                acc = acc.astype(ml_dtypes.bfloat16).astype(np.float32)
            m = m_new
        if sink is not None:
            sg = np.asarray(sink, np.float32)[:, None]
            m_new = np.maximum(m, sg)
            alpha = np.exp(m - m_new)
            l = alpha * l + np.exp(sg - m_new)
            acc = alpha[..., None] * acc
            m = m_new
        seen = l > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            o[:, i0:i1] = np.where(seen[..., None], acc / np.where(seen, l, 1)[..., None], 0)
            lse[:, i0:i1] = np.where(seen, m + np.log(np.where(seen, l, 1)), np.inf)
        if bug == "masked_rows" and s:
            o[:, i0:i1] = np.where(seen[..., None], o[:, i0:i1], vh.mean(axis=1)[:, None])
    if bug == "lse_base2":
        lse = np.where(np.isfinite(lse), lse * np.float32(1 / math.log(2)), lse)
    if bug == "head_scale" and h > 1:
        o[1] *= np.float32(1.001)
    return o.transpose(1, 0, 2), lse


def _slopes_for(alibi_slopes, b: int):
    if alibi_slopes is None:
        return None
    a = np.asarray(alibi_slopes, np.float32)
    return a[b] if a.ndim == 2 else a


def flash_numpy(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None,
                max_seqlen_q=None, max_seqlen_k=None, seqused_k=None, page_table=None,
                score_mod=None, mask_mod=None, *, bug: str | None = None):
    """FlashAttention's forward, blockwise with the online softmax; -> (out, lse)."""
    d = np.shape(q)[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    if bug == "scale_1_over_d":
        scale = 1.0 / d
    window = None if window_size is None else tuple(int(w) for w in window_size)
    qs, ks = _sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, bug)
    out = np.zeros(np.shape(q), np.float32)
    h = np.shape(q)[-2]
    varlen = cu_seqlens_q is not None
    lse = np.zeros((h, np.shape(q)[0]) if varlen else (len(qs), h, np.shape(q)[1]), np.float32)
    for b, ((qb, where), (kb, vb)) in enumerate(zip(qs, ks, strict=True)):
        o, l = _attend(qb, kb, vb, scale, causal, window, softcap or None,
                       _slopes_for(alibi_slopes, b), learnable_sink, bug, score_mod, mask_mod, b)
        out[where] = o
        if varlen:
            lse[:, where] = l
        else:
            lse[b] = l
    return out.astype(np.asarray(q).dtype), lse


def _backward(q, k, v, out, lse, dout, softmax_scale=None, causal=False, *, bug=None,
              **unused):
    """dQ, dK, dV of a dense (B, N, H, d) batch from P recomputed with the LSE (float32)."""
    q32, k32, v32, o32, do32 = (_f32(x) for x in (q, k, v, out, dout))
    b, t, h, d = q32.shape
    s, hk = k32.shape[1], k32.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    heads = np.arange(h) // (h // hk)
    qh, doh, oh = (x.transpose(0, 2, 1, 3) for x in (q32, do32, o32))
    kh, vh = (x.transpose(0, 2, 1, 3)[:, heads] for x in (k32, v32))
    sc = qh @ kh.transpose(0, 1, 3, 2) * np.float32(scale)
    vis = _visible(t, s, 0, t, 0, s, causal, None, None)
    lse32 = _f32(lse)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(np.isfinite(lse32), np.exp(sc - np.where(np.isfinite(lse32), lse32, 0)), 0)
    if vis is not None:
        p = np.where(vis, p, 0)
    dv = p.transpose(0, 1, 3, 2) @ doh
    dp = doh @ vh.transpose(0, 1, 3, 2)
    delta = (doh * oh).sum(-1, keepdims=True)
    ds = p * (dp - delta) * np.float32(scale)
    dq = ds @ kh
    dk = ds.transpose(0, 1, 3, 2) @ qh
    if bug == "dq_head":
        dq[:, 0] *= np.float32(1.1)
    dk = dk.reshape(b, hk, h // hk, s, d).sum(2)
    dv = dv.reshape(b, hk, h // hk, s, d).sum(2)
    dt = np.asarray(q).dtype
    return (dq.transpose(0, 2, 1, 3).astype(dt), dk.transpose(0, 2, 1, 3).astype(dt),
            dv.transpose(0, 2, 1, 3).astype(dt))


SINK_BUGS = {"dsink_head": "multiplies head 0's dsink by 1.1",
             "dsink_sign": "returns +Σ exp(sink − LSE)·D, the sinks' gradient with its sign lost"}


def sink_backward(out, lse, dout, learnable_sink, *, bug: str | None = None) -> np.ndarray:
    """dsink of a dense (B, N, H, d) batch, as FA4 computes it (float32): −Σ over the batch and
    the rows of exp(sink − LSE)·D, D = rowsum(dO ∘ O), the LSE holding the sink; `bug` one of
    SINK_BUGS. (dQ, dK, dV need nothing more: _backward's P = exp(S − LSE) leaves the sink out.)"""
    if bug is not None and bug not in SINK_BUGS:
        raise ValueError(f"unknown sink bug {bug!r}; known: {', '.join(SINK_BUGS)}")
    delta = (_f32(dout) * _f32(out)).sum(-1).transpose(0, 2, 1)  # (B, H, N)
    p_sink = np.exp(_f32(learnable_sink)[None, :, None] - _f32(lse))
    dsink = -(p_sink * delta).sum(axis=(0, 2), dtype=np.float32)
    if bug == "dsink_head":
        dsink[0] *= np.float32(1.1)
    if bug == "dsink_sign":
        dsink = -dsink
    return dsink.astype(np.float32)


def _declare(fn, features: str):
    fn.osm_features = features
    return fn


def planted(bug: str | None = None, features: str = "causal,gqa,window,softcap,alibi,sink,"
            "varlen,paged,lse,grad"):
    """flash_numpy with `bug` (None: the correct kernel), declaring `features`."""
    if bug is not None and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known: {', '.join(BUGS)}")

    @functools.wraps(flash_numpy)
    def kernel(q, k, v, **kw):
        return flash_numpy(q, k, v, bug=bug, **kw)

    kernel.osm_backward = functools.partial(_backward, bug=bug)
    kernel.__name__ = f"flash_{bug or 'correct'}"
    return _declare(kernel, features)


flash = planted(None)
flash_plain = planted(None, "lse")  # no features: dense, MHA
flash_gqa_causal = planted(None, "causal,gqa,lse")
flash_varlen = planted(None, "causal,gqa,varlen,lse")
flash_mods = planted(None, "causal,gqa,score_mod,mask_mod,lse")


def flash_torch(q, k, v, softmax_scale=None, causal=False, score_mod=None, mask_mod=None, *,
                bug: str | None = None):
    """The same blockwise loop in torch (float32 accumulation), differentiable by autograd;
    dense (B, N, H, d) with causal, GQA and FlexAttention's score_mod / mask_mod (torch
    functions on broadcast index tensors). -> (out, lse)"""
    import torch

    b, t, h, d = q.shape
    s, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    qf = q.float()
    if bug == "dq_head":
        qf = _ScaleHeadGrad.apply(qf)
    heads = torch.arange(h) // (h // hk)
    qh = qf.transpose(1, 2)
    kh, vh = (x.float().transpose(1, 2)[:, heads] for x in (k, v))
    outs, lses = [], []
    for i0 in range(0, t, BLOCK):
        i1 = min(i0 + BLOCK, t)
        m = torch.full((b, h, i1 - i0), -math.inf)
        l = torch.zeros((b, h, i1 - i0))
        acc = torch.zeros((b, h, i1 - i0, d))
        for j0 in range(0, s, BLOCK):
            j1 = min(j0 + BLOCK, s)
            sc = qh[:, :, i0:i1] @ kh[:, :, j0:j1].transpose(-1, -2) * scale
            idx = (torch.arange(b)[:, None, None, None], torch.arange(h)[None, :, None, None],
                   torch.arange(i0, i1)[None, None, :, None],
                   torch.arange(j0, j1)[None, None, None, :])
            if score_mod is not None:
                sc = score_mod(sc, *idx)
            if mask_mod is not None:
                sc = sc.masked_fill(~mask_mod(*idx).expand(sc.shape), -math.inf)
            if causal:
                vis = torch.from_numpy(_visible(t, s, i0, i1, j0, j1, True, None, bug))
                sc = sc.masked_fill(~vis, -math.inf)
            m_new = torch.maximum(m, sc.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - safe)
            p = torch.exp(sc - safe[..., None])
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vh[:, :, j0:j1]
            m = m_new
        seen = l > 0
        outs.append(torch.where(seen[..., None], acc / torch.where(seen, l, 1)[..., None], 0))
        lses.append(torch.where(seen, m + torch.log(torch.where(seen, l, 1)), math.inf))
    return torch.cat(outs, 2).transpose(1, 2).to(q.dtype), torch.cat(lses, -1)


class _ScaleHeadGradMeta(type):
    """Builds the autograd Function on first use, so that importing this file needs no torch."""

    _fn = None

    def apply(cls, x):
        if cls._fn is None:
            import torch

            class ScaleHeadGrad(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x.view_as(x)

                @staticmethod
                def backward(ctx, g):
                    g = g.clone()
                    g[:, :, 0] *= 1.1
                    return g

            cls._fn = ScaleHeadGrad
        return cls._fn.apply(x)


class _ScaleHeadGrad(metaclass=_ScaleHeadGradMeta):
    pass


def planted_torch(bug: str | None = None, features: str = "causal,gqa,lse,grad"):
    """flash_torch with `bug`, declaring `features`."""

    def kernel(q, k, v, **kw):
        return flash_torch(q, k, v, bug=bug, **kw)

    kernel.__name__ = f"flash_torch_{bug or 'correct'}"
    return _declare(kernel, features)


torch_correct = planted_torch(None)
torch_mods = planted_torch(None, "causal,gqa,score_mod,mask_mod,lse,grad")
