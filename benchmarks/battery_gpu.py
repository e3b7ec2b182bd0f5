"""Run `osm battery` on a CUDA GPU against real kernels and keep what it reports.

Targets, in this order, until --deadline-s: the fused-attention kernel of triton-lang/triton's
python/tutorials/06-fused-attention.py (loaded from --triton PATH, never committed here: its
`attention(q, k, v, causal, sm_scale)` takes (B, H, N, d) with N_q = N_k, fp16), PyTorch's SDPA
backends (flash, efficient, cudnn, math; causal bottom-right through causal_lower_right, GQA
through enable_gqa, gradients), torch's flex_attention (eager), and FlashAttention-4
(flash_attn.cute) when it imports. Every battery's table is appended to OUT/battery.txt (with
the command it stands for) and its JSON document to OUT/battery.json, as each ends, and a
summary line printed. osm judges on the CPU (its float64 reference in
numpy); the kernels run on the GPU.

    python benchmarks/battery_gpu.py --triton gpu-battery/06-fused-attention.py --out $OUT

Works on a CPU too (--device cpu: the math backend and flex only), which is how it is tested
before a GPU run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import types
from pathlib import Path


def triton_tutorial(path: str):
    """An adapter to the tutorial's attention: (B, N, H, d) to its (B, H, N, d) and back;
    it declares causal and grad (its LSE, base 2, stays inside)."""
    if "pytest" not in sys.modules and importlib.util.find_spec("pytest") is None:
        stub = types.ModuleType("pytest")  # the tutorial decorates its test at import
        stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))
        sys.modules["pytest"] = stub
    spec = importlib.util.spec_from_file_location("triton_fused_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def attn(q, k, v, softmax_scale=None, causal=False):
        t = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        return mod.attention(*t, causal, scale).transpose(1, 2)

    attn.osm_features = "causal,grad"
    attn.__name__ = "triton_tutorial"
    return attn


def targets(args) -> list:
    """(name, fn or TARGET, options) in the order they run."""
    cuda = args.device == "cuda"
    both = {"dtypes": "bf16,fp16", "device": args.device, "head_dims": "64,128"}
    out = []
    if args.triton:
        out.append(("triton_tutorial", triton_tutorial(args.triton),
                    {"dtypes": "fp16", "device": args.device, "head_dims": "64,128"}))
    for backend in (("flash", "efficient", "cudnn", "math") if cuda else ("math",)):
        out.append((f"sdpa_{backend}", "sdpa", {**both, "backend": backend}))
    out.append(("flex", "flex", {**both, "features": "causal,gqa,window,softcap,alibi,lse"}))
    if cuda and importlib.util.find_spec("flash_attn") is not None:
        out.append(("flash_attn_cute", "flash_attn.cute", both))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triton", help="path of 06-fused-attention.py")
    ap.add_argument("--out", default=".", help="folder for battery.txt and battery.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--budget", default="quick", choices=("quick", "full"))
    ap.add_argument("--cases", type=int, default=None)
    ap.add_argument("--deadline-s", type=float, default=360.0)
    ap.add_argument("--only", nargs="*", help="names of targets to run")
    args = ap.parse_args()
    from osm_cli.battery import run
    from osm_cli.present.battery import battery_doc, battery_report
    from osm_cli.present.console import as_text
    from osm_cli.present.json import dumps

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    docs: dict = {}
    for name, fn, opts in targets(args):
        if args.only and name not in args.only:
            continue
        left = args.deadline_s - (time.perf_counter() - start)
        if left < 20:
            print(f"{name}: not run (deadline)", flush=True)
            continue
        flags = {"dtypes": "--dtype", "head_dims": "--head-dims", "device": "--device",
                 "backend": "--backend", "features": "--features"}
        what = fn if isinstance(fn, str) else f"benchmarks/battery_gpu.py:{name} (adapter)"
        cmd = f"osm battery {what} " + " ".join(f"{flags[k]} {v}" for k, v in opts.items())
        try:
            rep = run(fn, budget=args.budget, cases=args.cases, **opts)
        except Exception as exc:  # an adapter that cannot start: say so, go on
            print(f"{name}: could not run: {type(exc).__name__}: {exc}", flush=True)
            continue
        with open(out / "battery.txt", "a", encoding="utf-8") as f:
            f.write(f"$ {cmd}\n" + as_text(battery_report(rep, cmd), 100) + "\n")
        docs[name] = battery_doc(rep, cmd)
        (out / "battery.json").write_text(dumps(docs))
        kinds = "; ".join(f"{', '.join(f.tensors)} @ {f.smallest.case.id}: {f.smallest.message}"
                          for f in rep.failures[:3])
        print(f"{name}: {len(rep.results)} cases, {rep.failed} failed, kernel "
              f"{rep.kernel_seconds:.1f} s, osm {rep.osm_seconds:.1f} s. {kinds}", flush=True)
    print(json.dumps({"seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
