"""How fast `osm attention` is: the forward against PyTorch's SDPA, the float64 reference
against a chunked float64 torch computation, and the whole command at N = 32768.

Goals (issue 13, speed items 1 and 2; issue 3's faster-than-naive-numpy is kept):
  1. fp32, B = 1, H = 8, N = 4096, d = 64: osm's `attention()` forward (FA2's tiles, the trace
     on, as the CLI runs it) at most 1.5× the time of
     torch.nn.functional.scaled_dot_product_attention with the same thread count, and faster
     than a naive numpy one-shot (np.exp over the full N × N scores);
  2. causal at most 0.55× osm's own full time (skipped tiles);
  3. the float64 reference (attention.reference, which every attention, check and sweep run
     pays) at H = 4, N = 8192, d = 64 at most 1.2× a chunked float64 torch computation
     (scale·Q·Kᵀ, logsumexp, softmax·V a chunk of rows at a time; torch gets the fastest of
     three chunk sizes);
  4. `osm attention` at H = 1, N = 32768, d = 64 with the reference check: at most 15 s wall and
     1 GiB peak memory (the child's ru_maxrss from os.wait4).

Each contender runs once untimed, then the contenders of a section (full and causal together)
take turns, round by round, and the best of the rounds is kept (--repeats, default 7), so that
load from other work on the same cores falls on all of them alike. The one-thread section times
osm's fused loop and SDPA on one thread each in CPU seconds, which other work on a shared
machine disturbs least. Beside the BLAS kernels the benchmark prints the SIMD targets numpy
dispatches its own loops to and the ISA torch runs (ATEN_CPU_CAPABILITY=avx2, with
MKL_ENABLE_INSTRUCTIONS=AVX2, runs torch as on an AVX2 machine). Beside osm's fused loops
(attention/fast.py, reference._one_shot_fused) the textbook forms run too (fused=False), and the
benchmark says whether their outputs are identical on these inputs. The schedule section times
the fused forward four ways (threads over Q tiles or not, BLAS threads or not), to show whether
attention()'s choice is the best one here.
The BLAS kernels are printed first: the environment may pin OpenBLAS (numpy's BLAS, which osm
uses) to a core type with OPENBLAS_CORETYPE, while PyTorch brings its own MKL/oneDNN, so the two
are not always running the same instruction set.

A program, not a test: `python benchmarks/bench_attention.py [--quick] [--repeats R]
[--only forward,one-thread,schedule,reference,cli]` (--quick: N = 1024 for the forward, H = 4,
N = 2048 for the reference, N = 8192 for the CLI; --only: those sections, to rerun one that
load disturbed).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from osm_cli.flash.fast import fused_q_tiles, plan_ops
from osm_cli.flash.forward import attention
from osm_cli.flash.options import Hooks, ScoreOptions, Tiling
from osm_cli.flash.plan import make_plan, q_groups
from osm_cli.flash.reference import reference

GIB = 1 << 30
GOAL_VS_TORCH = 1.5
GOAL_CAUSAL = 0.55
GOAL_REFERENCE = 1.2
GOAL_CLI_S = 15.0
REPEATS = 7
CLI_ROUNDS = 2
THREADS = os.cpu_count() or 1


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


ROUNDS: dict = {}  # the last best_of's seconds of every contender in every round


def best_of(contenders: dict, repeats: int) -> tuple[dict, dict]:
    """Best seconds and last result of each contender, after one untimed warm-up each, the
    contenders taking turns round by round (each round's seconds kept in ROUNDS)."""
    results = {name: fn() for name, fn in contenders.items()}
    best = dict.fromkeys(contenders, math.inf)
    ROUNDS.clear()
    ROUNDS.update({name: [] for name in contenders})
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            results[name] = fn()
            took = time.perf_counter() - start
            ROUNDS[name].append(took)
            best[name] = min(best[name], took)
    return best, results


def paired(a: str, b: str) -> float:
    """The median over the last best_of's rounds of a's seconds over b's in the same round: a
    ratio that drifts of the machine between rounds do not move."""
    return statistics.median(x / y for x, y in zip(ROUNDS[a], ROUNDS[b], strict=True))


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


def environment():
    """Print the machine, the BLAS libraries and torch; return torch (None if not installed)."""
    try:  # loaded first, so that its OpenMP pool shows in threadpool_info below
        import torch
    except ImportError:
        torch = None
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPU(s): {cpu_model()}")
    print(f"  numpy's own SIMD (its exp, max, sums): {numpy_simd()}")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        print(f"  {var}={os.environ.get(var, '(unset)')}")
    for lib in threadpool_info():
        print(f"  {lib['user_api']:7} {lib['internal_api']:9} version {lib.get('version')}, "
              f"kernel {lib.get('architecture', '-')}, {lib['num_threads']} thread(s): "
              f"{Path(lib['filepath']).name}")
    if torch is None:
        print("  torch is not installed: no PyTorch comparison")
        return None
    torch.set_num_threads(THREADS)  # the same thread count as osm's: one per core
    cfg = torch.__config__.show()
    cpu = next((line.strip() for line in cfg.splitlines() if "CPU capability" in line), "")
    blas = re.search(r"BLAS_INFO=(\w+)", cfg)
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"BLAS {blas.group(1) if blas else '?'}, {cpu.lstrip('- ')}; "
          f"osm: {THREADS} thread(s)")
    return torch


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (/proc/cpuinfo: a hypervisor
    may show only "AMD EPYC"), else what platform says."""
    try:
        info = dict(line.split(":", 1) for line in
                    Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                    if ":" in line)
        info = {key.strip(): val.strip() for key, val in info.items()}
        return (f"{info['model name']} (family {info.get('cpu family', '?')}, model "
                f"{info.get('model', '?')})")
    except (OSError, KeyError):
        return platform.processor() or platform.machine()


def numpy_simd() -> str:
    """The SIMD targets numpy dispatches to here, the widest last (X86_V4: AVX-512)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    found = [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]
    return ", ".join(found) or "baseline only"


