"""Real kernels' captured cases (benchmarks/capture_kernels.py's files) as osm's inputs.

A case is one kernel's run on one input: the arrays (q, k, v, do, out, lse, dq, dk, dv, and
the kernels' extras), the dtype, and the keyword arguments that give osm the same conventions
(causal and its alignment, layout, window, softcap, sinks, varlen, paged KV). Both naming
schemes of capture_kernels.py are read: the small self-contained files (samples/kernels/) and
the medium cases split into _inputs / _<backend> / _ref32 (or FA4's _ref) files.

Example: for case in load_cases("samples/kernels"): print(case.name, case.kernel, case.dtype)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BACKENDS = ("flash", "efficient", "cudnn")
KERNEL_OF = {"flash": "SDPA flash (FA2)", "efficient": "SDPA mem-efficient",
             "cudnn": "SDPA cuDNN", "fa4": "FlashAttention-4 (SM90)"}


@dataclass
class Case:
    name: str  # e.g. "causal" or "med_n1024"
    kernel: str  # flash, efficient, cudnn or fa4
    dtype: str  # float16 or bfloat16
    arrays: dict
    meta: dict
    opts: dict = field(default_factory=dict)  # osm's keyword arguments for this case

    @property
    def label(self) -> str:
        return f"{self.kernel}/{self.dtype}/{self.name}"

    @property
    def has_grads(self) -> bool:
        return all(n in self.arrays for n in ("do", "dq", "dk", "dv"))


def _meta(z) -> dict:
    return json.loads(str(z["meta"])) if "meta" in z.files else {}


def _load(path: Path) -> tuple[dict, dict]:
    with np.load(path) as z:
        return {n: z[n] for n in z.files if n != "meta"}, _meta(z)


def _opts(meta: dict, kind: str) -> dict:
    """osm's keywords for a capture: SDPA is (B, H, N, d) with top-left causal; FA4 is
    (B, N, H, d) (or packed) with bottom-right causal."""
    if kind != "fa4":
        return {"causal": bool(meta.get("causal")), "causal_align": "top-left"}
    o = {"causal": bool(meta.get("causal")), "layout": "bnhd"}
    win = meta.get("window_size") or [None, None]
    if any(w is not None for w in win):
        o["window"] = tuple(-1 if w is None else int(w) for w in win)
    if meta.get("softcap"):
        o["softcap"] = float(meta["softcap"])
    return o


def _fa4_arrays(arrays: dict, opts: dict) -> dict:
    """FA4's extras under osm's names: learnable_sink → sinks, varlen and paged arrays."""
    if "learnable_sink" in arrays:
        opts["sinks"] = arrays["learnable_sink"]
    for name in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table"):
        if name in arrays:
            opts[name] = arrays[name]
    if "k_cache" in arrays:
        arrays = {**arrays, "k": arrays["k_cache"], "v": arrays["v_cache"]}
    return arrays


def load_cases(folder: str | Path) -> list[Case]:
    """Every captured case of a folder, SDPA ones first, sorted by name."""
    folder = Path(folder)
    cases = []
    for path in sorted(folder.glob("*.npz")):
        name = path.stem
        m = re.fullmatch(r"sdpa_(flash|efficient|cudnn)_(float16|bfloat16|fp16|bf16)_(\w+)",
                         name)
        if m:
            backend, dt, case = m.groups()
            arrays, meta = _load(path)
            ref = folder / f"sdpa_ref_{dt}_{case}.npz"
            if ref.exists():
                arrays.update(_load(ref)[0])
            cases.append(Case(case, backend, meta["dtype"], arrays, meta, _opts(meta, backend)))
            continue
        m = re.fullmatch(r"sdpa_(med_\w+)_(fp16|bf16)_inputs", name)
        if m:
            case, dt = m.groups()
            base, meta = _load(path)
            ref32 = folder / f"sdpa_{case}_{dt}_ref32.npz"
            extra = _load(ref32)[0] if ref32.exists() else {}
            for backend in BACKENDS:
                part = folder / f"sdpa_{case}_{dt}_{backend}.npz"
                if part.exists():
                    arrays, bmeta = _load(part)
                    cases.append(Case(case, backend, meta["dtype"], {**base, **extra, **arrays},
                                      bmeta, _opts(bmeta, backend)))
            continue
        m = re.fullmatch(r"fa4_(\w+?)_(bf16|fp16)", name)
        if m:
            case = m.group(1)
            arrays, meta = _load(path)
            ref = folder / f"{name}_ref.npz"
            if ref.exists():
                arrays.update(_load(ref)[0])
            opts = _opts(meta, "fa4")
            arrays = _fa4_arrays(arrays, opts)
            cases.append(Case(case, "fa4", meta["dtype"], arrays, meta, opts))
    return cases


__all__ = ["BACKENDS", "KERNEL_OF", "Case", "load_cases"]
