"""Run `osm battery` on a CUDA GPU against real kernels and keep what it reports.

Targets, in this order, until --deadline-s: PyTorch's SDPA flash backend (causal bottom-right
through causal_lower_right, GQA through enable_gqa, gradients); torch's flex_attention (eager,
with every feature it takes: the masks, softcap, ALiBi, FlexAttention's score_mod and mask_mod,
LSE, gradients); FlashAttention-4 (flash_attn.cute, from --site, where its wheels were
unpacked) with causal, GQA, window, softcap, sink, varlen, paged, LSE and gradients (head dims
--fa4-head-dims); the fused-attention kernel of triton-lang/triton's
python/tutorials/06-fused-attention.py (loaded from --triton PATH, never committed here: its
`attention(q, k, v, causal, sm_scale)` takes (B, H, N, d), fp16, one N for Q and K that is a
multiple of 128, declared as its limits); SDPA's efficient, cudnn and math backends; and
flex_attention torch.compile'd (bf16, score_mod and mask_mod cases). osm's float64 reference
and baseline run with torch on the GPU (the battery's reference "auto"). Every battery's table
is appended to OUT/battery.txt (with the command it stands for) and its JSON document to
OUT/battery.json, as each ends, and a summary line printed, with the cases done every ten;
OUT/versions.txt says what ran. --only NAME ... runs those targets in the order given; several
runs may share one OUT (battery.json keeps the batteries already in it). --seed, --cases and
--features split a budget across runs.

    python benchmarks/battery_gpu.py --triton 06-fused-attention.py --site /tmp/site --out $OUT

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


def triton_tutorial(path: str, configs: int | None = None):
    """An adapter to the tutorial's attention: (B, N, H, d) to its (B, H, N, d) and back;
    it declares causal and grad (its LSE, base 2, stays inside). configs: keep only the first
    that many of its autotuner's configs that take every head dimension here (BLOCK_N ≤ 64;
    num_stages 3, num_warps 4, the larger blocks first), since each config is a compile for
    every head dimension and causal flag, and every new N_CTX is benchmarked on each (None:
    all)."""
    if "pytest" not in sys.modules and importlib.util.find_spec("pytest") is None:
        stub = types.ModuleType("pytest")  # the tutorial decorates its test at import
        stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))
        sys.modules["pytest"] = stub
    spec = importlib.util.spec_from_file_location("triton_fused_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if configs is not None:
        for label in ("_attn_fwd_tma", "_attn_fwd"):
            tuner = getattr(mod, label)
            fit = [c for c in tuner.configs if c.kwargs["BLOCK_N"] <= 64]
            fit.sort(key=lambda c: (c.num_stages != 3, c.num_warps != 4,
                                    -c.kwargs["BLOCK_N"], -c.kwargs["BLOCK_M"]))
            tuner.configs = fit[:configs]
            print(f"triton_tutorial: {label} autotunes over " + ", ".join(
                f"BLOCK_M {c.kwargs['BLOCK_M']} BLOCK_N {c.kwargs['BLOCK_N']} stages "
                f"{c.num_stages} warps {c.num_warps}" for c in tuner.configs), flush=True)

    def attn(q, k, v, softmax_scale=None, causal=False):
        t = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        out = mod.attention(*t, causal, scale)
        if out.requires_grad:  # its backward asserts a contiguous dO, as its test passes it
            out.register_hook(lambda g: g.contiguous())
        return out.transpose(1, 2)

    attn.osm_features = "causal,grad"
    # one N_CTX for Q and K; its backward asserts N_CTX % 128 == 0 and loads whole blocks of
    # 128 rows, and its forward loads whole K/V blocks without a bound check
    attn.osm_constraints = {"seqlens": "equal", "min_seqlen": 128, "seqlen_multiple": 128}
    attn.__name__ = "triton_tutorial"
    return attn


def targets(args) -> list:
    """(name, fn or TARGET, options, budget) in the order they run."""
    cuda = args.device == "cuda"
    both = {"dtypes": "bf16,fp16", "device": args.device, "head_dims": "64,128"}
    out = []
    backends = ("flash", "efficient", "cudnn", "math") if cuda else ("math",)
    out.append((f"sdpa_{backends[0]}", "sdpa", {**both, "backend": backends[0]}, args.budget))
    out.append(("flex", "flex", both, args.budget))
    if cuda and importlib.util.find_spec("flash_attn") is not None:
        # FA4 on SM90 takes head dims 8 to 256, multiples of 8 (16 bytes of a 16-bit dtype)
        out.append(("flash_attn_cute", "flash_attn.cute",
                    {**both, "head_dims": args.fa4_head_dims}, args.budget))
    if args.triton:
        try:
            tutorial = triton_tutorial(args.triton, args.triton_configs)
        except Exception as exc:  # noqa: BLE001 - a tutorial that does not load: say so, go on
            print(f"triton_tutorial: could not load: {type(exc).__name__}: {exc}", flush=True)
        else:
            out.append(("triton_tutorial", tutorial,
                        {"dtypes": "fp16", "device": args.device, "head_dims": "64,128"},
                        args.triton_budget))
    for backend in backends[1:]:
        out.append((f"sdpa_{backend}", "sdpa", {**both, "backend": backend}, args.budget))
    if cuda:
        out.append(("flex_compiled", "flex", {"dtypes": "bf16", "device": args.device,
                                              "head_dims": "64", "backend": "compiled",
                                              "features": "score_mod,mask_mod,lse,grad"},
                    "quick"))
    return out


def versions() -> str:
    import platform

    lines = [f"python {platform.python_version()}"]
    for mod in ("torch", "triton", "numpy", "flash_attn", "cutlass", "quack"):
        try:
            m = importlib.import_module(mod)
            lines.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001 - a version line, whatever went wrong
            lines.append(f"{mod}: not importable ({type(exc).__name__})")
    from importlib import metadata

    for dist in ("flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
                 "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13", "quack-kernels",
                 "apache-tvm-ffi", "torch-c-dlpack-ext", "cuda-bindings"):
        try:
            lines.append(f"{dist} {metadata.version(dist)} (distribution)")
        except metadata.PackageNotFoundError:
            pass
    try:
        import torch

        if torch.cuda.is_available():
            lines.append(f"gpu {torch.cuda.get_device_name()} (capability "
                         f"{torch.cuda.get_device_capability()}), CUDA {torch.version.cuda}, "
                         f"cuDNN {torch.backends.cudnn.version()}")
    except ImportError:
        pass
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triton", help="path of 06-fused-attention.py")
    ap.add_argument("--out", default=".", help="folder for battery.txt and battery.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--budget", default="quick", choices=("quick", "full"))
    ap.add_argument("--triton-budget", default="quick", choices=("quick", "full"))
    ap.add_argument("--triton-configs", type=int, default=None,
                    help="keep that many of the tutorial's autotuner configs (default: all)")
    ap.add_argument("--site", action="append", help="a folder holding FA4's unpacked wheels")
    ap.add_argument("--cases", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--features", default=None,
                    help="features to declare for every target run (default: each target's)")
    ap.add_argument("--fa4-head-dims", default="64,128",
                    help="head dims for flash_attn.cute (FA4 on SM90: 8 to 256, multiples of 8)")
    ap.add_argument("--deadline-s", type=float, default=360.0)
    ap.add_argument("--only", nargs="*", help="names of targets to run")
    args = ap.parse_args()
    import site

    for d in args.site or []:
        site.addsitedir(d)
    from osm_cli.battery import run
    from osm_cli.present.battery import battery_doc, battery_report
    from osm_cli.present.console import as_text
    from osm_cli.present.json import dumps

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "versions.txt").write_text(versions())
    print(versions(), flush=True)
    start = time.perf_counter()
    # a run before this one into the same OUT keeps its batteries
    docs: dict = json.loads((out / "battery.json").read_text()) \
        if (out / "battery.json").exists() else {}
    todo = targets(args)
    if args.only:
        known = [t[0] for t in todo]
        unknown = [n for n in args.only if n not in known]
        if unknown:
            print(f"not targets here: {', '.join(unknown)} (known: {', '.join(known)})",
                  flush=True)
        todo = [t for n in args.only for t in todo if t[0] == n]
    for name, fn, opts, budget in todo:
        left = args.deadline_s - (time.perf_counter() - start)
        if left < 20:
            print(f"{name}: not run (deadline)", flush=True)
            continue
        if args.features:
            opts = {**opts, "features": args.features}
        flags = {"dtypes": "--dtype", "head_dims": "--head-dims", "device": "--device",
                 "backend": "--backend", "features": "--features"}
        what = fn if isinstance(fn, str) else f"benchmarks/battery_gpu.py:{name} (adapter)"
        cmd = f"osm battery {what} " + " ".join(f"{flags[k]} {v}" for k, v in opts.items())
        cmd += f" --budget {budget}" + (f" --seed {args.seed}" if args.seed else "") + (
            f" --cases {args.cases}" if args.cases is not None else "")
        if not isinstance(fn, str):
            cmd += "".join(f" --{k.replace('_', '-')} {v}"
                           for k, v in getattr(fn, "osm_constraints", {}).items())
        print(f"{name}: {cmd}", flush=True)
        t_run = time.perf_counter()

        def progress(done, total, name=name, t_run=t_run):
            if done % 10 == 0 or done == total:
                print(f"  {name}: {done}/{total} cases, {time.perf_counter() - t_run:.0f} s",
                      flush=True)

        try:
            rep = run(fn, budget=budget, cases=args.cases, seed=args.seed, progress=progress,
                      **opts)
        except Exception as exc:  # an adapter that cannot start: say so, go on
            print(f"{name}: could not run: {type(exc).__name__}: {exc}", flush=True)
            continue
        with open(out / "battery.txt", "a", encoding="utf-8") as f:
            f.write(f"$ {cmd}\n" + as_text(battery_report(rep, cmd), 100) + "\n")
        docs[name] = battery_doc(rep, cmd)
        (out / "battery.json").write_text(dumps(docs))
        kinds = "; ".join(f"{', '.join(f.tensors)} @ {f.smallest.case.id}: {f.smallest.message}"
                          for f in rep.failures[:3])
        torch_ref = sum(r.reference == "torch" for r in rep.results)
        print(f"{name}: {len(rep.results)} cases, {rep.failed} failed, {rep.refused} refused, "
              f"{rep.seconds:.1f} s: kernel {rep.kernel_seconds:.1f} s, osm "
              f"{rep.osm_seconds:.1f} s (reference on torch for {torch_ref}). {kinds}",
              flush=True)
    print(json.dumps({"seconds": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