def one_thread(torch, n: int, repeats: int, h: int = 8, d: int = 64) -> None:
    """osm's fused loop and SDPA on one thread each, timed in CPU seconds of this process: the
    like-for-like comparison that other work on a shared machine disturbs least (it slows
    what runs but does not add to its CPU time the way it adds to wall time)."""
    print(f"\n== forward on one thread each, fp32, B = 1, H = {h}, N = {n}, d = {d}, CPU time "
          f"(best of {repeats}) ==")
    if torch is None:
        print("  torch is not installed: no PyTorch comparison")
        return
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
    plan = make_plan(q, k, v, ScoreOptions(), Tiling(), Hooks(), (0, 0, 0))
    out5 = np.zeros((*plan.q5.shape[:-1], d), np.float32)
    lse5 = np.zeros(plan.q5.shape[:-1], np.float32)
    groups = q_groups(plan)

    def osm():
        with threadpool_limits(1, user_api="blas"):
            for grp in groups:
                fused_q_tiles(plan, grp, out5, lse5)

    def sdpa1():
        torch.set_num_threads(1)
        try:
            return sdpa(torch, q, k, v, False)
        finally:
            torch.set_num_threads(THREADS)

    best = dict.fromkeys(("osm", "torch"), math.inf)
    for fn in (osm, sdpa1):
        fn()
    for _ in range(repeats):
        for name, fn in (("osm", osm), ("torch", sdpa1)):
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    print(f"  osm's fused loop, 1 thread, 1 BLAS thread   {best['osm']:7.3f} s CPU")
    print(f"  torch SDPA, torch.set_num_threads(1)        {best['torch']:7.3f} s CPU")
    r = best["osm"] / best["torch"]
    print(f"    osm / torch SDPA, one thread each   {r:6.3f}×   goal ≤ {GOAL_VS_TORCH}×: "
          f"{verdict(r <= GOAL_VS_TORCH)}")


def sdpa(torch, q, k, v, causal: bool) -> np.ndarray:
    with torch.no_grad():
        return torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(x) for x in (q, k, v)), is_causal=causal).numpy()


def identical(a, b) -> bool:
    """The same runs: out and lse bit for bit, the same counters and traced steps."""
    return (np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
            and (a.tiles.computed, a.tiles.skipped, a.counters.rescales, a.counters.row_visits)
            == (b.tiles.computed, b.tiles.skipped, b.counters.rescales, b.counters.row_visits)
            and [(s.m, s.l, s.alpha, s.o_norm) for s in a.trace.steps]
            == [(s.m, s.l, s.alpha, s.o_norm) for s in b.trace.steps])


