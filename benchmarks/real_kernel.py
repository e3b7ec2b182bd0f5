"""osm's flash precision model against a real FlashAttention-2 kernel (needs a CUDA GPU).

For each case, random inputs are made on the GPU in float16 or bfloat16 and run through PyTorch's
flash kernel, torch.ops.aten._scaled_dot_product_flash_attention (its causal mask is top-left;
the cases use t == s or pass causal_align="top-left" to osm). On the CPU, for the very same
(rounded) inputs: osm's float64 reference, osm's flash model (precision.run_flash, FA2's
schedule) and osm's plain same-dtype attention (precision.plain). One table row per case:

  kernel err, model err   max |O − ref64| of the kernel and of osm's model
  ratio                   model err / kernel err (target 0.8–1.25); mean ratio likewise, mean |·|
  ulps                    max |O_model − O_kernel| in ulps of the dtype at each row's largest |O|
                          (target ≤ 2); differ: the share of elements where the two differ at all
  LSE diff                max |LSE_model − LSE_kernel|
  plain×                  plain same-dtype attention's err / the kernel's (3–30×,
                          docs/numerics.md#precision-model)
  pt osm/torch            osm's plain err / the err of PyTorch's own plain attention on the GPU
  verdicts                FlashAttention's test rule (osm check) on the kernel's O and LSE
                          (PASS expected) and on two corrupted copies (FAIL expected)

Variants of the model follow: attention's own forward tiles without FA2's schedule, and FA2's
schedule with P left unrounded (what the schedule and the rounding of P each contribute).
With --out DIR: results.json, a small float16 and a
bfloat16 case (kernel_fp16.npz, kernel_bf16.npz: q, k, v, out, lse; bf16 stored as float32) for
tests, and `osm check` run end to end on the first.

Usage: python benchmarks/real_kernel.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from osm_cli.attention.reference import reference  # noqa: E402
from osm_cli.precision.dtypes import DTYPES, round_to, ulp
from osm_cli.precision.kernels import fa2_plan, run_flash
from osm_cli.precision.model import Model, model, plain
from osm_cli.precision.rule import judge

att = importlib.import_module("osm_cli.attention")  # the package's `attention` is the function

# (dtype, B, H, t, s, d, causal, input scale)
CASES = [
    ("float16", 1, 8, 1024, 1024, 64, False, 1.0),
    ("float16", 1, 8, 1024, 1024, 64, True, 1.0),
    ("float16", 2, 4, 512, 2048, 128, False, 3.0),
    ("float16", 1, 8, 2048, 2048, 32, True, 2.0),
    ("float16", 1, 4, 4096, 4096, 96, True, 1.5),
    ("bfloat16", 1, 8, 1024, 1024, 64, False, 1.0),
    ("bfloat16", 1, 8, 1024, 1024, 64, True, 1.0),
    ("bfloat16", 2, 4, 512, 2048, 128, False, 3.0),
    ("bfloat16", 1, 8, 2048, 2048, 32, True, 2.0),
    ("bfloat16", 1, 4, 4096, 4096, 96, True, 1.5),
]
QUICK = [CASES[1], CASES[6]]


class NoPRound(Model):
    """The flash model with P left unrounded (everything else the same)."""

    @property
    def p_round(self):
        return None


def kernel(q, k, v, causal: bool):
    """(O, LSE) of PyTorch's flash kernel for (B, H, N, d) CUDA tensors."""
    import torch

    if not q.is_cuda:  # a dry run of this script: PyTorch's CPU flash kernel
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
    torch.cuda.synchronize()
    return res[0], res[1]


def torch_plain(q, k, v, causal: bool):
    """FlashAttention's test `pt` (attention_ref with upcast=False) on the GPU."""
    import torch

    d = q.shape[-1]
    scores = torch.matmul(q / math.sqrt(d), k.transpose(-1, -2))
    if causal:
        t, s = scores.shape[-2:]
        hide = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hide, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


def to_np(x) -> np.ndarray:
    return x.float().cpu().numpy()


def row_ulps(a: np.ndarray, b: np.ndarray, scale_of: np.ndarray, dt) -> np.ndarray:
    """|a − b| in ulps of dt at each row's largest |scale_of|."""
    u = ulp(np.abs(scale_of).max(axis=-1, keepdims=True), dt)
    return np.abs(a.astype(np.float64) - b) / u


