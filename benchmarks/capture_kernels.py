"""Capture real attention kernels' inputs and outputs on a CUDA GPU, once, as .npz files.

All later modelling (osm's precision presets, the FA test rules, the backward model) can then
run on a CPU against these files. Needs torch with CUDA; `fa4` also needs flash-attn-4
(flash_attn.cute) and its CuTe DSL wheels; `sdpa` only needs FA4's testing.py (for
`attention_ref`, FlashAttention's own reference), found with --fa4-testing or on sys.path.
Leaves out: numerics (this program computes no error statistics), FP8, dropout, ALiBi.

Subcommands
  sdpa   PyTorch scaled_dot_product_attention backends: flash (FlashAttention-2), efficient
         (memory-efficient, CUTLASS), cudnn; forward and backward, float16 and bfloat16.
  fa4    FlashAttention-4 (flash_attn.cute) forward and backward: plain, causal (bottom-right,
         t < s), GQA, softcap, learnable_sink, sliding window, varlen (a zero-length
         sequence too), paged KV, one combination; medium cases for statistics. Cases run in
         a priority order and stop at --deadline-s; every case is written as soon as it ends,
         and a case that raises is recorded (fa4_summary.json) with its message.
  flex   PyTorch FlexAttention (torch.compile'd flex_attention, bf16): built-in score_mods
         and mask_mods with their block masks, forward and backward, N = 256 and 300, and a
         deliberately wrong block mask (benchmarks/capture_flex.py says which).
  ship   pack captured files into at most 8 tars of < 16 MiB under $OUT, in priority order,
         remembering what went already (for the device tool's return limits).
  shrink keep the first query heads of a capture (each head is independent, so the slice is
         still exactly the kernel's output) and drop arrays by name (--drop 'out_ref32' ...);
         used to keep the committed samples (samples/kernels/) small.

Files (inputs drawn with a seeded torch.Generator on the GPU: randn × input scale, then cast)
  sdpa_<backend>_<dtype>_<case>.npz  small: q, k, v, do (upstream gradient), out, lse
      (natural log, float32, from the backend's aten op; omitted when unobtainable), dq, dk, dv
  sdpa_ref_<dtype>_<case>.npz        small: out_pt, dq_pt, dk_pt, dv_pt (plain attention in
      the input dtype, FA's attention_ref(upcast=False, reorder_ops=True)), out_ref32,
      dq_ref32, dk_ref32, dv_ref32 (float32-upcast attention, results cast to the dtype:
      FA's tests compare to these), lse_ref32 (float32); same inputs as the backend files
  sdpa_<case>_<dtype>_inputs.npz / _<backend>.npz / _ref32.npz   medium cases, split so each
      file stays under 16 MiB: inputs + pt, each backend's outputs, the float32 references
  fa4_<case>_<dtype>.npz (+ _ref.npz for medium cases)   FA4, layout (B, N, H, d) or packed
      varlen (total, H, d); lse (B, H, t) or (H, total_q); dsink with learnable_sink.
Every file has `meta`: a JSON string (case, backend, dtype, causal and its alignment, scale,
layout, shapes, torch / CUDA / GPU, how each array was made, what failed and why).
float16 is stored as float16; bfloat16 as float32 (exact). PyTorch's is_causal is top-left,
FA4's causal is bottom-right (key j visible to query i iff j <= i + s - t).

Usage (on the GPU machine):
  python capture_kernels.py sdpa --out /root/cap [--small-only] [--only CASE ...]
        [--backends flash] [--repeat 4] [--kernel-names] [--no-ref-file]
  python capture_kernels.py fa4 --out /root/cap --site /root/site [--only plain_bf16 ...]
  python capture_kernels.py ship --src /root/cap --dst $OUT
  python capture_kernels.py shrink IN.npz OUT.npz --heads 1 [--drop 'd?_ref32' out_ref32]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import json
import math
import os
import sys
import tarfile
import time
import traceback
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

T0 = time.perf_counter()


def log(*a) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------- saving
def to_np(t):
    """A torch tensor as numpy: float16 stays float16, bfloat16 becomes float32 (exact)."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device() -> str:
    """cuda, or cpu for a dry run of the flow (the CUDA-only backends then record errors)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def save_npz(path: Path, arrays: dict, meta: dict, level: int = 3) -> int:
    """Write an .npz (zip, deflate level `level`) holding `arrays` and `meta` as a JSON string."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as z:
        for name, a in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(a), allow_pickle=False)
        with z.open("meta.npy", "w") as f:
            np.lib.format.write_array(f, np.array(json.dumps(meta, sort_keys=True)))
    os.replace(tmp, path)
    return path.stat().st_size