def forward(torch, n: int, repeats: int, h: int = 8, d: int = 64) -> None:
    print(f"\n== forward, fp32, B = 1, H = {h}, N = {n}, d = {d} (best of {repeats}) ==")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
    # osm's full and causal runs first and next to each other in every round: their ratio is a
    # goal, and the machine's speed may drift within a round
    contenders = {f"osm {tag}": lambda c=causal: attention(q, k, v, causal=c)
                  for tag, causal in (("full", False), ("causal", True))}
    for causal in (False, True):
        tag = "causal" if causal else "full"
        contenders.update({
            f"osm untraced {tag}": lambda c=causal: attention(q, k, v, causal=c, trace_at=None),
            f"osm textbook {tag}": lambda c=causal: attention(q, k, v, causal=c, fused=False),
            f"numpy {tag}": lambda c=causal: naive_numpy(q, k, v, c),
        })
        if torch is not None:
            contenders[f"torch {tag}"] = lambda c=causal: sdpa(torch, q, k, v, c)
    times, outs = best_of(contenders, repeats)
    ops = plan_ops(make_plan(q, k, v, ScoreOptions(), Tiling(), Hooks(), None))
    how = "compiled (numba, flash/rows.py)" if ops.compiled else "numpy"
    print(f"  osm's row operations: {how}")
    for tag in ("full", "causal"):
        res = outs[f"osm {tag}"]
        same = identical(res, outs[f"osm textbook {tag}"])
        print(f"  osm attention()   {tag:6}  {times[f'osm {tag}']:8.3f} s   "
              f"tiles {res.tiles.computed} computed, {res.tiles.skipped} skipped")
        print(f"  osm, no trace     {tag:6}  {times[f'osm untraced {tag}']:8.3f} s")
        print(f"  osm, textbook     {tag:6}  {times[f'osm textbook {tag}']:8.3f} s   "
              f"(fused=False) out, lse, counters and trace {'identical' if same else 'DIFFER'}")
        if torch is not None:
            print(f"  torch SDPA        {tag:6}  {times[f'torch {tag}']:8.3f} s   "
                  f"max |osm - torch| {np.abs(res.out - outs[f'torch {tag}']).max():.2e}")
        print(f"  naive numpy       {tag:6}  {times[f'numpy {tag}']:8.3f} s   "
              f"max |osm - numpy| {np.abs(res.out - outs[f'numpy {tag}']).max():.2e}")
    del outs
    print("  ratios (lower is better for osm):")
    for tag in ("full", "causal"):
        if torch is not None:
            r = times[f"osm {tag}"] / times[f"torch {tag}"]
            print(f"    osm / torch SDPA   {tag:6}  {r:6.3f}×   goal ≤ {GOAL_VS_TORCH}×: "
                  f"{verdict(r <= GOAL_VS_TORCH)}")
        r = times[f"osm {tag}"] / times[f"numpy {tag}"]
        print(f"    osm / naive numpy  {tag:6}  {r:6.3f}×   goal < 1×: {verdict(r < 1)}")
        r = times[f"osm {tag}"] / times[f"osm textbook {tag}"]
        print(f"    fused / textbook   {tag:6}  {r:6.3f}×")
    r = times["osm causal"] / times["osm full"]
    print(f"    osm causal / osm full      {r:6.3f}×   goal ≤ {GOAL_CAUSAL}×: "
          f"{verdict(r <= GOAL_CAUSAL)}   (best of each)")
    r = paired("osm causal", "osm full")
    print(f"    osm causal / osm full      {r:6.3f}×   goal ≤ {GOAL_CAUSAL}×: "
          f"{verdict(r <= GOAL_CAUSAL)}   (median of the rounds' own ratios)")
    if torch is not None:
        print(f"    torch causal / torch full  {times['torch causal'] / times['torch full']:6.3f}×")


def schedules(n: int, repeats: int, h: int = 8, d: int = 64) -> None:
    """The fused forward's Q tiles run four ways: which uses this machine's cores best?"""
    print(f"\n== schedule of the fused forward, fp32, B = 1, H = {h}, N = {n}, d = {d}, "
          f"untraced (best of {repeats}) ==")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
    plan = make_plan(q, k, v, ScoreOptions(), Tiling(), Hooks(), None)
    out5 = np.zeros((*plan.q5.shape[:-1], d), np.float32)
    lse5 = np.zeros(plan.q5.shape[:-1], np.float32)
    groups = q_groups(plan)

    def run(workers: int, blas: int):
        def go():
            with threadpool_limits(blas, user_api="blas"), ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda grp: fused_q_tiles(plan, grp, out5, lse5), groups))
        return go

    ways = {
        f"{THREADS} threads over Q tiles, 1 BLAS thread each (attention())": run(THREADS, 1),
        f"1 thread, BLAS on {THREADS} threads": run(1, THREADS),
        f"{THREADS} threads over Q tiles, BLAS on {THREADS} threads each": run(THREADS, THREADS),
        "1 thread, 1 BLAS thread (one core)": run(1, 1),
    }
    best, _ = best_of(ways, repeats)
    chosen = next(iter(ways))
    for name, t in best.items():
        print(f"  {name:62} {t:7.3f} s  {t / best[chosen]:5.2f}×")
    fastest = best[chosen] <= min(best.values()) * 1.02
    print(f"  attention()'s schedule is {'the fastest' if fastest else 'NOT the fastest'} here "
          "(2 % allowed for noise)")


