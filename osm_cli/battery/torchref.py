"""osm's float64 reference and plain same-dtype baseline of a battery case, computed with torch on
the kernel's device (a GPU: the battery's full budget then judges in minutes): what osm check's
numpy reference and plain attention give (flash/reference.py, precision/model.py), with the
same conventions, for check to judge against (check's `baseline`).

- reference: float64 throughout; the gradients by autograd of the float64 forward.
- plain: each op in the dtype, as PyTorch computes 16-bit tensors (float32 inside the matmul
  and the softmax; score_mod in float32, rounded once), FlashAttention's test `pt`; its
  gradients by autograd through those ops; carried in float32 as osm's plain is.
The scores in osm's order: Q·scale, S = (Q·scale)·Kᵀ, softcap, ALiBi (−slope·|i + s − t − j|),
score_mod, then the masks (the causal band and window of flash/masks.py, bottom-right, and the
mask_mod); a sink is one more column of the softmax; a row that sees no key gives 0 (LSE −inf,
or the sink). Varlen and paged batches run one sequence at a time.
Leaves out: the judgement (check), the numpy path (the default off the GPU, and the fallback).

Example: baseline(case, inputs(case), "cpu")["ref"].shape == inputs(case)["q"].shape
"""

from __future__ import annotations

import math

import numpy as np

from osm_cli.flash.masks import make_band

from .cases import Case, scale_of


def baseline(case: Case, data: dict, device: str, grads: bool = False) -> dict:
    """{"ref", "ref_lse", "pt", "pt_lse"} as numpy arrays shaped as check's reference and plain
    give them (out like Q; LSE FlashAttention's (B, H, N), or (H, total) for varlen); with
    grads also "grads" (dq, dk, dv float64) and "grad_pts" (plain's, float32)."""
    import torch

    want_grad = grads and not case.page
    out = {}
    for name, dt in (("ref", torch.float64), ("pt", _dtype(case))):
        with torch.enable_grad():
            q, k, v = (torch.tensor(data[n], dtype=dt, device=device,
                                    requires_grad=want_grad) for n in ("q", "k", "v"))
            o, lse = _forward(case, data, q, k, v, dt, device)
            if want_grad:
                do = torch.tensor(data["dout"], dtype=dt, device=device)
                dq, dk, dv = torch.autograd.grad(o, (q, k, v), do, allow_unused=True)
                got = tuple(np.zeros(x.shape) if g is None else _np(g, dt)
                            for g, x in ((dq, q), (dk, k), (dv, v)))
                out["grads" if name == "ref" else "grad_pts"] = dict(
                    zip(("dq", "dk", "dv"), got, strict=True))
        out[name], out[name + "_lse"] = _np(o, dt), _np(lse, torch.float64 if name == "ref"
                                                       else torch.float32)
    return out


def _dtype(case: Case):
    import torch

    return torch.bfloat16 if case.dtype == "bf16" else torch.float16


def _np(x, dt) -> np.ndarray:
    import torch

    x = x.detach()
    return x.to(torch.float64 if dt == torch.float64 else torch.float32).cpu().numpy()


def _forward(case: Case, data: dict, q, k, v, dt, device):
    """(out, lse) of the whole batch, one sequence at a time."""
    import torch

    from .modcases import kernel_mods

    score_fn, mask_fn = kernel_mods(case, "torch", device, precise=dt == torch.float64)
    slopes = data.get("alibi_slopes")
    sinks = data.get("learnable_sink")
    seqs = _sequences(case, data, q, k, v)
    outs, lses = [], []
    for b, (qb, kb, vb) in enumerate(seqs):
        sl = None if slopes is None else np.asarray(slopes)[b] if np.ndim(slopes) == 2 \
            else np.asarray(slopes)
        o, lse = _attend(case, qb, kb, vb, dt, device, b, sl, sinks, score_fn, mask_fn)
        outs.append(o)
        lses.append(lse)
    if case.varlen:
        return torch.cat(outs, 0), torch.cat(lses, 1)
    return torch.stack(outs), torch.stack(lses)


def _sequences(case: Case, data: dict, q, k, v) -> list:
    """Each sequence's Q (t, H, d), K and V (s, Hkv, d)."""
    if case.varlen:
        cq, ck = (np.asarray(data[n]) for n in ("cu_seqlens_q", "cu_seqlens_k"))
        return [(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]])
                for b in range(len(cq) - 1)]
    if case.page:
        table, used = np.asarray(data["page_table"]), np.asarray(data["seqused_k"])
        out = []
        for b in range(q.shape[0]):
            pages = list(table[b])
            kb = k[pages].reshape(-1, *k.shape[2:])[:used[b]]
            vb = v[pages].reshape(-1, *v.shape[2:])[:used[b]]
            out.append((q[b], kb, vb))
        return out
    return [(q[b], k[b], v[b]) for b in range(q.shape[0])]


def _attend(case: Case, q, k, v, dt, device, b: int, slopes, sinks, score_fn, mask_fn):
    """One sequence: q (t, H, d), k, v (s, Hkv, d) -> out (t, H, d), lse (H, t)."""
    import torch

    exact = dt == torch.float64

    def rnd(x):
        return x if exact else x.to(dt)

    t, h, d = q.shape
    s, hk = k.shape[0], k.shape[1]
    group = h // hk
    qh = q.transpose(0, 1)
    kh = k.transpose(0, 1).repeat_interleave(group, 0)
    vh = v.transpose(0, 1).repeat_interleave(group, 0)
    sc = rnd(rnd(qh * scale_of(case)) @ kh.transpose(-1, -2))  # (H, t, s)
    if case.softcap is not None:
        cap = case.softcap
        sc = rnd(rnd(torch.tanh(rnd(sc / cap))) * cap)
    i = torch.arange(t, device=device)[None, :, None]
    j = torch.arange(s, device=device)[None, None, :]
    if slopes is not None:
        sl = torch.as_tensor(np.asarray(slopes, np.float64), device=device)
        bias = -(sl[:, None, None] * (i + (s - t) - j).abs())
        sc = rnd(sc + (bias if exact else bias.to(torch.float32).to(dt)))
    if score_fn is not None:
        idx = (torch.tensor(b, device=device), torch.arange(h, device=device)[:, None, None],
               i, j)
        sc = rnd(score_fn(sc if exact else sc.float(), *idx))
    seen = None
    band = make_band(t, s, case.causal, "bottom-right", case.window)
    if band is not None:
        seen = torch.as_tensor(band.visible(0, t, 0, s), device=device)[None]
    if mask_fn is not None:
        mm = mask_fn(torch.tensor(b, device=device), torch.arange(h, device=device)[:, None, None],
                     i, j).expand(h, t, s)
        seen = mm if seen is None else seen & mm
    if seen is not None:
        sc = sc.masked_fill(~seen, -math.inf)
    if sinks is not None:
        col = torch.as_tensor(np.asarray(sinks, np.float64), device=device)
        col = rnd(col if exact else col.to(torch.float32).to(dt))
        sc = torch.cat([sc, col[:, None, None].expand(h, t, 1).to(sc.dtype)], -1)
    empty = torch.isneginf(sc).all(-1, keepdim=True)
    safe = sc.masked_fill(empty, 0.0)
    p = torch.softmax(safe, -1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(safe if exact else safe.float(), -1).masked_fill(empty[..., 0],
                                                                           -math.inf)
    if sinks is not None:
        p = p[..., :s]
    o = rnd(rnd(p) @ vh)
    return o.transpose(0, 1), lse


__all__ = ["baseline"]
