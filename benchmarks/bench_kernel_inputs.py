"""What the kernels' own inputs cost osm's forward (issue: what real kernels take).

Goals:
  1. A varlen batch runs in about the time of its dense equivalent: B sequences of N queries and
     keys packed with cu_seqlens, against the same tensors as one (B, N, H, d) batch (ratio
     printed; "about" is read as at most 1.25×).
  2. softcap, ALiBi and sinks, each on its own, against the plain run of the same inputs (their
     cost is printed; the plain path itself is timed across revisions by bench_revisions.py).
fp32, H = 8, d = 64, causal, traced as the CLI runs it; contenders interleaved round by round,
best of --repeats.

A program, not a test: `python benchmarks/bench_kernel_inputs.py [--quick] [--repeats N]`
(--quick: B = 4, N = 256).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from osm_cli.flash.forward import attention

GOAL_VARLEN = 1.25


def best_of(contenders: dict, repeats: int) -> dict:
    for fn in contenders.values():
        fn()
    best = dict.fromkeys(contenders, math.inf)
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    b, n, h, d = (4, 256, 8, 64) if args.quick else (8, 1024, 8, 64)
    print(f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f}; fp32, B = {b}, "
          f"N = {n}, H = {h}, d = {d}, causal (best of {args.repeats})")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, n, h, d), dtype=np.float32) for _ in range(3))
    cu = np.arange(0, (b + 1) * n, n, dtype=np.int32)
    packed = [x.reshape(b * n, h, d) for x in (q, k, v)]
    slopes = (2.0 ** -np.arange(1, h + 1)).astype(np.float32)
    sinks = rng.standard_normal(h).astype(np.float32)
    contenders = {
        "dense (B, N, H, d)": lambda: attention(q, k, v, layout="bnhd", causal=True),
        "varlen, B sequences": lambda: attention(*packed, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                 causal=True),
        "dense + softcap 30": lambda: attention(q, k, v, layout="bnhd", causal=True,
                                                softcap=30.0),
        "dense + ALiBi": lambda: attention(q, k, v, layout="bnhd", causal=True,
                                           alibi_slopes=slopes),
        "dense + sinks": lambda: attention(q, k, v, layout="bnhd", causal=True, sinks=sinks),
    }
    best = best_of(contenders, args.repeats)
    base = best["dense (B, N, H, d)"]
    for name, t in best.items():
        print(f"  {name:22} {t:8.3f} s   {t / base:6.3f}× dense")
    r = best["varlen, B sequences"] / base
    print(f"goal: varlen ≤ {GOAL_VARLEN}× its dense equivalent: {r:.3f}× "
          f"{'MET' if r <= GOAL_VARLEN else 'MISSED'}")


if __name__ == "__main__":
    main()
