"""The tensor cores' accumulation (precision/mma.py) against BLAS, on this machine's CPU (issue 25).

1. One kernel's matmul, S = Q·Kᵀ of a stack of 16 Q tiles by one K tile, bf16: numpy's float32
   BLAS, mma.tensor_core compiled (numba) and its numpy path, interleaved.
2. The whole forward of --kernel fa2 (run_flash, bf16, B=1, causal) with --mma blas and --mma
   tensor-core, interleaved (each repetition runs both, in turn, so that the load of a shared
   machine hits both alike; medians reported), at H=8, N=2048, d=64 and H=32, N=4096, d=128.

Goal (MET / MISSED): tensor-core ≤ 1.5× blas at both sizes.

Usage: python benchmarks/bench_mma.py [--reps 3] [--big-reps 1] [--skip-big]
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

from osm_cli.precision import mma  # noqa: E402
from osm_cli.precision.kernels import run_flash  # noqa: E402
from osm_cli.precision.model import model  # noqa: E402

GOAL = 1.5


def bf16(rng, shape):
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).astype(np.float32)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(runs: dict, reps: int) -> dict:
    times = {name: [] for name in runs}
    for _ in range(reps):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def one_matmul(reps: int) -> None:
    rng = np.random.default_rng(0)
    a, b = bf16(rng, (8, 1024, 64)), bf16(rng, (8, 64, 128))
    mma.tensor_core(a[:, :16], b)  # compile (or load numba's cache) before timing
    runs = {"blas": lambda: np.matmul(a, b), "numba": lambda: mma.tensor_core(a, b),
            "numpy": lambda: mma.tensor_core_numpy(a, b)}
    med = interleaved(runs, reps)
    print(f"1. S = Q·Kᵀ, (8, 1024, 64) @ (8, 64, 128), bf16: BLAS {med['blas'] * 1e3:.1f} ms, "
          f"tensor-core numba {med['numba'] * 1e3:.1f} ms ({med['numba'] / med['blas']:.1f}× "
          f"BLAS), numpy {med['numpy'] * 1e3:.0f} ms ({med['numpy'] / med['numba']:.0f}× numba)\n")


def forward(h: int, n: int, d: int, reps: int) -> float:
    rng = np.random.default_rng(1)
    q, k, v = (bf16(rng, (1, h, n, d)) for _ in range(3))
    m = model("bf16")
    runs = {how: (lambda how=how: run_flash(m, q, k, v, kernel="fa2", causal=True,
                                            trace_at=None, mma=how))
            for how in ("blas", "tensor-core")}
    med = interleaved(runs, reps)
    ratio = med["tensor-core"] / med["blas"]
    print(f"   H={h:<3} N={n:<5} d={d:<4} blas {med['blas']:7.2f} s   tensor-core "
          f"{med['tensor-core']:7.2f} s   {ratio:5.2f}×  {'MET' if ratio <= GOAL else 'MISSED'}")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big-reps", type=int, default=1)
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    print(f"tensor-core accumulation vs BLAS: {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}, numpy {np.__version__}, numba "
          f"{'yes' if mma.HAVE_NUMBA else 'no (numpy path)'}; medians of interleaved runs\n")
    one_matmul(args.reps)
    run_flash(model("bf16"), *(bf16(np.random.default_rng(2), (1, 1, 64, 64)) for _ in range(3)),
              kernel="fa2", trace_at=None, mma="tensor-core")  # warm: numba's cache loaded
    print("2. run_flash --kernel fa2, bf16, B=1, causal; goal tensor-core ≤ "
          f"{GOAL}× blas (MET / MISSED)")
    worst = forward(8, 2048, 64, args.reps)
    if not args.skip_big:
        worst = max(worst, forward(32, 4096, 128, args.big_reps))
    print(f"\nworst ratio {worst:.2f}×: {'MET' if worst <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
