"""How fast `osm attention` is, against PyTorch's SDPA and a naive numpy one-shot; and its memory.

Goals (issue 3, item 8):
  1. fp32, B = 1, H = 8, N = 4096, d = 64: osm's `attention()` forward at most 1.5× the time of
     torch.nn.functional.scaled_dot_product_attention on the same CPU, and faster than a naive
     numpy one-shot (np.exp over the full N × N scores);
  2. causal at most 0.6× osm's own non-causal time (skipped tiles);
  3. H = 1, N = 32768, d = 64 through the `osm attention` CLI, with the float64 reference check,
     under 1 GiB peak memory (the child's ru_maxrss from os.wait4).

All times are best of 3 after one warm-up. The BLAS kernels are printed first: the environment
may pin OpenBLAS (numpy's BLAS, which osm uses) to a core type with OPENBLAS_CORETYPE, while
PyTorch brings its own MKL/oneDNN, so the two are not always running the same instruction set.

A program, not a test: `python benchmarks/bench_attention.py [--quick]` (--quick: N = 1024 and
N = 8192 for a smoke run).
"""

from __future__ import annotations

import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

from osm_cli.attention.forward import attention

REPEATS = 3
GIB = 1 << 30
GOAL_VS_TORCH = 1.5
GOAL_CAUSAL = 0.6


def best_of(contenders: dict, repeats: int = REPEATS) -> tuple[dict, dict]:
    """Best seconds and last result of each contender, after one untimed warm-up each.

    The contenders take turns, round by round, so that load from other work on the same cores
    falls on all of them alike rather than on whichever happened to run during it.
    """
    results = {name: fn() for name, fn in contenders.items()}
    best = dict.fromkeys(contenders, math.inf)
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def naive_numpy(q, k, v, causal: bool) -> np.ndarray:
    """softmax(Q·Kᵀ / sqrt(d))·V with the whole (H, N, N) score matrix in memory, in place."""
    s = q @ k.swapaxes(-1, -2)
    s *= np.float32(1 / math.sqrt(q.shape[-1]))
    if causal:
        n = s.shape[-1]  # an additive 0 / -inf mask: the cheapest way numpy has to apply it
        s += np.where(np.tri(n, dtype=bool), np.float32(0), np.float32(-np.inf))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def environment() -> None:
    try:  # loaded first, so that its OpenMP pool shows in threadpool_info below
        import torch  # noqa: F401
    except ImportError:
        pass
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPU(s): {platform.processor() or platform.machine()}")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        print(f"  {var}={os.environ.get(var, '(unset)')}")
    for lib in threadpool_info():
        print(f"  {lib['user_api']:7} {lib['internal_api']:9} version {lib.get('version')}, "
              f"kernel {lib.get('architecture', '-')}, {lib['num_threads']} thread(s): "
              f"{Path(lib['filepath']).name}")


def torch_sdpa():
    try:
        import torch
    except ImportError:
        print("torch is not installed: no PyTorch comparison")
        return None, None
    cfg = torch.__config__.show()
    cpu = next((line.strip() for line in cfg.splitlines() if "CPU capability" in line), "")
    blas = re.search(r"BLAS_INFO=(\w+)", cfg)
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"BLAS {blas.group(1) if blas else '?'}, {cpu.lstrip('- ')}")

    def sdpa(q, k, v, causal):
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_numpy(x) for x in (q, k, v)), is_causal=causal).numpy()

    return torch, sdpa


