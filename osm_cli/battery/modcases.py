"""The battery's score_mod and mask_mod cases (issue 24): FlexAttention's built-ins, spelled in a
case ID, made three ways from one spec — osm's numpy ScoreMod / MaskMod (flash/mods.py) for the
reference, the same function on numpy arrays for a numpy kernel, and in torch for a torch
kernel (FlexAttention's `score_mod(score, b, h, q_idx, kv_idx)` and `mask_mod(b, h, q_idx,
kv_idx)`, which work under its vmap and on broadcast index tensors alike) — and FlexAttention's
BlockMask of the mask, for a kernel that declares `block_mask`.

Specs (a case's `score_mod` / `mask_mod` fields; masks joined by `+` are and-ed):
  softcap.C, alibi (ALiBi's standard slopes), relbias (a seeded (H, 2N − 1) table by q − kv);
  causal (top-left, FlexAttention's), sliding.W, doc.L1.L2… (packed documents of those
  lengths; positions past their sum belong to the last), prefix.P, chunked.C.
Every parameter array comes from the case alone (its seed), so an ID replays exactly.
Leaves out: drawing the cases (draw.py), calling the kernel (kernel.py).

Example: numpy_mods(Case(1, 2, 2, 300, 300, 64, mask_mod="doc.1.120+causal"))[1].name
"""

from __future__ import annotations

import re

import numpy as np

from osm_cli.errors import InputError
from osm_cli.flash import mods

SCORE_SPECS = ("softcap", "alibi", "relbias")
MASK_SPECS = ("causal", "sliding", "doc", "prefix", "chunked")
_ONE = re.compile(r"(softcap)\.(\d+(?:\.\d+)?)|(alibi|relbias)")
_MASK = re.compile(r"(causal)|(sliding|prefix|chunked)\.(\d+)|(doc)((?:\.\d+)+)")


def check_spec(spec: str, kind: str) -> str:
    """spec, or an InputError when it is not a battery mod spec of `kind` (score, mask)."""
    if not spec:
        return spec
    parts = [spec] if kind == "score" else spec.split("+")
    pattern = _ONE if kind == "score" else _MASK
    if not all(pattern.fullmatch(p) for p in parts):
        known = SCORE_SPECS if kind == "score" else MASK_SPECS
        raise InputError(f"{spec!r} is not a battery {kind}_mod ({', '.join(known)})")
    return spec


def doc_ids(spec: str, n: int) -> np.ndarray:
    """Document ids of n packed positions: doc.1.120.7 is documents of 1, 120 and 7 positions;
    positions past their sum belong to the last."""
    lens = [int(x) for x in spec.split(".")[1:]]
    ids = np.repeat(np.arange(len(lens)), lens)[:n]
    return np.concatenate([ids, np.full(n - ids.size, len(lens) - 1)]).astype(np.int64)


def _table(case) -> np.ndarray:
    """relbias's (H, 2·max(N_q, N_k) − 1) table, from the case's seed."""
    width = 2 * max(case.nq, case.nk, 1) - 1
    return np.random.default_rng(case.seed + 1).normal(0.0, 0.5, (case.h, width))


def _params(case) -> dict:
    """The arrays the case's mods read: ALiBi's slopes, relbias's table, document ids."""
    out = {}
    if case.score_mod == "alibi":
        out["slopes"] = mods.alibi_standard(case.h)
    if case.score_mod == "relbias":
        out["table"] = _table(case)
    for part in case.mask_mod.split("+") if case.mask_mod else ():
        if part.startswith("doc"):
            out["doc"] = doc_ids(part, max(case.nq, case.nk))
    return out