def one_case(case, gen, device):
    import torch

    name, b, h, t, s, d, causal, amp = case
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[name]
    dt = DTYPES[name]
    q, k, v = ((torch.randn(b, h, n, d, generator=gen, device=device) * amp).to(tdt)
               for n in (t, s, s))
    t0 = time.perf_counter()
    o_k, lse_k = kernel(q, k, v, causal)
    gpu_s = time.perf_counter() - t0
    pt_torch = to_np(torch_plain(q, k, v, causal))
    qn, kn, vn = (to_np(x) for x in (q, k, v))
    o_k, lse_k = to_np(o_k), lse_k.float().cpu().numpy()
    kw = dict(causal=causal, causal_align="top-left")
    t0 = time.perf_counter()
    ref, ref_lse = reference(qn, kn, vn, **kw)
    m = model(name)
    res = run_flash(m, qn, kn, vn, trace_at=None, schedule="fa2", **kw)
    cpu_model_s = time.perf_counter() - t0
    pt, pt_lse = plain(qn, kn, vn, dt, **kw)
    variants = {
        "tiles (forward, 128-row tiles, no splits)": run_flash(m, qn, kn, vn, trace_at=None,
                                                                    **kw),
        "fa2 schedule, P not rounded": run_flash(NoPRound(*vars(m).values()), qn, kn, vn,
                                                      trace_at=None, schedule="fa2", **kw),
    }

    def err(x):
        return float(np.abs(x.astype(np.float64) - ref).max())

    def mean_err(x):
        return float(np.abs(x.astype(np.float64) - ref).mean())

    ek, em, ep, ept = err(o_k), err(res.out), err(pt), err(pt_torch)
    ulps = row_ulps(res.out, o_k, o_k, dt)
    verdict_k = judge(o_k, ref, pt, dt, lse=lse_k, ref_lse=ref_lse, pt_lse=pt_lse)
    bad_row = o_k.copy()
    bad_row[0, 0, t // 2] *= 1.05  # one row 5 % off (a wrong rescale of one tile, say)
    verdict_row = judge(bad_row, ref, pt, dt, lse=lse_k, ref_lse=ref_lse, pt_lse=pt_lse)
    bad_lse = lse_k.copy()
    bad_lse[0, -1, t - 1] += 0.01  # one LSE off by 0.01 (l summed from rounded P, say)
    verdict_lse = judge(o_k, ref, pt, dt, lse=bad_lse, ref_lse=ref_lse, pt_lse=pt_lse)
    ref_d = round_to(ref, dt, np.float64)
    row = {
        "dtype": name, "shape": [b, h, t, s, d], "causal": causal, "input_scale": amp,
        "kernel_err": ek, "model_err": em, "ratio": em / ek,
        "mean_ratio": mean_err(res.out) / mean_err(o_k),
        "max_ulps": float(ulps.max()), "differ": float(np.mean(res.out != o_k)),
        "max_element_ulps": float(
            (np.abs(res.out.astype(np.float64) - o_k) / ulp(o_k, dt)).max()),
        "plan": list(fa2_plan(b, h, t, s, d)),
        "lse_diff": float(np.abs(res.lse.astype(np.float64) - lse_k).max()),
        "plain_err": ep, "plain_over_kernel": ep / ek, "torch_plain_err": ept,
        "plain_osm_over_torch": ep / ept,
        "plain_vs_torch_plain_max_ulps": float(row_ulps(pt, pt_torch, pt_torch, dt).max()),
        "ref_differs_from_fp32_upcast": None,
        "variants": {label: {"ratio": err(x.out) / ek,
                             "max_ulps": float(row_ulps(x.out, o_k, o_k, dt).max()),
                             "differ": float(np.mean(x.out != o_k))}
                     for label, x in variants.items()},
        "kernel_verdict": verdict_k.passed, "kernel_rule": vars(verdict_k.rule),
        "kernel_lse_rule": vars(verdict_k.lse),
        "corrupt_row_verdict": verdict_row.passed, "corrupt_lse_verdict": verdict_lse.passed,
        "gpu_s": gpu_s, "cpu_ref_and_model_s": cpu_model_s,
    }
    # FlashAttention's own ref: float32-upcast attention on the GPU, cast back to the dtype.
    qf, kf, vf = (x.float() for x in (q, k, v))
    ref32 = to_np(torch_plain(qf, kf, vf, causal).to(tdt))
    row["ref_differs_from_fp32_upcast"] = float(np.mean(ref32 != ref_d))
    return row, (qn, kn, vn, o_k, lse_k)


def fmt_table(rows) -> str:
    head = ("dtype     B×H×t×s×d         causal amp  kernel err  model err  ratio  mean  "
            "ulps  differ  LSE diff  plain×  pt osm/torch  kernel  corrupt O/LSE")
    lines = [head, "-" * len(head)]
    for r in rows:
        b, h, t, s, d = r["shape"]
        lines.append(
            f"{r['dtype']:<9} {f'{b}×{h}×{t}×{s}×{d}':<17} {str(r['causal']):<6} "
            f"{r['input_scale']:<4g} {r['kernel_err']:<11.3e} {r['model_err']:<10.3e} "
            f"{r['ratio']:<6.3f} {r['mean_ratio']:<5.3f} {r['max_ulps']:<5.2g} "
            f"{r['differ']:<7.2%} {r['lse_diff']:<9.2e} {r['plain_over_kernel']:<7.3g} "
            f"{r['plain_osm_over_torch']:<13.3f} {'PASS' if r['kernel_verdict'] else 'FAIL':<7} "
            f"{'PASS' if r['corrupt_row_verdict'] else 'FAIL'}/"
            f"{'PASS' if r['corrupt_lse_verdict'] else 'FAIL'}")
    lines.append("")
    lines.append("FA2 plan (block_q, block_k, splits) and the element-wise ulps of the model:")
    for r in rows:
        lines.append(f"  {r['dtype']:<9} {'×'.join(map(str, r['shape'])):<17} "
                     f"causal={r['causal']!s:<5} plan {tuple(r['plan'])}  max ulps at the "
                     f"element itself {r['max_element_ulps']:.3g}")
    for label in rows[0]["variants"] if rows else ():
        lines.append("")
        lines.append(f"variant: {label}")
        for r in rows:
            u = r["variants"][label]
            lines.append(f"  {r['dtype']:<9} {'×'.join(map(str, r['shape'])):<17} "
                         f"causal={r['causal']!s:<5} ratio {u['ratio']:.3f}  ulps "
                         f"{u['max_ulps']:.2g}  differ {u['differ']:.2%}")
    lines.append("")
    lines.append("FlashAttention's float32-upcast ref vs osm's float64 ref cast to the dtype, "
                 "share of elements that differ: "
                 + ", ".join(f"{r['ref_differs_from_fp32_upcast']:.2e}" for r in rows))
    return "\n".join(lines)


def save_sample(path: Path, arrays, dtype: str, keep_t: int = 256, keep_h: int = 2) -> None:
    """A small slice of a causal t == s case: q, k, v, out, lse (bf16 as float32)."""
    q, k, v, o, lse = arrays
    sl = (slice(0, 1), slice(0, keep_h), slice(0, keep_t))
    store = np.float16 if dtype == "float16" else np.float32
    np.savez_compressed(path, q=q[sl].astype(store), k=k[sl].astype(store),
                        v=v[sl].astype(store), out=o[sl].astype(store),
                        lse=lse[sl].astype(np.float32))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the script out")
    args = ap.parse_args()
    device = args.device
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (a dry run, not a GPU kernel)"
    print(f"torch {torch.__version__}, {gpu}, numpy {np.__version__}, {os.cpu_count()} CPUs",
          flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    samples = {}
    for case in QUICK if args.quick else CASES:
        try:
            row, arrays = one_case(case, gen, device)
        except Exception as exc:  # one broken case must not lose the others' results
            print(f"{case}: failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        rows.append(row)
        print(f"{case}: ratio {row['ratio']:.3f}, ulps {row['max_ulps']:.2g}, "
              f"{row['cpu_ref_and_model_s']:.1f} s on the CPU", flush=True)
        name, _, _, t, s, _, causal, _ = case
        if causal and t == s and name not in samples:
            samples[name] = arrays
    print()
    print(fmt_table(rows))
    if args.out is None:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    for name, arrays in samples.items():
        tag = {"float16": "fp16", "bfloat16": "bf16"}[name]
        save_sample(args.out / f"kernel_{tag}.npz", arrays, name)
    if "float16" in samples:  # osm check end to end, on a bigger slice than the sample
        q, k, v, o, lse = samples["float16"]
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for n, x in (("out", o), ("q", q), ("k", k), ("v", v)):
                np.save(f"{tmp}/{n}.npy", x.astype(np.float16))
                files.append(f"{tmp}/{n}.npy")
            np.save(f"{tmp}/lse.npy", lse)
            bad = o.astype(np.float16)
            bad[0, 3, 100] *= np.float16(1.05)
            np.save(f"{tmp}/bad.npy", bad)
            for label, first in (("kernel", files[0]), ("corrupted", f"{tmp}/bad.npy")):
                cmd = [sys.executable, "-m", "osm_cli", "check", first, *files[1:], "--lse",
                       f"{tmp}/lse.npy", "--causal", "--causal-align", "top-left", "--top", "3"]
                done = subprocess.run(cmd, capture_output=True, text=True,
                                      cwd=Path(__file__).resolve().parent.parent)
                print(f"\nosm check on the {label} output: exit {done.returncode}")
                print(done.stdout[-2500:], done.stderr[-600:])


if __name__ == "__main__":
    main()