class Writer:
    """Saves files on a few threads (zlib releases the GIL), so compression overlaps the GPU."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.pool = ThreadPoolExecutor(8)
        self.jobs = []

    def save(self, name: str, arrays: dict, meta: dict) -> None:
        arrays = {k: v for k, v in arrays.items() if v is not None}
        meta = dict(meta, file=name, arrays={k: [str(v.dtype), list(v.shape)]
                                             for k, v in arrays.items()})
        self.jobs.append((name, self.pool.submit(save_npz, self.out / name, arrays, meta)))

    def close(self) -> None:
        for name, job in self.jobs:
            log(f"wrote {name} ({job.result() / 1e6:.2f} MB)")
        self.pool.shutdown()


def env_meta() -> dict:
    import torch

    m = {"torch": torch.__version__, "cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
         "captured_by": "benchmarks/capture_kernels.py",
         "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if torch.cuda.is_available():
        m["gpu"] = torch.cuda.get_device_name()
        m["capability"] = list(torch.cuda.get_device_capability())
    return m


def err_text(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) < 800 else s[:800] + " ..."


# ----------------------------------------------------------------------------- references
def load_attention_ref(path: str | None):
    """FlashAttention's test reference (flash_attn/cute/testing.py: attention_ref), by path,
    so that neither cutlass nor the FA4 kernels need to import."""
    cands = [path] if path else []
    for p in sys.path:
        cands.append(os.path.join(p, "flash_attn", "cute", "testing.py"))
    for c in cands:
        if c and os.path.exists(c):
            spec = importlib.util.spec_from_file_location("fa4_testing", c)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod.attention_ref, c
    raise SystemExit("attention_ref not found: pass --fa4-testing .../flash_attn/cute/testing.py")


REF_DOC = {
    "pt": "attention_ref(q, k, v, upcast=False, reorder_ops=True): the same-dtype plain "
          "attention of FA's tests (scores = q @ (k*scale) in the dtype, softmax in the dtype, "
          "P cast to the dtype, P @ v in the dtype); grads by autograd in the dtype",
    "ref32": "attention_ref(q, k, v, upcast=True): float32 attention, out and grads cast "
             "to the input dtype (as FA's tests use them); lse_ref32 float32 (attention_ref "
             "called again with float32 inputs, since it rounds its lse to v's dtype)",
    "lse_pt": "attention_ref's lse in the input dtype (FA4 captures only)",
}


# ----------------------------------------------------------------------------- SDPA
# (name, B, Hq, Hkv, t, s, d, causal, input scale, seed, small)
SDPA_CASES = [
    ("causal", 1, 2, 2, 128, 128, 64, True, 1.0, 11, True),
    ("noncausal", 1, 2, 2, 128, 128, 64, False, 1.0, 12, True),
    ("rect", 1, 2, 2, 64, 200, 64, False, 1.0, 13, True),
    ("gqa", 1, 4, 2, 128, 128, 64, False, 1.0, 14, True),
    ("d128", 1, 2, 2, 96, 96, 128, False, 1.0, 15, True),
    # issue 25: fresh shapes, not used while tuning the presets
    ("new_causal_d96", 1, 2, 2, 320, 320, 96, True, 1.0, 51, True),
    ("new_rect_gqa_d80", 1, 4, 2, 250, 704, 80, False, 1.0, 52, True),
    ("med_n1024", 1, 8, 8, 1024, 1024, 64, False, 1.0, 21, False),
    ("med_n1024_causal", 1, 8, 8, 1024, 1024, 64, True, 1.0, 22, False),
    ("med_rect_d128", 2, 4, 4, 512, 1024, 128, False, 1.0, 23, False),
    ("med_n2048_d32_causal_x2", 1, 4, 4, 2048, 2048, 32, True, 2.0, 24, False),
    # decoding shapes: FA2's split-KV path (num_splits_heuristic picks > 1 split here)
    ("med_decode_t1_s2048", 1, 2, 2, 1, 2048, 64, False, 1.0, 25, False),
    ("med_splitkv_t64_s2048", 1, 2, 2, 64, 2048, 64, False, 1.0, 26, False),
    # issue 25, small split-KV cases to commit (few Q tiles, long K: 2 to 12 splits on 132
    # SMs); no shrinking, since the split count depends on the heads
    ("splitkv_t64_s2048", 1, 1, 1, 64, 2048, 64, False, 1.0, 61, True),
    ("splitkv_gqa_t128_s3000_d32", 1, 2, 1, 128, 3000, 32, False, 1.0, 62, True),
    ("splitkv_t16_s1024_d128", 1, 1, 1, 16, 1024, 128, False, 1.0, 63, True),
    ("splitkv_t32_s1536_d96", 1, 1, 1, 32, 1536, 96, False, 1.0, 64, True),
    ("splitkv_t1_s1024", 1, 1, 1, 1, 1024, 64, False, 1.0, 65, True),
    ("splitkv_causal_t512", 1, 1, 1, 512, 512, 64, True, 1.0, 66, True),
    # issue 25, held out: not looked at while tuning the split-KV and backward models
    ("fresh_splitkv_gqa_t80_s1500_d80", 1, 2, 1, 80, 1500, 80, False, 1.0, 71, True),
    ("fresh_causal_t384", 1, 2, 1, 384, 384, 64, True, 1.0, 72, True),
    ("fresh_rect_t200_s640_d128", 1, 1, 1, 200, 640, 128, False, 1.0, 73, True),
]
BACKENDS = ("flash", "efficient", "cudnn")


def randn(shape, gen, device, scale, dtype):
    import torch

    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def sdpa_lse(backend, q, k, v, causal):
    """(out, lse, how) from the backend's aten op: lse natural-log float32 (B, H, t)."""
    import torch

    aten = torch.ops.aten
    t = q.shape[-2]
    if backend == "flash":
        r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        how = "aten._scaled_dot_product_flash_attention(...)[1]"
    elif backend == "efficient":
        r = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)
        how = "aten._scaled_dot_product_efficient_attention(..., compute_log_sumexp=True)[1]"
    else:
        r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
        how = "aten._scaled_dot_product_cudnn_attention(..., compute_log_sumexp=True)[1]"
    out, lse = r[0], r[1]
    raw_shape = list(lse.shape)
    lse = lse.reshape(*lse.shape[:2], -1)[..., :t]  # efficient pads t to a multiple of 32
    return out, lse.float(), f"{how}, raw shape {raw_shape}"


