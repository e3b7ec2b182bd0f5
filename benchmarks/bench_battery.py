"""How long osm's own work takes in `osm battery`: drawing the inputs, the float64 reference,
the plain same-dtype baseline, the judgement, shrinking and probing, beside the kernel's time.

The issue's goal: osm's work for `--budget quick` ≤ 60 s on 2 CPU cores with a torch-CPU
kernel with gradients. The kernels: tests/kernels/planted.py's flash_torch (a blockwise torch
kernel, gradients by autograd) declaring causal, GQA, score_mod, mask_mod, LSE and grad; torch's
scaled_dot_product_attention (the `sdpa` adapter, math backend on the CPU) declaring causal,
GQA and grad; a correct numpy kernel declaring every feature but grad; and one planted bug
(shrinking and probing included). With --device cuda, osm's reference runs with torch on the
GPU (benchmarks/battery_gpu.py does the GPU runs). Prints seconds and the ratio to the goal,
measured in this run; on a shared machine the ratio is what to read, not the seconds.

    python benchmarks/bench_battery.py [--device cuda] [--budget quick|full]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--budget", default="quick", choices=("quick", "full"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from kernels.planted import planted, torch_mods

    from osm_cli.battery import run

    runs = []
    try:
        import torch  # noqa: F401

        runs.append(("flash_torch (causal,gqa,mods,lse,grad)", torch_mods, {"arrays": "torch"}))
        runs.append(("sdpa (torch math, causal,gqa,grad)", "sdpa", {"arrays": "torch",
                                                       "device": args.device}))
    except ImportError:
        print("torch is not installed: the torch-CPU kernel is skipped")
    every = "causal,gqa,window,softcap,alibi,sink,varlen,paged,lse"
    runs += [("numpy kernel, every feature", planted(None, every), {"arrays": "numpy"}),
             ("numpy kernel, causal top-left bug", planted("causal_topleft", "causal,gqa,lse"),
              {"arrays": "numpy"})]
    print(f"osm battery, --budget {args.budget}, seed {args.seed}, {os.cpu_count()} CPUs")
    print(f"{'kernel':40} {'cases':>5} {'failed':>6} {'kernel s':>9} {'osm s':>7} "
          f"{'osm / 60 s':>10}")
    for label, fn, opts in runs:
        t0 = time.perf_counter()
        rep = run(fn, budget=args.budget, seed=args.seed, **opts)
        wall = time.perf_counter() - t0
        print(f"{label:40} {len(rep.results):5d} {rep.failed:6d} {rep.kernel_seconds:9.1f} "
              f"{rep.osm_seconds:7.1f} {rep.osm_seconds / GOAL_S:10.2f}   (wall {wall:.1f} s)")


if __name__ == "__main__":
    main()
