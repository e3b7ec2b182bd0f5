"""PyTorch FlexAttention captures for issue 24: `capture_kernels.py flex` runs this.

torch.compile'd flex_attention in bfloat16 (B = 1, H = 2 or 4, d = 64) with built-in
score_mods and mask_mods, forward (out, and the LSE through return_lse: natural log, float32)
and backward (dq, dk, dv for a seeded dout), at N = 256 (a multiple of the 128 block) and
N = 300 (not one). Each file holds the block mask flex ran with (kv_num_blocks, kv_indices,
full_kv_num_blocks, full_kv_indices; BLOCK_SIZE in meta) and a `meta` JSON string naming the
mods and their parameters exactly (the same text as the mod's code comment below), so osm can
rebuild them: softcap C, ALiBi slopes, window W, document ids, prefix P.

Plus `flex_wrong_block_mask_*`: the causal block mask with one partial tile (the diagonal
tile of the last full Q block) declared full, run through flex: the mask is then not applied
on that tile, and its output differs from the right one (stored beside it).

Leaves out: fp16, other head dims, the FA4 score_mod interface.
"""

from __future__ import annotations

import math
import time
import traceback

import numpy as np

D = 64
SEED = 60


def mods(n: int):
    """(name, score_mod, mask_mod, H, input scale, meta) for sequence length n."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    C = 30.0
    W = 64
    P = 64 if n == 256 else 100
    lens = [100, 1, 90, 65] if n == 256 else [120, 1, 77, 102]
    doc = torch.repeat_interleave(torch.arange(len(lens), device=dev),
                                  torch.tensor(lens, device=dev)).to(torch.int32)
    h4 = 4
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / h4) for h in range(h4)], device=dev)

    def softcap(score, b, h, q_idx, kv_idx):  # C * tanh(score / C)
        return C * torch.tanh(score / C)

    def alibi(score, b, h, q_idx, kv_idx):  # score + slopes[h] * (kv_idx - q_idx)
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):  # kv_idx <= q_idx
        return kv_idx <= q_idx

    def sliding(b, h, q_idx, kv_idx):  # kv_idx <= q_idx and q_idx - kv_idx < W
        return (kv_idx <= q_idx) & (q_idx - kv_idx < W)

    def document(b, h, q_idx, kv_idx):  # doc[q_idx] == doc[kv_idx]
        return doc[q_idx] == doc[kv_idx]

    def prefix_lm(b, h, q_idx, kv_idx):  # kv_idx <= q_idx or kv_idx < P
        return (kv_idx <= q_idx) | (kv_idx < P)

    docs = {"doc_ids": doc.tolist(), "doc_lengths": lens}
    return [
        ("softcap", softcap, None, 2, 3.0,
         {"score_mod": "softcap", "softcap": C, "code": "C * tanh(score / C)"}),
        ("document", None, document, 2, 1.0,
         {"mask_mod": "document", **docs, "code": "doc[q_idx] == doc[kv_idx]"}),
        ("causal", None, causal, 2, 1.0, {"mask_mod": "causal", "code": "kv_idx <= q_idx"}),
        ("alibi", alibi, None, h4, 1.0,
         {"score_mod": "alibi", "alibi_slopes": slopes.tolist(),
          "slopes_rule": "2^(-8 (h + 1) / H)", "code": "score + slopes[h] * (kv_idx - q_idx)"}),
        ("sliding", None, sliding, 2, 1.0,
         {"mask_mod": "sliding", "window": W, "code": "kv_idx <= q_idx and q_idx - kv_idx < W"}),
        ("prefix_lm", None, prefix_lm, 2, 1.0,
         {"mask_mod": "prefix_lm", "prefix": P, "code": "kv_idx <= q_idx or kv_idx < P"}),
        ("softcap_document", softcap, document, 2, 3.0,
         {"score_mod": "softcap", "softcap": C, "mask_mod": "document", **docs,
          "code": "score_mod C * tanh(score / C); mask_mod doc[q_idx] == doc[kv_idx]"}),
    ]


def block_arrays(bm) -> dict:
    out = {}
    for k in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        t = getattr(bm, k, None)
        if t is not None:
            out[k] = t.detach().cpu().numpy().astype(np.int32)
    return out


def wrong_block_mask(bm):
    """The causal block mask with the diagonal tile of Q block 1 (a partial tile) declared
    full: moved from the partial list (kv_indices) to the full list (full_kv_indices)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    kvn, kvi = bm.kv_num_blocks.clone(), bm.kv_indices.clone()
    fn, fi = bm.full_kv_num_blocks.clone(), bm.full_kv_indices.clone()
    qb = 1
    # partial tiles of Q block 1: kvi[..., 1, :kvn]; the diagonal one is kv block 1
    row = kvi[0, 0, qb, : int(kvn[0, 0, qb])].tolist()
    assert 1 in row, row
    keep = [j for j in row if j != 1]
    kvi[:, :, qb, :] = 0
    kvi[:, :, qb, : len(keep)] = torch.tensor(keep, dtype=kvi.dtype) if keep else 0
    kvn[:, :, qb] = len(keep)
    frow = fi[0, 0, qb, : int(fn[0, 0, qb])].tolist() + [1]
    fi[:, :, qb, : len(frow)] = torch.tensor(frow, dtype=fi.dtype)
    fn[:, :, qb] = len(frow)
    return BlockMask.from_kv_blocks(kvn, kvi, fn, fi, BLOCK_SIZE=bm.BLOCK_SIZE,
                                    mask_mod=bm.mask_mod, seq_lengths=bm.seq_lengths)


