"""How long `osm check` takes, and how much memory, on a realistic layer (issue 22, item 6;
issue 25, item 4).

Goals (B = 1, H = 32, N = 4096, d = 128, bf16, causal, forward: out and LSE, osm's model of
the kernel included, as `osm check` runs by default):
  1. a passing kernel: at most 60 s wall and 1.5 GB peak RSS (issue 22), and at most 30 s and
     1 GB (issue 25), on 2 cores;
  2. a failing kernel: its probes and localisation add at most 30 s to the passing check.
Measured: `osm check BUNDLE --causal --dtype bf16` as a child process (peak RSS from os.wait4,
under bench_memory.py's launcher), on three bundles of the same Q, K, V: the correctly rounded
output ("pass"), its LSE in base 2 ("fail: LSE base 2", probes on the LSE only), and the output
of scale 1/d ("fail: scale 1/d", the output's probes on 2 heads and the tile map of one).
The three run interleaved, `--rounds` times (default 2); each case's median is reported, and
the failing cases' extra time as the median of the per-round differences to the passing run
beside them, which the machine's drift between rounds does not move. The machine is shared:
the numbers are this run's, the goals judged on them.

A program, not a test: `python benchmarks/bench_check.py [--rounds R] [--n N] [--heads H]`
(smaller --n and --heads for a quick look; the goals are stated for the defaults).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_memory  # noqa: E402 (a sibling program: its launcher and machine line)
from bench_memory import LAUNCHER, osm_command  # noqa: E402

MB = 1e6
GOAL_S, GOAL_RSS, GOAL_PROBE_S = 60.0, 1.5e9, 30.0  # issue 22
GOAL25_S, GOAL25_RSS = 30.0, 1.0e9  # issue 25, item 4


def bundles(tmp: Path, n: int, heads: int, d: int) -> dict[str, Path]:
    """The three bundles: q, k, v (B, H, N, d) bf16 values as float32; out and lse of osm's
    float64 reference rounded to bf16 (pass), with the LSE in base 2, and with scale 1/d."""
    import ml_dtypes

    from osm_cli.flash.reference import reference

    rng = np.random.default_rng(22)
    q, k, v = (rng.standard_normal((1, heads, n, d)).astype(ml_dtypes.bfloat16)
               for _ in range(3))
    f64 = [x.astype(np.float64) for x in (q, k, v)]
    out, lse = reference(*f64, causal=True)
    bad, _ = reference(*f64, causal=True, scale=1.0 / d)
    base = {"q": q.astype(np.float32), "k": k.astype(np.float32), "v": v.astype(np.float32)}
    cases = {
        "pass": (out, lse),
        "fail: LSE base 2": (out, lse / np.log(2.0)),
        "fail: scale 1/d": (bad, lse),
    }
    paths = {}
    for i, (name, (o, ls)) in enumerate(cases.items()):
        p = tmp / f"case{i}.npz"
        np.savez(p, **base, out=o.astype(ml_dtypes.bfloat16).astype(np.float32),
                 lse=ls.astype(np.float32))
        paths[name] = p
    return paths


def run(path: Path, tmp: Path, timeout: float) -> tuple[int, float, float, float]:
    """(exit code, wall seconds, peak RSS bytes, user+sys seconds) of one `osm check` child."""
    cmd = [*osm_command(), "check", str(path), "--causal", "--dtype", "bf16"]
    got = subprocess.run([sys.executable, "-c", LAUNCHER, str(tmp / "out.txt"),
                          str(tmp / "err.txt"), str(timeout), "0", *cmd],
                         capture_output=True, text=True, check=True)
    code, wall, rss_kib, cpu = got.stdout.split()[:4]
    return int(code), float(wall), int(rss_kib) * 1024, float(cpu)


def machine() -> None:
    """The CPU, the ISA numpy's BLAS and torch use, and the load: the numbers are this
    machine's, at this load (user+sys seconds are less moved by other work than wall)."""
    from threadpoolctl import threadpool_info

    bench_memory.machine()
    blas = [f"{x['internal_api']} {x.get('architecture') or ''} ({x['num_threads']} threads)"
            for x in threadpool_info() if x["user_api"] == "blas"]
    print(f"  numpy's BLAS: {', '.join(blas) or 'unknown'}")
    try:
        import torch

        print(f"  torch {torch.__version__}: {torch.backends.cpu.get_cpu_capability()}")
    except ImportError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args()
    print(f"osm check, B=1 H={a.heads} N={a.n} d={a.d} bf16 causal (shared machine: this "
          "run's numbers)")
    machine()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        paths = bundles(tmp, a.n, a.heads, a.d)
        results: dict[str, list] = {name: [] for name in paths}
        for r in range(a.rounds):
            for name, p in paths.items():
                code, wall, rss, cpu = run(p, tmp, a.timeout)
                results[name].append((code, wall, rss))
                print(f"  round {r + 1}  {name:18} exit {code}  wall {wall:6.1f} s  "
                      f"user+sys {cpu:6.1f} s  peak RSS {rss / MB:6.0f} MB  load "
                      "{:.1f}".format(os.getloadavg()[0]), flush=True)
    print()
    passing = results["pass"]
    med = {n: statistics.median(w for _, w, _ in rs) for n, rs in results.items()}
    peak = {n: max(x for _, _, x in rs) for n, rs in results.items()}
    codes_ok = all(c == 0 for c, _, _ in passing) and all(
        c == 1 for n, rs in results.items() if n != "pass" for c, _, _ in rs)
    print(f"exit codes as expected (0 pass, 1 fail): {'yes' if codes_ok else 'NO'}")
    ok1 = med["pass"] <= GOAL_S and peak["pass"] <= GOAL_RSS
    print(f"goal 1, passing kernel: median {med['pass']:.1f} s (≤ {GOAL_S:g}), peak "
          f"{peak['pass'] / MB:.0f} MB (≤ {GOAL_RSS / MB:.0f}): {'met' if ok1 else 'MISSED'}")
    ok25 = med["pass"] <= GOAL25_S and peak["pass"] <= GOAL25_RSS
    print(f"issue 25's goal, passing kernel: median {med['pass']:.1f} s (≤ {GOAL25_S:g}), peak "
          f"{peak['pass'] / MB:.0f} MB (≤ {GOAL25_RSS / MB:.0f}): "
          f"{'met' if ok25 else 'MISSED'}")
    for name, rs in results.items():
        if name == "pass":
            continue
        extra = statistics.median(w - pw for (_, w, _), (_, pw, _) in zip(rs, passing,
                                                                          strict=True))
        ratio = med[name] / med["pass"] if med["pass"] else float("nan")
        ok = extra <= GOAL_PROBE_S and peak[name] <= GOAL_RSS
        print(f"goal 2, {name}: +{extra:.1f} s over the passing run beside it ({ratio:.2f}×; "
              f"≤ +{GOAL_PROBE_S:g} s), peak {peak[name] / MB:.0f} MB: "
              f"{'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
