"""Speed of the flash precision model against the float32 path of attention (target: bf16 ≤ 2×).

H = 8, N = 4096, d = 64 (B = 1), not causal and causal. The float32 path is attention() on
float32 inputs (state in float32, P unrounded, O not rounded). The bf16 model adds what
--dtype bf16 costs: rounding Q, K, V, rounding every P tile before P·V, rounding O / l.
float16, float8_e4m3fn and the one-shot naive model are timed too, for information.
Each figure is the median of --repeat runs after one warm-up.

Usage: python benchmarks/bench_precision.py [--n 4096] [--heads 8] [--d 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from osm_cli.precision.dtypes import round_inputs
from osm_cli.precision.kernels import run_flash
from osm_cli.precision.model import model, run_naive

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


att = importlib.import_module("osm_cli.flash")  # the package's `attention` is the function


def timed(fn, repeat: int) -> float:
    fn()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def model_run(name: str, precision: str, q, k, v, causal: bool):
    m = model(name, precision)

    def run():
        (qr, kr, vr), _ = round_inputs({"Q": q, "K": k, "V": v}, m.dtype)
        if precision == "naive":
            return run_naive(m, qr, kr, vr, trace_at=None, causal=causal)
        return run_flash(m, qr, kr, vr, trace_at=None, causal=causal)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, args.heads, args.n, args.d)).astype(np.float32)
               for _ in range(3))
    print(f"H = {args.heads}, N = {args.n}, d = {args.d}; {os.cpu_count()} CPUs; median of "
          f"{args.repeat}")
    print(f"{'causal':<7} {'run':<26} {'seconds':>8} {'÷ float32':>10}")
    for causal in (False, True):
        base = timed(lambda c=causal: att.attention(q, k, v, causal=c, trace_at=None),
                     args.repeat)
        print(f"{causal!s:<7} {'float32 path':<26} {base:8.3f} {1.0:10.2f}")
        for name, precision in (("bfloat16", "flash"), ("float16", "flash"),
                                ("float8_e4m3fn", "flash"), ("bfloat16", "naive")):
            sec = timed(model_run(name, precision, q, k, v, causal), args.repeat)
            print(f"{causal!s:<7} {f'{name} {precision}':<26} {sec:8.3f} {sec / base:10.2f}")


if __name__ == "__main__":
    main()
