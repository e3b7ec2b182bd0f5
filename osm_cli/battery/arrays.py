"""Arrays a kernel returns, as numpy: torch tensors (on any device) detached and copied to the
CPU in their own dtype (bfloat16 and float8 through ml_dtypes). torch is never imported here
unless an argument already is a torch tensor. Leaves out: judging them (precision/).

Example: as_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype -> bfloat16
"""

from __future__ import annotations

import numpy as np


def as_numpy(x, name: str = "x") -> np.ndarray | None:
    """x as a numpy array: a torch tensor (on any device) detached and copied to the CPU in
    its own dtype (bfloat16 and float8 through ml_dtypes), anything else np.asarray'd; None
    stays None. Example: as_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype -> bfloat16"""
    if x is None:
        return None
    if type(x).__module__.split(".")[0] == "torch":  # torch is imported already: it made x
        return _from_torch(x, name)
    return np.asarray(x)


def _from_torch(t, name: str) -> np.ndarray:
    """A torch tensor's values in its dtype: numpy has float16, 32, 64 and bool; bfloat16 and
    float8 go through float32 (exact) to their ml_dtypes type."""
    import torch

    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    t = t.detach()
    if t.dtype in (torch.float16, torch.float32, torch.float64, torch.bool):
        return t.cpu().numpy()
    from osm_cli.precision.dtypes import DTYPES

    narrow = {torch.bfloat16: "bfloat16"}
    for attr, dt in (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2")):
        if hasattr(torch, attr):
            narrow[getattr(torch, attr)] = dt
    if t.dtype in narrow:
        return t.float().cpu().numpy().astype(DTYPES[narrow[t.dtype]])
    if t.dtype.is_floating_point or t.dtype.is_complex:
        raise TypeError(f"{name}: torch dtype {t.dtype} has no numpy counterpart osm judges")
    return t.cpu().numpy()


__all__ = ["as_numpy"]
