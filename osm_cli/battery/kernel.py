"""Calling the kernel under test on one case, behind the battery's guards.

The contract (docs/battery.md): `fn(q, k, v, **kw) -> out` or `(out, lse)`, q, k, v torch
tensors (numpy arrays without torch or with arrays="numpy") on the device, in layout bnhd
(FlashAttention's (B, N, H, d)) or bhnd; keywords in FlashAttention's names, only for the
features the kernel declares and the case uses (softmax_scale always); FlexAttention's
`score_mod=` and `mask_mod=` functions (torch for a torch kernel, numpy for a numpy one), or
`block_mask=` (FlexAttention's BlockMask) for a kernel that declares block_mask. With grad, q,
k, v are leaves that require grad and osm calls out.backward(dout); a numpy kernel gives its
gradients through `fn.osm_backward(q, k, v, out, lse, dout, **kw) -> (dq, dk, dv)`.

Guards: every input (and dout) is hashed before and after (a kernel that writes its inputs
fails); an output sharing memory with an input fails; a wrong shape or dtype, a missing LSE, or
an exception is that case's failure with its message; an exception that says the kernel does
not take the shape (NotImplementedError, an AssertionError, or words such as "not supported",
"No available kernel", "No valid autotuner configs") is a refusal, reported apart from wrong
numbers. Leaves out: judging (runner.py), loading a target (adapters.py).

Example: call(target, case, inputs(case)).out.shape
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .cases import Case, scale_of
from .draw import Declared

LAYOUTS = ("bnhd", "bhnd")
ARRAYS = ("torch", "numpy")
DEVICES = ("cpu", "cuda")
AUX = ("alibi_slopes", "learnable_sink", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
       "page_table")


@dataclass(frozen=True)
class Target:
    """A kernel and what it declares: features, head dims and dtypes (draw.Declared), the base
    of its LSE, the layout and kind of arrays it takes, the device."""

    fn: Callable
    name: str
    declared: Declared = Declared()
    lse_base: str = "e"
    layout: str = "bnhd"
    arrays: str = "torch"
    device: str = "cpu"
    reference: str = "numpy"  # where osm's reference and baseline are computed (torchref.py)

    def has(self, feature: str) -> bool:
        return feature in self.declared.features


@dataclass
class Call:
    """What one call gave, as numpy arrays in the kernel's dtype (LSE float64, natural log),
    or why it counts as a failure (error: the kernel's exception or a guard's message)."""

    out: np.ndarray | None = None
    lse: np.ndarray | None = None
    grads: dict = field(default_factory=dict)  # dq, dk, dv
    error: str = ""
    refused: bool = False  # the error is the kernel saying it does not take this shape
    lost: bool = False  # the kernel's error left the GPU unusable for the rest of the process
    seconds: float = 0.0


# what kernels say when a shape or option is outside what they take (PyTorch's SDPA
# dispatcher, Triton's autotuner, FlashAttention's and CUTLASS's checks)
REFUSALS = re.compile(
    r"not (?:yet )?(?:supported|implemented)|unsupported|no available kernel|no valid "
    r"autotuner config|only supports?\b|does not support|must be (?:a )?(?:multiple|divisible"
    r"|at least|at most|equal|one of|<=|>=|less|greater|the same)|should be (?:a )?multiple|"
    r"(?:is|are) required to be|expected .* to be (?:a )?multiple", re.IGNORECASE)


# CUDA's sticky errors: after one, every later call in the process fails (osm's own too)
STICKY = ("illegal memory access", "illegal address", "unspecified launch failure",
          "misaligned address", "device-side assert", "illegal instruction")


def lost_device(exc: BaseException, target: Target) -> bool:
    """Whether the kernel's exception left the GPU's context unusable: its message names one
    of CUDA's sticky errors, or the device no longer synchronizes."""
    if any(s in str(exc).lower() for s in STICKY):
        return True
    if target.device != "cuda" or target.arrays != "torch":
        return False
    try:
        import torch

        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return True
    return False