def forward(n: int, h: int = 8, d: int = 64) -> None:
    print(f"\n== forward, fp32, B = 1, H = {h}, N = {n}, d = {d} (best of {REPEATS}) ==")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
    _, sdpa = torch_sdpa()
    times: dict[str, float] = {}
    for causal in (False, True):
        tag = "causal" if causal else "full"
        contenders = {
            "osm": lambda c=causal: attention(q, k, v, causal=c),
            "osm untraced": lambda c=causal: attention(q, k, v, causal=c, trace_at=None),
            "numpy": lambda c=causal: naive_numpy(q, k, v, c),
        }
        if sdpa is not None:
            contenders["torch"] = lambda c=causal: sdpa(q, k, v, c)
        best, outs = best_of(contenders)
        times.update({f"{name} {tag}": t for name, t in best.items()})
        res = outs["osm"]
        print(f"  osm attention()   {tag:6}  {best['osm']:8.3f} s   "
              f"tiles {res.tiles_computed} computed, {res.tiles_skipped} skipped")
        print(f"  osm, no trace     {tag:6}  {best['osm untraced']:8.3f} s")
        if sdpa is not None:
            print(f"  torch SDPA        {tag:6}  {best['torch']:8.3f} s   "
                  f"max |osm - torch| {np.abs(res.out - outs['torch']).max():.2e}")
        print(f"  naive numpy       {tag:6}  {best['numpy']:8.3f} s   "
              f"max |osm - numpy| {np.abs(res.out - outs['numpy']).max():.2e}")
        del outs, res

    print("  ratios (lower is better for osm):")
    for tag in ("full", "causal"):
        if sdpa is not None:
            r = times[f"osm {tag}"] / times[f"torch {tag}"]
            print(f"    osm / torch SDPA   {tag:6}  {r:6.3f}×   goal ≤ {GOAL_VS_TORCH}×: "
                  f"{'met' if r <= GOAL_VS_TORCH else 'MISSED'}")
        r = times[f"osm {tag}"] / times[f"numpy {tag}"]
        print(f"    osm / naive numpy  {tag:6}  {r:6.3f}×   goal < 1×: "
              f"{'met' if r < 1 else 'MISSED'}")
    r = times["osm causal"] / times["osm full"]
    print(f"    osm causal / osm full      {r:6.3f}×   goal ≤ {GOAL_CAUSAL}×: "
          f"{'met' if r <= GOAL_CAUSAL else 'MISSED'}")
    if sdpa is not None:
        print(f"    torch causal / torch full  {times['torch causal'] / times['torch full']:6.3f}×")


# The CLI runs under this small launcher, not straight from the benchmark: a child started by
# vfork + exec (what subprocess does) inherits its parent's peak RSS into its own ru_maxrss, so a
# child of this process (torch, the naive N × N matrices) would report this process's peak.
LAUNCHER = """
import os, subprocess, sys, time
start = time.perf_counter()
with open(sys.argv[1], "w") as out:
    proc = subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - start
print(os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
sys.stderr.write(err.decode())
"""


def cli_memory(n: int, d: int = 64) -> None:
    print(f"\n== `osm attention` CLI, fp32, H = 1, N = {n}, d = {d}, with the reference check ==")
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in "qkv":
            path = Path(tmp) / f"{name}.npy"
            np.save(path, rng.standard_normal((1, n, d), dtype=np.float32))
            paths.append(str(path))
        out_file = Path(tmp) / "stdout.txt"
        cmd = [sys.executable, "-c", LAUNCHER, str(out_file),
               sys.executable, "-m", "osm_cli", "attention", *paths]
        for extra in ([], ["--causal"], ["--no-reference"]):
            proc = subprocess.run([*cmd, *extra], capture_output=True, text=True, check=False)
            code, wall, maxrss, cpu = proc.stdout.split()
            peak = int(maxrss) * 1024  # ru_maxrss is in KiB on Linux
            label = " ".join(extra) or "full"
            print(f"  {label:14} exit {code}, wall {float(wall):6.2f} s, "
                  f"user+sys {float(cpu):6.2f} s, peak RSS {peak / 2**20:.0f} MiB "
                  f"({peak / GIB:.3f} GiB): goal < 1 GiB {'met' if peak < GIB else 'MISSED'}")
            for line in out_file.read_text().splitlines():
                if line.strip().startswith(("tiles", "max |O", "max relative", "max |LSE")):
                    print(f"                   {' '.join(line.split())}")
            if code != "0":
                print(f"  stderr: {proc.stderr.strip()}")


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    environment()
    # other work on the same cores shows up here; a load near the core count skews the ratios
    print("  load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    forward(1024 if quick else 4096)
    cli_memory(8192 if quick else 32768)
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
