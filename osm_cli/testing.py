"""`assert_attention_close`: osm check as one line in a kernel's own pytest suite.

In the habit of torch.testing.assert_close: silent when the kernel's output (and LSE, and
gradients dq, dk, dv for an upstream gradient do) meet FlashAttention's test rules against the
float64 reference of the dtype-rounded inputs (docs/numerics.md#precision-model, #grad-rule;
precision/check.py judges), an AssertionError carrying osm check's report as text (each verdict
with its bound, the worst rows and heads) when they do not. Arrays may be numpy arrays or torch
tensors on any device; torch is never imported here unless an argument already is a torch
tensor (then its dtype is kept: bfloat16 becomes ml_dtypes.bfloat16, float8 ml_dtypes' float8).

Leaves out: the rules and the judging (precision/), files (io/), the command line (cli/).

Example:
    from osm_cli.testing import assert_attention_close
    assert_attention_close(out, q, k, v, lse=lse, causal=True)   # passes silently
"""

from __future__ import annotations

import numpy as np

from osm_cli.precision.names import KERNELS  # the kernel presets (precision/presets.py)

GRADIENTS = ("do", "dq", "dk", "dv")


def assert_attention_close(out, q, k, v, *, lse=None, do=None, dq=None, dk=None, dv=None,
                           dtype=None, kernel: str | None = None, mma: str = "blas",
                           causal: bool = False,
                           causal_align: str = "bottom-right", window=None, mask=None,
                           scale: float | None = None, layout: str = "bhnd",
                           grad_rule: str = "fa3", top: int = 5,
                           msg: str | None = None) -> None:
    """Raise AssertionError, with osm check's report, unless `out` (and `lse`) are what a
    faithful FlashAttention kernel computes for q, k, v.

    dtype: the kernel's dtype ("bf16", "fp16", …; default: out's own). kernel: the preset
    whose model the report shows beside (fa2, fa4, fa4-sm100, tiles; default fa2 for 16-bit,
    fa4-sm100 for FP8; an unknown name is a ValueError naming the known ones); mma: its
    matmuls, "blas" or "tensor-core". causal, causal_align, window, mask,
    scale, layout: as `osm check` takes them (layout "bnhd" for FlashAttention's (B, N, H, d),
    whose LSE may stay (B, H, N)). dq, dk, dv (any of them, with do) are judged by grad_rule,
    "fa3" (FA3/FA4's tests) or "fa2". top: the worst rows and heads the report lists; msg: a
    line put before it. Inputs osm cannot judge (shapes that do not fit, values that overflow
    the dtype, gradients without do) raise osm's OsmError.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's
    from osm_cli.precision.check import check, output_dtype
    from osm_cli.present.console import as_text
    from osm_cli.present.verdicts import check_report, fail_line

    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    grads = {n: as_numpy(g, n) for n, g in zip(GRADIENTS, (do, dq, dk, dv), strict=True)
             if g is not None}
    o = as_numpy(out, "out")
    q, k, v = (as_numpy(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    rep = check(o, q, k, v, dtype if dtype is not None else output_dtype(o, "out"),
                lse=as_numpy(lse, "lse"), top=top, causal=causal, causal_align=causal_align,
                window=window, mask=as_numpy(mask, "mask"), scale=scale, layout=layout,
                grad_rule=grad_rule, kernel=kernel, mma=mma, **grads)
    if rep.passed:
        return
    head = f"{msg}\n" if msg else ""
    raise AssertionError(f"{head}attention output fails FlashAttention's test rule: "
                         f"{fail_line(rep)}\n\n{as_text(check_report(rep, 'out', top))}")


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


__all__ = ["KERNELS", "as_numpy", "assert_attention_close"]