def refusal(exc: BaseException) -> bool:
    """Whether an exception raised by a kernel says it does not take the case (a refusal)
    rather than that it broke: NotImplementedError, AssertionError (a kernel's entry checks),
    or a message in REFUSALS' words."""
    if isinstance(exc, (NotImplementedError, AssertionError)):
        return True
    return bool(REFUSALS.search(str(exc)))


def _np_dtype(name: str):
    from osm_cli.precision.dtypes import DTYPES

    return DTYPES["bfloat16" if name == "bf16" else "float16"]


def _torch_dtype(name: str):
    import torch

    return torch.bfloat16 if name == "bf16" else torch.float16


def kwargs_for(target: Target, case: Case, data: dict, conv: Callable) -> dict:
    """FlashAttention's keywords for the features the case uses (the kernel declares them)."""
    kw: dict = {"softmax_scale": scale_of(case)}
    if case.causal:
        kw["causal"] = True
    if case.window is not None:
        kw["window_size"] = tuple(case.window)
    if case.softcap is not None:
        kw["softcap"] = float(case.softcap)
    for name in AUX:
        if name in data:
            kw[name] = conv(data[name])
    if case.varlen:
        kw["max_seqlen_q"], kw["max_seqlen_k"] = data["max_seqlen_q"], data["max_seqlen_k"]
    if case.score_mod or case.mask_mod:
        from .modcases import block_mask, kernel_mods

        score, mask = kernel_mods(case, target.arrays, target.device)
        if score is not None:
            kw["score_mod"] = score
        if mask is not None:
            if target.has("block_mask"):
                kw["block_mask"] = block_mask(mask, case, target.device)
            else:
                kw["mask_mod"] = mask
    return kw


def _digest(x) -> bytes:
    if type(x).__module__.split(".")[0] == "torch":
        import torch

        x = x.detach()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.view(torch.int16)
        x = x.cpu().numpy()
    return hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=16).digest()


def _shares(a, b) -> bool:
    if type(a).__module__.split(".")[0] == "torch":
        try:
            sa, sb = a.untyped_storage(), b.untyped_storage()
        except (AttributeError, RuntimeError):
            return False
        lo_a, lo_b = sa.data_ptr(), sb.data_ptr()
        return lo_a < lo_b + sb.nbytes() and lo_b < lo_a + sa.nbytes()
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.shares_memory(a, b)