def sdpa_case(case, dtype_name, dev, attention_ref, writer, args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name, B, Hq, Hkv, t, s, d, causal, amp, seed, small = case
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    dshort = {"float16": "fp16", "bfloat16": "bf16"}[dtype_name]
    assert t == s or not causal, "top-left (PyTorch) and bottom-right (FA) causal differ"
    gen = torch.Generator(device=dev).manual_seed(seed)
    q = randn((B, Hq, t, d), gen, dev, amp, dtype)
    k = randn((B, Hkv, s, d), gen, dev, amp, dtype)
    v = randn((B, Hkv, s, d), gen, dev, amp, dtype)
    do = randn((B, Hq, t, d), gen, dev, 1.0, dtype)
    gqa = Hq != Hkv
    base = dict(env_meta(), case=name, dtype=dtype_name, layout="BHND (batch, heads, seq, d)",
                B=B, Hq=Hq, Hkv=Hkv, t=t, s=s, d=d, causal=causal,
                causal_align="top-left (PyTorch is_causal: key j visible iff j <= i)",
                scale=1 / math.sqrt(d), scale_note="default 1/sqrt(d); softmax_scale not passed",
                input_scale=amp, seed=seed, enable_gqa=gqa,
                inputs="q, k, v = (randn(float32, torch.Generator(cuda).manual_seed(seed)) * "
                       "input_scale).to(dtype) drawn in the order q, k, v, do; do = randn "
                       "(scale 1)", do="upstream gradient dL/dout")
    inputs = {"q": q, "k": k, "v": v, "do": do}
    np_in = {kk: to_np(x) for kk, x in inputs.items()}
    base["input_sha256_16"] = {kk: sha(x) for kk, x in np_in.items()}

    # references (FA's test rule): pt in the dtype, ref32 float32-upcast, both via attention_ref
    refs, ref_err = {}, None
    try:
        for tag, kw in (("pt", dict(upcast=False, reorder_ops=True)), ("ref32", {})):
            ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
            o, _, lse = attention_ref(ql.transpose(1, 2), kl.transpose(1, 2), vl.transpose(1, 2),
                                      causal=causal, return_lse=True, **kw)
            o = o.transpose(1, 2)
            g = torch.autograd.grad(o, (ql, kl, vl), do)
            refs[f"out_{tag}"] = o
            refs.update({f"d{n}_{tag}": x for n, x in zip("qkv", g, strict=True)})
            if tag == "ref32":  # attention_ref rounds its lse to v's dtype: redo in float32
                with torch.no_grad():
                    _, _, lse = attention_ref(*(x.transpose(1, 2).float() for x in (q, k, v)),
                                              causal=causal, return_lse=True)
                refs["lse_ref32"] = lse.float()
    except Exception as e:  # noqa: BLE001
        ref_err = err_text(e)
        log(f"  refs failed: {ref_err}")
    np_refs = {kk: to_np(x) for kk, x in refs.items()}
    ref_meta = dict(base, refs=REF_DOC, error=ref_err,
                    note="same inputs as the sdpa_<backend> files of this case and dtype "
                         "(see input_sha256_16)")

    outs = {}
    for backend in args.backends or BACKENDS:
        sdp = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
        meta = dict(base, backend=backend, errors={},
                    backend_note={"flash": "PyTorch's vendored FlashAttention-2",
                                  "efficient": "PyTorch's memory-efficient (CUTLASS, xFormers)",
                                  "cudnn": "cuDNN fused attention (SDPA cudnn backend)"}[backend])
        res = {}
        t1 = time.perf_counter()
        try:
            ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
            with sdpa_kernel([sdp]):
                out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal,
                                                     enable_gqa=gqa)
                dq, dk, dv = torch.autograd.grad(out, (ql, kl, vl), do)
            sync()
            res.update(out=out, dq=dq, dk=dk, dv=dv)
            meta["out_grads_via"] = ("F.scaled_dot_product_attention(q, k, v, is_causal, "
                                     "enable_gqa) under sdpa_kernel([backend]); "
                                     "torch.autograd.grad(out, (q, k, v), do)")

            def again(sdp=sdp):
                ql2, kl2, vl2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
                with sdpa_kernel([sdp]):
                    o2 = F.scaled_dot_product_attention(ql2, kl2, vl2, is_causal=causal,
                                                        enable_gqa=gqa)
                    return (o2, *torch.autograd.grad(o2, (ql2, kl2, vl2), do))

            if args.repeat:
                runs = [again() for _ in range(args.repeat)]
                sync()
                meta["rerun"] = rerun_meta(runs, (out, dq, dk, dv))
                if meta["rerun"]["dq_elements_differing"]:
                    res["dq_reruns"] = torch.stack([r[1] for r in runs])
            if args.kernel_names:
                try:
                    meta["cuda_kernels"] = kernel_names(again)
                except Exception as e:  # noqa: BLE001  (a CPU dry run has no CUDA activity)
                    meta["errors"]["kernel_names"] = err_text(e)
        except Exception as e:  # noqa: BLE001
            meta["errors"]["forward_backward"] = err_text(e)
            log(f"  {backend} {dtype_name} {name}: sdpa failed: {err_text(e)[:300]}")
        try:
            kk, vv = k, v
            try:
                o2, lse, how = sdpa_lse(backend, q, kk, vv, causal)
            except Exception as e:  # noqa: BLE001
                if not gqa:
                    raise
                meta["errors"]["lse_gqa_direct"] = err_text(e)
                g_ = Hq // Hkv
                kk, vv = k.repeat_interleave(g_, 1), v.repeat_interleave(g_, 1)
                o2, lse, how = sdpa_lse(backend, q, kk, vv, causal)
                how += "; k, v repeat_interleave'd to Hq heads (the op takes no GQA)"
            sync()
            res["lse"] = lse
            meta["lse_via"] = how
            if "out" in res:
                meta["op_out_equals_out"] = bool(torch.equal(o2, res["out"]))
                meta["op_out_max_abs_diff"] = float((o2.float() - res["out"].float()).abs().max())
            else:
                res["out"] = o2
                meta["out_via"] = "the aten op (autograd path failed): forward only"
        except Exception as e:  # noqa: BLE001
            meta["errors"]["lse"] = err_text(e)
            log(f"  {backend} {dtype_name} {name}: lse failed: {err_text(e)[:300]}")
        meta["gpu_s"] = time.perf_counter() - t1
        outs[backend] = ({kk: to_np(x) for kk, x in res.items()}, meta)

    if small:
        for backend, (arr, meta) in outs.items():
            writer.save(f"sdpa_{backend}_{dshort}_{name}.npz", {**np_in, **arr}, meta)
        if not args.no_ref_file:
            writer.save(f"sdpa_ref_{dshort}_{name}.npz", np_refs, ref_meta)
    else:
        pt = {kk: x for kk, x in np_refs.items() if kk.endswith("_pt")}
        writer.save(f"sdpa_{name}_{dshort}_inputs.npz", {**np_in, **pt},
                    dict(ref_meta, holds="inputs and the pt reference"))
        for backend, (arr, meta) in outs.items():
            writer.save(f"sdpa_{name}_{dshort}_{backend}.npz", arr,
                        dict(meta, holds="the backend's outputs; inputs in "
                                         f"sdpa_{name}_{dshort}_inputs.npz"))
        r32 = {kk: x for kk, x in np_refs.items() if "ref32" in kk}
        writer.save(f"sdpa_{name}_{dshort}_ref32.npz", r32,
                    dict(ref_meta, holds="the float32 references; inputs in "
                                         f"sdpa_{name}_{dshort}_inputs.npz"))
    status = {b: m["errors"] for b, (_, m) in outs.items()}
    log(f"sdpa {name} {dtype_name}: " + json.dumps(status)[:600])
    return status