def torch_reference(torch, q, k, v, rows: int):
    """softmax(scale·Q·Kᵀ)·V and its logsumexp in float64, `rows` query rows at a time."""
    scale = 1 / math.sqrt(q.shape[-1])
    qt, kt, vt = (torch.from_numpy(x).double() for x in (q, k, v))
    out = torch.empty((*qt.shape[:-1], vt.shape[-1]), dtype=torch.float64)
    lse = torch.empty(qt.shape[:-1], dtype=torch.float64)
    with torch.no_grad():
        kT = kt.transpose(-1, -2)
        for i0 in range(0, qt.shape[-2], rows):
            s = (qt[..., i0:i0 + rows, :] * scale) @ kT
            lse[..., i0:i0 + rows] = torch.logsumexp(s, -1)
            out[..., i0:i0 + rows, :] = torch.softmax(s, -1) @ vt
    return out.numpy(), lse.numpy()


def reference_vs_torch(torch, h: int, n: int, repeats: int, d: int = 64) -> None:
    print(f"\n== float64 reference, fp32 inputs, B = 1, H = {h}, N = {n}, d = {d} "
          f"(best of {repeats}) ==")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
    osm_rows = max(1, (1 << 22) // (h * n))  # osm's chunk: 2²² scores over all heads
    contenders = {"osm reference()": lambda: reference(q, k, v),
                  "reference as written": lambda: reference(q, k, v, fused=False)}
    chunks = sorted({max(1, osm_rows // 4), max(1, osm_rows // 2), osm_rows})
    if torch is not None:
        for rows in chunks:
            contenders[f"torch, {rows} rows a chunk"] = (
                lambda r=rows: torch_reference(torch, q, k, v, r))
    best, outs = best_of(contenders, repeats)
    same = all(np.array_equal(a, b) for a, b in zip(outs["osm reference()"],
                                                    outs["reference as written"], strict=True))
    for name, t in best.items():
        print(f"  {name:28} {t:8.3f} s")
    print(f"  osm reference() and the reference as written: {'identical' if same else 'DIFFER'}")
    r = best["osm reference()"] / best["reference as written"]
    print(f"    fused / as written         {r:6.3f}×")
    if torch is not None:
        fastest = min((t, name) for name, t in best.items() if name.startswith("torch"))
        err = np.abs(outs["osm reference()"][0] - outs[fastest[1]][0]).max()
        r = best["osm reference()"] / fastest[0]
        print(f"    osm / {fastest[1]:22} {r:6.3f}×   goal ≤ {GOAL_REFERENCE}×: "
              f"{verdict(r <= GOAL_REFERENCE)}   (max |osm - torch| {err:.1e})")


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


def cli(n: int, rounds: int, d: int = 64) -> None:
    print(f"\n== `osm attention` CLI, fp32, H = 1, N = {n}, d = {d} (best wall, highest peak of "
          f"{rounds} rounds) ==")
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
        runs: dict[str, list] = {}
        lines: dict[str, list[str]] = {}
        for _ in range(rounds):
            for extra in ([], ["--causal"], ["--no-reference"]):
                label = " ".join(extra) or "with reference"
                proc = subprocess.run([*cmd, *extra], capture_output=True, text=True,
                                      check=False)
                code, wall, maxrss, cpu = proc.stdout.split()
                if code != "0":
                    print(f"  {label}: exit {code}: {proc.stderr.strip()}")
                runs.setdefault(label, []).append((float(wall), int(maxrss) * 1024, float(cpu)))
                lines[label] = [" ".join(line.split()) for line in out_file.read_text()
                                .splitlines() if line.strip().startswith(("tiles", "max |O"))]
        for label, got in runs.items():
            wall, peak, cpu = min(g[0] for g in got), max(g[1] for g in got), min(g[2] for g in got)
            print(f"  {label:15} wall {wall:6.2f} s, user+sys {cpu:6.2f} s, peak RSS "
                  f"{peak / 2**20:5.0f} MiB ({peak / GIB:.3f} GiB)")
            for line in lines[label]:
                print(f"                  {line}")
            if label == "with reference":
                print(f"    goals: wall ≤ {GOAL_CLI_S:g} s {verdict(wall <= GOAL_CLI_S)}, "
                      f"peak ≤ 1 GiB {verdict(peak <= GIB)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--only", default="forward,one-thread,schedule,reference,cli",
                        help="the sections to run, comma-separated (to rerun one disturbed)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    torch = environment()
    # other work on the same cores shows up here; a load near the core count skews the ratios
    print("  load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if "forward" in only:
        forward(torch, 1024 if args.quick else 4096, args.repeats)
    if "one-thread" in only:
        one_thread(torch, 1024 if args.quick else 4096, args.repeats)
    if "schedule" in only:
        schedules(1024 if args.quick else 4096, args.repeats)
    if "reference" in only:
        reference_vs_torch(torch, 4, 2048 if args.quick else 8192, args.repeats)
    if "cli" in only:
        cli(8192 if args.quick else 32768, CLI_ROUNDS)
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