def call(target: Target, case: Case, data: dict) -> Call:
    """Run the kernel on the case's inputs (cases.inputs) behind the guards."""
    from .arrays import as_numpy

    torch_arrays = target.arrays == "torch"
    grad = target.has("grad") and not case.page
    if torch_arrays:
        import torch

        dev = target.device
        dt = _torch_dtype(case.dtype)

        def conv(x):
            if isinstance(x, np.ndarray):
                return torch.from_numpy(x).to(dev)
            return x

        def tensor(x):
            return torch.from_numpy(x).to(device=dev, dtype=dt)
    else:
        dt = _np_dtype(case.dtype)

        def conv(x):
            return x

        def tensor(x):
            return x.astype(dt)
    dense = not case.varlen
    qkv = []
    for name in ("q", "k", "v"):
        x = tensor(data[name])
        if target.layout == "bhnd" and dense and not (case.page and name != "q"):
            x = x.transpose(1, 2) if torch_arrays else x.swapaxes(1, 2)
            x = x.contiguous() if torch_arrays else np.ascontiguousarray(x)
        if grad and torch_arrays:
            x.requires_grad_(True)
        qkv.append(x)
    q, k, v = qkv
    dout = tensor(data["dout"])
    if target.layout == "bhnd" and dense:
        dout = dout.transpose(1, 2).contiguous() if torch_arrays else \
            np.ascontiguousarray(dout.swapaxes(1, 2))
    res = Call()
    try:
        kw = kwargs_for(target, case, data, conv)
    except Exception as exc:  # making FlexAttention's block mask can fail on its own
        res.error = f"osm could not make the case's keywords: {type(exc).__name__}: " \
                    f"{_one_line(exc)}"
        return res
    watched = {"q": q, "k": k, "v": v, "dout": dout,
               **{n: x for n, x in kw.items() if n in AUX}}
    before = {n: _digest(x) for n, x in watched.items()}
    t0 = time.perf_counter()
    try:
        got = target.fn(q, k, v, **kw)
        out, lse = (got[0], got[1]) if isinstance(got, (tuple, list)) else (got, None)
        res.error = _check_out(out, q, case, target, lse, torch_arrays)
        if not res.error and grad:
            grads = _backward(target, q, k, v, out, lse, dout, kw, torch_arrays)
            if isinstance(grads, str):
                res.error = grads
            else:
                res.grads = grads
        if torch_arrays and target.device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the kernel's own failure is this case's, not the battery's
        res.error = f"the kernel raised {type(exc).__name__}: {_one_line(exc)}"
        res.lost = lost_device(exc, target)
        res.refused = refusal(exc) and not res.lost
    res.seconds = time.perf_counter() - t0
    if res.lost:  # nothing more can be read from the device, the inputs' hashes neither
        return res
    wrote = [n for n, x in watched.items() if _digest(x) != before[n]]
    if wrote and not res.error:
        res.error = f"the kernel wrote its inputs: {', '.join(wrote)} changed during the call"
    if res.error:
        return res
    if any(_shares(out, x) for x in (q, k, v)):
        res.error = "the output shares memory with an input (q, k or v)"
        return res
    res.out = _bnhd(as_numpy(out, "out"), target, dense)
    if lse is not None:
        lse64 = np.asarray(as_numpy(lse, "lse"), dtype=np.float64)
        res.lse = lse64 * math.log(2) if target.lse_base == "2" else lse64
    res.grads = {n: _bnhd(as_numpy(g, n), target, dense and not (case.page and n != "dq"))
                 for n, g in res.grads.items()}
    return res


def _bnhd(x: np.ndarray, target: Target, dense: bool) -> np.ndarray:
    return x.swapaxes(1, 2) if target.layout == "bhnd" and dense else x


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("…" if len(text) > 300 else "")


def _check_out(out, q, case: Case, target: Target, lse, torch_arrays: bool) -> str:
    """'' when out (and lse) have the shapes and dtype the contract says; else why not."""
    want = tuple(q.shape)
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        return f"the kernel returned {type(out).__name__}, not an array"
    if tuple(out.shape) != want:
        return f"out has shape {tuple(out.shape)}; q {want} gives {want}"
    if out.dtype != q.dtype:
        return f"out has dtype {out.dtype}; the inputs are {q.dtype}"
    if target.has("lse"):
        if lse is None:
            return "the kernel declares lse but returned out alone"
        h, rows = want[-2], want[0]
        if case.varlen:
            shapes = [(h, rows)]
        else:
            b, n = (want[0], want[2]) if target.layout == "bhnd" else (want[0], want[1])
            shapes = [(b, h, n)]
        if tuple(lse.shape) not in shapes:
            return f"lse has shape {tuple(lse.shape)}; it must be {shapes[0]}"
    return ""


def _backward(target: Target, q, k, v, out, lse, dout, kw: dict, torch_arrays: bool):
    """(dq, dk, dv) for dout, or why there are none."""
    if torch_arrays:
        if not out.requires_grad:
            return "the kernel declares grad but its output is not differentiable"
        out.backward(dout)
        missing = [n for n, x in (("dq", q), ("dk", k), ("dv", v)) if x.grad is None]
        if missing:
            return f"backward left {', '.join(missing)} empty"
        return {"dq": q.grad, "dk": k.grad, "dv": v.grad}
    back = getattr(target.fn, "osm_backward", None)
    if back is None:
        return "the kernel declares grad, but numpy arrays have no autograd: give it " \
               "osm_backward(q, k, v, out, lse, dout, **kw)"
    dq, dk, dv = back(q, k, v, out, lse, dout, **kw)
    for name, g, x in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if np.shape(g) != np.shape(x):
            return f"{name} has shape {np.shape(g)}; it must be {np.shape(x)}"
    return {"dq": dq, "dk": dk, "dv": dv}
