"""Writes the planted-bug bundles of docs/check.md from tests/kernels/planted.py (run from the
repository root: python samples/planted/make.py); tests/io/test_check_names.py checks that they
are what the kernels give. Each holds what flash_attn_func returns beside its inputs: q, k, v
(B, N, H, d), out and softmax_lse (B, H, N), bf16 values stored as float32."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent
CASES = {  # file -> (bug, N, causal)
    "lse_base2_bf16.npz": ("lse_base2", 128, True),
    "double_count_bf16.npz": ("double_count", 256, False),
}


def arrays(bug: str, n: int, causal: bool) -> dict[str, np.ndarray]:
    sys.path.insert(0, str(HERE.parent.parent))
    from tests.kernels.planted import planted

    rng = np.random.default_rng(22)
    q, k, v = (rng.standard_normal((1, n, 2, 32)).astype(ml_dtypes.bfloat16) for _ in range(3))
    out, lse = planted(bug)(q, k, v, causal=causal)
    return {"q": q.astype(np.float32), "k": k.astype(np.float32), "v": v.astype(np.float32),
            "out": out.astype(np.float32), "softmax_lse": lse}


if __name__ == "__main__":
    for name, case in CASES.items():
        np.savez_compressed(HERE / name, **arrays(*case))