def run_flex(flex, q, k, v, do, score_mod, bm):
    ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = flex(ql, kl, vl, score_mod=score_mod, block_mask=bm, return_lse=True)
    dq, dk, dv = __import__("torch").autograd.grad(out, (ql, kl, vl), do)
    return out, lse, dq, dk, dv


def cmd_flex(args, writer, env_meta, to_np, log) -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    flex = torch.compile(flex_attention, dynamic=False)
    t_start = time.perf_counter()
    summary = {}
    order = [(n, i) for i in range(7) for n in (300, 256)]
    order.insert(4, ("wrong", 256))
    for n, i in order:
        if time.perf_counter() - t_start > args.deadline_s:
            summary[f"{i}_{n}"] = "skipped: deadline"
            continue
        try:
            if n == "wrong":
                _, _, mm, H, amp, mmeta = mods(256)[2]
                name, sm, N = "wrong_block_mask_causal", None, 256
            else:
                name, sm, mm, H, amp, mmeta = mods(n)[i]
                N = n
            t1 = time.perf_counter()
            gen = torch.Generator(device=dev).manual_seed(SEED + N + 17 * i)

            def rnd(shape, s=1.0, gen=gen):
                return (torch.randn(shape, generator=gen, device=dev) * s).to(torch.bfloat16)

            q, k, v = (rnd((1, H, N, D), amp) for _ in range(3))
            do = rnd((1, H, N, D))
            bm = create_block_mask(mm, None, None, N, N, device=dev) if mm else None
            meta = dict(env_meta(), case=name, N=N, B=1, H=H, d=D, dtype="bfloat16",
                        scale=1 / math.sqrt(D), input_scale=amp, seed=SEED + N + 17 * i,
                        layout="BHND", mods=mmeta, block_size=list(bm.BLOCK_SIZE) if bm else None,
                        call="torch.compile(flex_attention, dynamic=False)(q, k, v, "
                             "score_mod=, block_mask=create_block_mask(mask_mod, None, None, "
                             "N, N), return_lse=True); grads torch.autograd.grad(out, "
                             "(q, k, v), do)",
                        lse="natural log, float32 (B, H, N)",
                        inputs="q, k, v = (randn(float32, Generator(seed)) * input_scale)"
                               ".to(bfloat16) in the order q, k, v, do (do scale 1)")
            arrays = {kk: to_np(x) for kk, x in dict(q=q, k=k, v=v, do=do).items()}
            if n == "wrong":
                good = run_flex(flex, q, k, v, do, None, bm)
                bad_bm = wrong_block_mask(bm)
                bad = run_flex(flex, q, k, v, do, None, bad_bm)
                for tag, r in (("", bad), ("_right", good)):
                    arrays.update({f"{kk}{tag}": to_np(x) for kk, x in
                                   zip(("out", "lse", "dq", "dk", "dv"), r, strict=True)})
                arrays.update(block_arrays(bad_bm))
                arrays.update({f"{kk}_right": a for kk, a in block_arrays(bm).items()})
                meta["wrong"] = ("the causal block mask with Q block 1's diagonal tile (kv "
                                 "block 1, partial) declared full: out/lse/d* are flex's "
                                 "outputs with it; *_right with the right block mask")
                meta["differs"] = bool((bad[0].float() != good[0].float()).any())
            else:
                r = run_flex(flex, q, k, v, do, sm, bm)
                arrays.update({kk: to_np(x) for kk, x in
                               zip(("out", "lse", "dq", "dk", "dv"), r, strict=True)})
                if bm is not None:
                    arrays.update(block_arrays(bm))
            meta["gpu_s_incl_compile"] = time.perf_counter() - t1
            fname = f"flex_{name}_n{N}.npz"
            writer.save(fname, arrays, meta)
            summary[fname] = {"s": round(meta["gpu_s_incl_compile"], 1),
                              **({"differs": meta["differs"]} if "differs" in meta else {})}
            log(f"flex {fname}: {summary[fname]}")
        except Exception as e:  # noqa: BLE001
            summary[f"{i}_{n}"] = f"{type(e).__name__}: {e}"[:600] + traceback.format_exc()[-800:]
            log(f"flex case {i} {n} failed: {summary[f'{i}_{n}'][:300]}")
    return summary


__all__ = ["cmd_flex", "mods", "wrong_block_mask"]