def rerun_meta(runs, first) -> dict:
    """How often a rerun of the same forward and backward gave other bits (dQ's atomics)."""
    import torch

    names = ("out", "dq", "dk", "dv")
    m = {"runs": len(runs), "note": "forward + backward rerun on the same inputs; counts are "
         "elements that differ from the first run in at least one rerun"}
    for i, n in enumerate(names):
        diff = torch.zeros_like(first[i], dtype=torch.bool)
        for r in runs:
            diff |= r[i] != first[i]
        m[f"{n}_elements_differing"] = int(diff.sum())
    return m


def kernel_names(fn) -> dict:
    """The names of the CUDA kernels one call of fn launches (torch.profiler), in order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def cmd_sdpa(args) -> None:
    import torch

    dev = device()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    attention_ref, path = load_attention_ref(args.fa4_testing)
    log(f"attention_ref from {path}; torch {torch.__version__}; {env_meta().get('gpu')}")
    writer = Writer(args.out)
    summary = {}
    for case in SDPA_CASES:
        if args.small_only and not case[-1] or args.only and case[0] not in args.only:
            continue
        for dt in ("float16", "bfloat16"):
            summary[f"{case[0]}_{dt}"] = sdpa_case(case, dt, dev, attention_ref, writer, args)
    writer.close()
    (Path(args.out) / "sdpa_summary.json").write_text(json.dumps(
        dict(env_meta(), cases=summary), indent=1))
    log("sdpa done")


# ----------------------------------------------------------------------------- FA4
def fa4_import(args):
    import site

    for d in args.site or []:
        site.addsitedir(d)
    t = time.perf_counter()
    from flash_attn.cute import interface  # noqa: F401
    from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func

    log(f"imported flash_attn.cute in {time.perf_counter() - t:.1f}s from {interface.__file__}")
    return flash_attn_func, flash_attn_varlen_func, interface


def fake_fa4(args):
    attention_ref, _ = load_attention_ref(args.fa4_testing)

    def fa(q, k, v, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
           return_lse=True):
        o, _, lse = attention_ref(q, k, v, causal=causal, window_size=window_size,
                                  learnable_sink=learnable_sink, softcap=softcap,
                                  return_lse=True)
        return o, lse.float()

    def fav(*a, **kw):
        raise NotImplementedError("fake varlen")

    return fa, fav


# Each case: name, dtype, kind (dense | varlen | paged), and its options. Priority order.
FA4_CASES = [
    dict(name="plain", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=128, s=256, seed=31),
    dict(name="causal", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=160, s=288,
         causal=True, seed=32),
    dict(name="sink", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=128, s=256,
         sink=True, seed=33),
    dict(name="softcap", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=128, s=256,
         softcap=30.0, amp=3.0, seed=34),
    dict(name="gqa", dtype="bfloat16", kind="dense", B=1, Hq=4, Hkv=1, t=200, s=200, seed=35),
    dict(name="window", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=128, s=256,
         window=(32, 0), seed=36),
    dict(name="varlen", dtype="bfloat16", kind="varlen", Hq=2, Hkv=2,
         seqlens_q=[5, 3, 0, 190, 128], seqlens_k=[17, 0, 40, 250, 128], seed=37),
    dict(name="paged", dtype="bfloat16", kind="paged", B=2, Hq=2, Hkv=2, t=64,
         seqused_k=[200, 77], page_size=64, num_pages=10, seed=38),
    dict(name="combo", dtype="bfloat16", kind="varlen", Hq=4, Hkv=2,
         seqlens_q=[37, 150], seqlens_k=[100, 150], causal=True, sink=True, softcap=30.0,
         amp=2.0, seed=39),
    dict(name="plain", dtype="float16", kind="dense", B=1, Hq=2, Hkv=2, t=128, s=256, seed=31),
    # issue 25: a softcap case at a shape not used while tuning
    dict(name="softcap_new", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=192, s=320,
         softcap=20.0, amp=3.0, seed=53),
    dict(name="med_plain", dtype="bfloat16", kind="dense", B=1, Hq=8, Hkv=8, t=1024, s=1024,
         seed=41, medium=True),
    dict(name="med_causal", dtype="bfloat16", kind="dense", B=1, Hq=8, Hkv=8, t=1024, s=1024,
         causal=True, seed=42, medium=True),
    dict(name="causal", dtype="float16", kind="dense", B=1, Hq=2, Hkv=2, t=160, s=288,
         causal=True, seed=32),
    # causal with t > s: bottom-right leaves the first t - s rows without keys
    dict(name="masked_rows", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=200, s=64,
         causal=True, seed=43),
    dict(name="masked_rows_sink", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=200,
         s=64, causal=True, sink=True, seed=44),
    dict(name="plain_d128", dtype="bfloat16", kind="dense", B=1, Hq=2, Hkv=2, t=128, s=256,
         d=128, seed=45),
]


def fa4_refs(attention_ref, segs, q, k, v, do, sink, c):
    """pt and ref32 by attention_ref, one sequence at a time. q, k, v, do are 4-D (B, N, H, d)
    (varlen: B = 1 over the packed rows); segs = [(b, qa, qb, ka, kb)]: batch b, query rows
    qa:qb, key rows ka:kb, covering every query row in order."""
    import torch

    res = {}
    for tag, kw in (("pt", dict(upcast=False, reorder_ops=True)), ("ref32", {})):
        ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
        sl = sink.detach().clone().requires_grad_() if sink is not None else None
        pieces = {b: [] for b in range(q.shape[0])}
        lse_full = torch.zeros(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        for b, qa, qb, ka, kb in segs:
            if qb == qa:
                continue
            qs = ql[b:b + 1, qa:qb]
            if kb == ka:  # no keys at all: out 0; lse -inf, or the sink
                pieces[b].append(torch.zeros_like(qs))
                lse_full[b, :, qa:qb] = (sl.detach().float()[:, None] if sl is not None
                                         else float("-inf"))
                continue
            opts = dict(causal=c.get("causal", False),
                        window_size=tuple(c.get("window", (None, None))),
                        softcap=c.get("softcap", 0.0), return_lse=True, **kw)
            o, _, lse = attention_ref(qs, kl[b:b + 1, ka:kb], vl[b:b + 1, ka:kb],
                                      learnable_sink=sl, **opts)
            pieces[b].append(o)
            if tag == "ref32":  # attention_ref rounds its lse to v's dtype: redo in float32
                with torch.no_grad():
                    _, _, lse = attention_ref(qs.float(), kl[b:b + 1, ka:kb].float(),
                                              vl[b:b + 1, ka:kb].float(), learnable_sink=sl,
                                              **opts)
            lse_full[b, :, qa:qb] = lse[0].detach().float()
        out = torch.cat([torch.cat(pieces[b], 1) for b in range(q.shape[0])], 0)
        wrt = [ql, kl, vl] + ([sl] if sl is not None else [])
        g = torch.autograd.grad(out, wrt, do, allow_unused=True)
        res[f"out_{tag}"] = out
        for n, x, like in zip("qkv", g[:3], (q, k, v), strict=True):
            res[f"d{n}_{tag}"] = x if x is not None else torch.zeros_like(like)
        if sl is not None:
            res[f"dsink_{tag}"] = g[3]
        res[f"lse_{tag}"] = lse_full
    return res


def fa4_case(c, fa, fav, attention_ref, writer):
    import torch

    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[c["dtype"]]
    dshort = {"float16": "fp16", "bfloat16": "bf16"}[c["dtype"]]
    dev = device()
    gen = torch.Generator(device=dev).manual_seed(c["seed"])
    amp = c.get("amp", 1.0)
    Hq, Hkv, d = c["Hq"], c["Hkv"], c.get("d", 64)
    causal = c.get("causal", False)
    window = c.get("window", (None, None))
    softcap = c.get("softcap", 0.0)
    meta = dict(env_meta(), case=c["name"], dtype=c["dtype"], kind=c["kind"], Hq=Hq, Hkv=Hkv,
                d=d, causal=causal, window_size=list(window), softcap=softcap,
                input_scale=amp, seed=c["seed"], scale=1 / math.sqrt(d),
                scale_note="default 1/sqrt(d); softmax_scale not passed",
                causal_align="bottom-right (FA4: key j visible iff j <= i + s - t, per "
                             "sequence)", errors={}, timings_s={})
    arrays = {}
    sink = None
    kw = dict(causal=causal, window_size=window, softcap=softcap, return_lse=True)
    if c["kind"] == "dense":
        B, t, s = c["B"], c["t"], c["s"]
        q = randn((B, t, Hq, d), gen, dev, amp, dtype)
        k = randn((B, s, Hkv, d), gen, dev, amp, dtype)
        v = randn((B, s, Hkv, d), gen, dev, amp, dtype)
        do = randn((B, t, Hq, d), gen, dev, 1.0, dtype)
        segs = [(b, 0, t, 0, s) for b in range(B)]
        if causal and t > s:  # rows i < t - s see no key: the refs treat them apart (no NaN)
            segs = [x for b in range(B) for x in ((b, 0, t - s, 0, 0), (b, t - s, t, 0, s))]
        meta.update(B=B, t=t, s=s, layout="BNHD (batch, seq, heads, d): q (B, t, Hq, d), "
                    "k, v (B, s, Hkv, d); lse (B, Hq, t)")
        call = "flash_attn_func(q, k, v, causal, window_size, learnable_sink, softcap, " \
               "return_lse=True)"
    elif c["kind"] == "varlen":
        sq, sk = c["seqlens_q"], c["seqlens_k"]
        cu_q = np.concatenate([[0], np.cumsum(sq)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(sk)]).astype(np.int32)
        q = randn((int(cu_q[-1]), Hq, d), gen, dev, amp, dtype)
        k = randn((int(cu_k[-1]), Hkv, d), gen, dev, amp, dtype)
        v = randn((int(cu_k[-1]), Hkv, d), gen, dev, amp, dtype)
        do = randn((int(cu_q[-1]), Hq, d), gen, dev, 1.0, dtype)
        cuq = torch.tensor(cu_q, device=dev)
        cuk = torch.tensor(cu_k, device=dev)
        kw.update(cu_seqlens_q=cuq, cu_seqlens_k=cuk, max_seqlen_q=max(sq), max_seqlen_k=max(sk))
        arrays.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        segs = [(0, int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1]))
                for i in range(len(sq))]
        meta.update(seqlens_q=sq, seqlens_k=sk, layout="packed varlen: q (total_q, Hq, d), "
                    "k, v (total_k, Hkv, d); lse (Hq, total_q); cu_seqlens int32 (B + 1)")
        call = "flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, " \
               "max_seqlen_k, causal, window_size, learnable_sink, softcap, return_lse=True)"
    else:  # paged
        B, t, ps, npg = c["B"], c["t"], c["page_size"], c["num_pages"]
        used = c["seqused_k"]
        maxp = max(math.ceil(u / ps) for u in used)
        q = randn((B, t, Hq, d), gen, dev, amp, dtype)
        kc = randn((npg, ps, Hkv, d), gen, dev, amp, dtype)
        vc = randn((npg, ps, Hkv, d), gen, dev, amp, dtype)
        perm = torch.randperm(npg, generator=torch.Generator().manual_seed(c["seed"]))
        pt_ = perm[:B * maxp].reshape(B, maxp).to(torch.int32)
        page_table = pt_.to(dev)
        seqused = torch.tensor(used, dtype=torch.int32, device=dev)
        kw.update(page_table=page_table, seqused_k=seqused)
        arrays.update(page_table=pt_.numpy(), seqused_k=np.array(used, np.int32),
                      k_cache=to_np(kc), v_cache=to_np(vc))
        meta.update(B=B, t=t, page_size=ps, num_pages=npg, seqused_k=used,
                    layout="q (B, t, Hq, d); k_cache, v_cache (num_pages, page_size, Hkv, d); "
                    "page_table (B, max_pages) int32 (a shuffled permutation of pages); "
                    "sequence b's key j is k_cache[page_table[b, j // page_size], "
                    "j % page_size]; lse (B, Hq, t)")
        call = "flash_attn_varlen_func(q, k_cache, v_cache, page_table=page_table, " \
               "seqused_k=seqused_k, causal, window_size, softcap, return_lse=True)"
        # dense K/V per batch for the refs (only the used keys)
        k = torch.stack([kc[page_table[b].long()].reshape(-1, Hkv, d)[:max(used)]
                         for b in range(B)])
        v = torch.stack([vc[page_table[b].long()].reshape(-1, Hkv, d)[:max(used)]
                         for b in range(B)])
        do = None
        segs = [(b, 0, t, 0, used[b]) for b in range(B)]
    if c.get("sink"):
        sink = torch.randn(Hq, generator=gen, device=dev, dtype=torch.float32)
        arrays["learnable_sink"] = to_np(sink)
        meta["learnable_sink"] = "float32 (Hq,), natural-log units of the scaled score"
        kw["learnable_sink"] = sink
    meta["call"] = call
    inp = {"q": q, "do": do}
    if c["kind"] != "paged":
        inp.update(k=k, v=v)
    arrays.update({kk: to_np(x) for kk, x in inp.items() if x is not None})

    # forward
    grads = c["kind"] != "paged"
    ql, kl, vl = (x.detach().clone().requires_grad_(grads) for x in (q, k, v))
    sl = sink.detach().clone().requires_grad_(grads) if sink is not None else None
    if sl is not None:
        kw["learnable_sink"] = sl
    f = fa if c["kind"] == "dense" else fav
    out = lse = None
    t1 = time.perf_counter()
    try:
        if c["kind"] == "paged":
            out, lse = f(ql, kc, vc, **kw)
        else:
            out, lse = f(ql, kl, vl, **kw)
        sync()
        arrays.update(out=to_np(out), lse=to_np(lse))
    except Exception as e:  # noqa: BLE001
        meta["errors"]["forward"] = err_text(e)
        log(f"  forward failed: {err_text(e)[:400]}")
        meta["traceback_forward"] = traceback.format_exc()[-3000:]
    meta["timings_s"]["forward_incl_compile"] = time.perf_counter() - t1
    # backward
    if out is not None and grads:
        t1 = time.perf_counter()
        try:
            wrt = [ql, kl, vl] + ([sl] if sl is not None else [])
            g = torch.autograd.grad(out, wrt, do)
            sync()
            arrays.update(dq=to_np(g[0]), dk=to_np(g[1]), dv=to_np(g[2]))
            if sl is not None:
                arrays["dsink"] = to_np(g[3])
            meta["grads_via"] = "torch.autograd.grad(out, (q, k, v[, learnable_sink]), do)"
        except Exception as e:  # noqa: BLE001
            meta["errors"]["backward"] = err_text(e)
            log(f"  backward failed: {err_text(e)[:400]}")
            meta["traceback_backward"] = traceback.format_exc()[-3000:]
        meta["timings_s"]["backward_incl_compile"] = time.perf_counter() - t1
        # a second backward: is dQ (atomics) run-to-run deterministic?
        if "dq" in arrays and not c.get("medium"):
            try:
                out2, _ = (f(ql, kl, vl, **kw))
                g2 = torch.autograd.grad(out2, [ql, kl, vl], do)
                meta["rerun_bitwise_equal"] = {
                    "out": bool(torch.equal(out2, out)),
                    **{f"d{n}": bool(np.array_equal(to_np(x), arrays[f"d{n}"]))
                       for n, x in zip("qkv", g2, strict=True)}}
            except Exception as e:  # noqa: BLE001
                meta["errors"]["rerun"] = err_text(e)
    elif not grads:
        meta["errors"]["backward"] = ("not attempted: FA4's backward (_flash_attn_bwd) takes no "
                                      "page_table; paged KV is forward-only")
    # refs
    t1 = time.perf_counter()
    try:
        four = (lambda x: x[None]) if c["kind"] == "varlen" else (lambda x: x)
        r = fa4_refs(attention_ref, segs, four(q), four(k), four(v),
                     four(do) if do is not None else torch.zeros_like(q), sink, c)
        if c["kind"] == "varlen":  # back to the packed layout: (total, H, d), lse (H, total)
            r = {kk: (x[0] if not kk.startswith("dsink") else x) for kk, x in r.items()}
        if c["kind"] == "paged":  # no backward: keep the forward references
            r = {kk: x for kk, x in r.items() if kk.startswith(("out", "lse"))}
        r_np = {kk: to_np(x) for kk, x in r.items()}
        meta["refs"] = dict(REF_DOC, per_sequence="one sequence (and batch) at a time; rows "
                            "without keys: out 0, lse -inf (the sink with learnable_sink)")
    except Exception as e:  # noqa: BLE001
        r_np = {}
        meta["errors"]["refs"] = err_text(e)
        meta["traceback_refs"] = traceback.format_exc()[-3000:]
        log(f"  refs failed: {err_text(e)[:400]}")
    meta["timings_s"]["refs"] = time.perf_counter() - t1
    fname = f"fa4_{c['name']}_{dshort}.npz"
    if c.get("medium"):
        writer.save(fname, arrays, meta)
        writer.save(fname.replace(".npz", "_ref.npz"), r_np,
                    dict(meta, holds="the references; inputs and outputs in " + fname))
    else:
        writer.save(fname, {**arrays, **r_np}, meta)
    return {"errors": meta["errors"], "timings_s": meta["timings_s"],
            "rerun_bitwise_equal": meta.get("rerun_bitwise_equal")}


def fa4_key(c) -> str:
    return f"{c['name']}_{ {'float16': 'fp16', 'bfloat16': 'bf16'}[c['dtype']]}"


def cmd_fa4(args) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    Path(args.out).mkdir(parents=True, exist_ok=True)
    summary_path = Path(args.out) / "fa4_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update(env_meta())
    summary.setdefault("cases", {})
    try:
        if args.fake:  # a dry run of the flow on a CPU: attention_ref stands in for FA4
            fa, fav = fake_fa4(args)
            summary["flash_attn_cute"] = "FAKE (attention_ref)"
        else:
            fa, fav, interface = fa4_import(args)
            summary["flash_attn_cute"] = interface.__file__
    except Exception as e:  # noqa: BLE001
        summary["import_error"] = err_text(e) + "\n" + traceback.format_exc()[-4000:]
        summary_path.write_text(json.dumps(summary, indent=1))
        log("FA4 import failed:", summary["import_error"])
        raise SystemExit(1) from e
    attention_ref, path = load_attention_ref(args.fa4_testing)
    cases = FA4_CASES
    if args.only:  # in the order given
        cases = [c for o in args.only for c in FA4_CASES if o in (c["name"], fa4_key(c))]
    for c in cases:
        key = fa4_key(c)
        if "errors" in summary["cases"].get(key, {}) and not args.redo:
            log(f"skip {key}: done in an earlier run")
            continue
        if time.time() > args.deadline_epoch or time.perf_counter() - T0 > args.deadline_s:
            summary["cases"][key] = {"skipped": "deadline"}
            log(f"skip {key}: past the deadline")
            continue
        log(f"fa4 {key} ...")
        writer = Writer(args.out)
        try:
            summary["cases"][key] = fa4_case(c, fa, fav, attention_ref, writer)
        except Exception as e:  # noqa: BLE001
            summary["cases"][key] = {"errors": {"case": err_text(e)},
                                     "traceback": traceback.format_exc()[-3000:]}
            log(f"  case failed: {err_text(e)[:400]}")
        writer.close()
        log(f"fa4 {key}: {json.dumps(summary['cases'][key])[:500]}")
        summary_path.write_text(json.dumps(summary, indent=1))
    summary_path.write_text(json.dumps(summary, indent=1))
    log("fa4 done")


# ----------------------------------------------------------------------------- flex
def cmd_flex(args) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import capture_flex

    writer = Writer(args.out)
    summary = capture_flex.cmd_flex(args, writer, env_meta, to_np, log)
    writer.close()
    (Path(args.out) / "flex_summary.json").write_text(json.dumps(
        dict(env_meta(), cases=summary), indent=1))
    log("flex done")


# ----------------------------------------------------------------------------- ship
def ship_priority(name: str) -> tuple:
    """Summaries, then small files (FA4 first), then medium outputs, then medium references."""
    if name.endswith((".json", ".txt")):
        return (0, name)
    if "med_" not in name:
        return (1, not name.startswith("fa4"), name)
    ref = "ref32" in name or name.endswith("_ref.npz")
    rank = next((i for i, key in enumerate(("fa4_", "med_n1024_", "med_n1024_causal",
                                            "med_n2048", "med_rect")) if key in name), 9)
    return (3 if ref else 2, rank, name)


def cmd_ship(args) -> None:
    src, dst = Path(args.src), Path(args.dst)
    dst.mkdir(parents=True, exist_ok=True)
    state = src / ".shipped"
    done = set(state.read_text().split()) if state.exists() else set()
    files = [p for p in src.iterdir() if p.is_file()
             and (p.suffix in (".json", ".txt") or (p.suffix == ".npz" and p.name not in done))]
    files.sort(key=lambda p: ship_priority(p.name))
    cap, per, nmax = args.max_total_mib * 2**20, args.max_file_mib * 2**20, args.max_files
    groups, total = [], 0
    for p in files:
        size = p.stat().st_size + 2048
        if size > per:
            log(f"too large to ship: {p.name} ({size / 2**20:.1f} MiB)")
            continue
        if total + size > cap:
            continue
        for g in groups:  # first fit
            if g[0] + size <= per:
                g[0] += size
                g[1].append(p)
                break
        else:
            if len(groups) >= nmax:
                continue
            groups.append([size, [p]])
        total += size
    for i, (_, group) in enumerate(groups):
        name = dst / f"ship{args.tag}_{i}.tar"
        with tarfile.open(name, "w") as tf:
            for p in group:
                tf.add(p, arcname=p.name)
        log(f"{name.name}: {len(group)} files, {name.stat().st_size / 2**20:.1f} MiB")
    shipped = {p.name for _, g in groups for p in g if p.suffix == ".npz"}
    if any(p.suffix == ".npz" for p in files) and not shipped:
        log("nothing fitted")
    state.write_text("\n".join(sorted(done | shipped)))
    left = sorted(p.name for p in src.iterdir()
                  if p.suffix == ".npz" and p.name not in done | shipped)
    log(f"shipped {len(shipped)} files ({total / 2**20:.1f} MiB); {len(left)} left: "
        + " ".join(left)[:1500])


# ----------------------------------------------------------------------------- shrink
def cmd_shrink(args) -> None:
    """Keep query heads [0, heads) (and their kv heads) of a capture."""
    with np.load(args.src) as f:
        arrays = {k: f[k] for k in f.files if k != "meta"}
        meta = json.loads(str(f["meta"]))
    hq, hkv = meta["Hq"], meta["Hkv"]
    g = hq // hkv
    keep_q = args.heads
    keep_kv = max(1, keep_q // g)
    keep_q = keep_kv * g if keep_q % g else keep_q
    layout = meta.get("layout", "")
    bhnd = layout.startswith("BHND")
    packed = layout.startswith("packed")
    paged = "page_table" in arrays
    out = {}
    for k, a in arrays.items():
        if k in ("cu_seqlens_q", "cu_seqlens_k", "page_table", "seqused_k"):
            out[k] = a
            continue
        if k.startswith(("learnable_sink", "dsink")):
            out[k] = a[:keep_q]
            continue
        if k.startswith("lse"):
            out[k] = a[:keep_q] if packed else a[:, :keep_q]
            continue
        kvlike = k in ("k", "v", "k_cache", "v_cache") or k.startswith(("dk", "dv"))
        n = keep_kv if kvlike else keep_q
        if bhnd:
            out[k] = a[:, :n]
        elif packed:
            out[k] = a[:, :n]
        else:  # BNHD, paged caches (pages, page_size, H, d)
            out[k] = a[:, :, :n]
    del paged
    meta["shrunk"] = (f"query heads [0, {keep_q}) and kv heads [0, {keep_kv}) of a capture with "
                      f"Hq={hq}, Hkv={hkv} (heads are independent: still the kernel's exact "
                      f"output for these heads)")
    dropped = sorted(k for k in out if any(fnmatch.fnmatchcase(k, pat) for pat in args.drop))
    for k in dropped:
        del out[k]
    if dropped:
        meta["dropped"] = (f"{', '.join(dropped)}: left out to keep the committed samples small "
                           "(they are in the full capture)")
    meta["Hq"], meta["Hkv"] = keep_q, keep_kv
    meta["arrays"] = {k: [str(v.dtype), list(v.shape)] for k, v in out.items()}
    size = save_npz(Path(args.dst), out, meta, level=9)
    print(f"{args.dst}: {size / 1e6:.3f} MB")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sdpa")
    p.add_argument("--out", required=True)
    p.add_argument("--small-only", action="store_true")
    p.add_argument("--backends", nargs="*", choices=BACKENDS, help="default: all three")
    p.add_argument("--only", nargs="*", help="case names")
    p.add_argument("--fa4-testing")
    p.add_argument("--repeat", type=int, default=0,
                   help="rerun forward + backward N times: which bits change (dQ's atomics)")
    p.add_argument("--kernel-names", action="store_true",
                   help="record the CUDA kernels each run launches (torch.profiler)")
    p.add_argument("--no-ref-file", action="store_true",
                   help="write no sdpa_ref_* file (osm recomputes references on the CPU)")
    p = sub.add_parser("fa4")
    p.add_argument("--out", required=True)
    p.add_argument("--site", action="append", help="site dir holding the FA4 wheels' contents")
    p.add_argument("--deadline-s", type=float, default=420.0,
                   help="start no case after this many seconds of this process")
    p.add_argument("--deadline-epoch", type=float, default=float("inf"),
                   help="start no case after this time (seconds since the epoch)")
    p.add_argument("--only", nargs="*", help="case names or name_dtype keys, run in this order")
    p.add_argument("--redo", action="store_true")
    p.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fa4-testing")
    p = sub.add_parser("flex")
    p.add_argument("--out", required=True)
    p.add_argument("--deadline-s", type=float, default=240.0,
                   help="start no case after this many seconds")
    p = sub.add_parser("ship")
    p.add_argument("--src", required=True)
    p.add_argument("--dst", required=True)
    p.add_argument("--tag", default="0")
    p.add_argument("--max-total-mib", type=float, default=60.0)
    p.add_argument("--max-file-mib", type=float, default=15.5)
    p.add_argument("--max-files", type=int, default=8)
    p = sub.add_parser("shrink")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--drop", nargs="*", default=[], help="array-name patterns to leave out")
    args = ap.parse_args(argv)
    cmds = {"sdpa": cmd_sdpa, "fa4": cmd_fa4, "flex": cmd_flex, "ship": cmd_ship,
            "shrink": cmd_shrink}
    cmds[args.cmd](args)


if __name__ == "__main__":
    main()