def numpy_mods(case):
    """(ScoreMod or None, MaskMod or None): osm's float64 reference's mods for the case."""
    p = _params(case)
    score = None
    if case.score_mod.startswith("softcap"):
        score = mods.softcap(float(case.score_mod.split(".", 1)[1]))
    elif case.score_mod == "alibi":
        score = mods.alibi(p["slopes"])
    elif case.score_mod == "relbias":
        score = mods.relative_bias(p["table"])
    masks = []
    for part in case.mask_mod.split("+") if case.mask_mod else ():
        name, _, arg = part.partition(".")
        if name == "causal":
            masks.append(mods.causal())
        elif name == "sliding":
            masks.append(mods.sliding(int(arg)))
        elif name == "prefix":
            masks.append(mods.prefix_lm(int(arg)))
        elif name == "chunked":
            masks.append(mods.chunked(int(arg)))
        else:
            masks.append(mods.document(p["doc"]))
    return score, (mods.all_of(*masks) if masks else None)


def kernel_mods(case, arrays: str, device: str = "cpu", precise: bool = False):
    """(score_mod, mask_mod) as the kernel is handed them: numpy functions for a numpy kernel
    (osm's own), torch functions with their tables on `device` for a torch one (float32
    tables, as a kernel holds them; precise: float64, for osm's torch reference)."""
    if arrays == "numpy":
        score, mask = numpy_mods(case)
        return (None if score is None else score.fn), (None if mask is None else mask.fn)
    import torch

    p = {n: torch.as_tensor(x, device=device) for n, x in _params(case).items()}
    real = torch.float64 if precise else torch.float32
    score = None
    if case.score_mod.startswith("softcap"):
        cap = float(case.score_mod.split(".", 1)[1])

        def score(s, b, h, q_idx, kv_idx):
            return cap * torch.tanh(s / cap)
    elif case.score_mod == "alibi":
        slopes = p["slopes"].to(real)

        def score(s, b, h, q_idx, kv_idx):
            return s + slopes[h] * (kv_idx - q_idx)
    elif case.score_mod == "relbias":
        table, mid = p["table"].to(real), p["table"].shape[1] // 2

        def score(s, b, h, q_idx, kv_idx):
            return s + table[h, q_idx - kv_idx + mid]
    parts = [_torch_mask(part, p) for part in case.mask_mod.split("+")] if case.mask_mod \
        else []
    mask = None
    if parts:
        def mask(b, h, q_idx, kv_idx):
            ok = parts[0](b, h, q_idx, kv_idx)
            for more in parts[1:]:
                ok = ok & more(b, h, q_idx, kv_idx)
            return ok
    return score, mask


def _torch_mask(part: str, p: dict):
    name, _, arg = part.partition(".")
    if name == "causal":
        return lambda b, h, q, kv: q >= kv
    if name == "sliding":
        w = int(arg)
        return lambda b, h, q, kv: (q >= kv) & (q - kv <= w)
    if name == "prefix":
        n = int(arg)
        return lambda b, h, q, kv: (kv < n) | (q >= kv)
    if name == "chunked":
        c = int(arg)
        return lambda b, h, q, kv: q // c == kv // c
    ids = p["doc"]
    return lambda b, h, q, kv: ids[q] == ids[kv]


def block_mask(mask_fn, case, device: str):
    """FlexAttention's BlockMask of a torch mask_mod for the case (its default 128 × 128
    blocks, every batch and head alike)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_fn, None, None, case.nq, case.nk, device=device)


def unscaled(score_mod, scale: float):
    """score_mod as a kernel computes it that applies it to q·k before softmax_scale (the
    probe's alternative): x ↦ scale·f(x / scale)."""
    def fn(s, b, h, q_idx, kv_idx):
        return scale * score_mod.fn(s / scale, b, h, q_idx, kv_idx)

    return mods.ScoreMod(fn, f"{score_mod.name} on q·k")


def tail_unmasked(mask_mod, nk: int, block: int):
    """mask_mod as a kernel applies it whose block mask declares the last, partial K/V tile of
    `block` keys full (the probe's alternative): every key of that tile seen."""
    start = (nk - 1) // block * block

    def fn(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) | (kv_idx >= start)

    return mods.MaskMod(fn, f"{mask_mod.name}, last tile of {block} full")


__all__ = ["MASK_SPECS", "SCORE_SPECS", "block_mask", "check_spec", "doc_ids", "kernel_mods",
           "numpy_mods", "tail_unmasked", "unscaled"]
