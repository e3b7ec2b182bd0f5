"""Speed of the kernel presets' loop (emulate.py) against today's flash model (osm's tiles), on
this machine's CPU (issue 12).

Contenders, interleaved in one run (each repetition times every contender once, in turn, so
that drifts of the machine hit them alike; the median is reported): run_flash(m, q, k, v,
kernel="tiles") and each preset (fa2, fa4, fa4-sm100) with mma="blas"; bf16 inputs, B=1,
H=8, N=2048 and 4096, d=64, full and causal. Then mma="tensor-core" (the exact, slow mode) at
a small size.

Goal (MET / MISSED): a preset ≤ 1.5× today's flash model (every preset, every size).

Usage: python benchmarks/bench_presets.py [--reps 3] [--sizes 2048 4096]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from osm_cli.precision.kernels import run_flash  # noqa: E402
from osm_cli.precision.model import model  # noqa: E402

GOAL = 1.5
PRESETS = ("fa2", "fa4", "fa4-sm100")


def inputs(b, h, n, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((b, h, n, d)).astype(ml_dtypes.bfloat16).astype(np.float32)
            for _ in range(3)]


def contender(m, q, k, v, name: str, causal: bool):
    kw = {} if name == "tiles" else {"mma": "blas"}
    return lambda: run_flash(m, q, k, v, kernel=name, causal=causal, trace_at=None, **kw)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="*", default=[2048, 4096])
    args = ap.parse_args()
    m = model("bfloat16")
    print(f"osm kernel presets vs osm's tiles on the CPU: {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, numpy {np.__version__}; "
          f"median of {args.reps} interleaved repetitions, bf16, B=1, H=8, d=64\n")
    print(f"{'N':>5} {'mask':7} {'tiles s':>8}" + "".join(f"{p + ' s':>12}{'×':>6}"
                                                          for p in PRESETS))
    worst = 0.0
    for n in args.sizes:
        q, k, v = inputs(1, 8, n, 64)
        for causal in (False, True):
            runs = {name: contender(m, q, k, v, name, causal) for name in ("tiles", *PRESETS)}
            times = {name: [] for name in runs}
            for _ in range(args.reps):
                for name, fn in runs.items():
                    times[name].append(timed(fn))
            med = {name: statistics.median(t) for name, t in times.items()}
            cells = ""
            for p in PRESETS:
                r = med[p] / med["tiles"]
                worst = max(worst, r)
                cells += f"{med[p]:12.2f}{r:6.2f}"
            print(f"{n:5d} {'causal' if causal else 'full':7} {med['tiles']:8.2f}{cells}",
                  flush=True)
    print(f"\ngoal: every preset (mma=blas) ≤ {GOAL}× today's flash model (tiles): "
          f"{'MET' if worst <= GOAL else 'MISSED'} (worst {worst:.2f}×)\n")
    n, h = 256, 2
    q, k, v = inputs(1, h, n, 64, seed=1)
    print(f"mma=tensor-core (the tensor cores' accumulation, exact; slow), bf16, B=1, H={h}, "
          f"N={n}, d=64, full, median of {args.reps}:")
    for p in PRESETS:
        tb = statistics.median(timed(lambda p=p: run_flash(m, q, k, v, kernel=p, mma="blas",
                                                           trace_at=None))
                               for _ in range(args.reps))
        tt = statistics.median(timed(lambda p=p: run_flash(m, q, k, v, kernel=p,
                                                           mma="tensor-core", trace_at=None))
                               for _ in range(args.reps))
        print(f"  {p:10} blas {tb:7.3f} s   tensor-core {tt:7.3f} s   ({tt / tb:.0f}× blas)")


if __name__ == "__main__":
    main()
