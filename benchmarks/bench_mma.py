"""The tensor cores' accumulation (precision/mma.py) against BLAS, on this machine's CPU (issue 25).

0. The machine: CPU model, its vector ISA, numpy's BLAS (library, version, kernel), numba and
   the load average at the start (other work on a shared machine slows both modes).
1. One kernel's matmul, S = Q·Kᵀ of a stack of Q tiles by one K tile, bf16: numpy's float32
   BLAS, mma.tensor_core compiled (numba) and its numpy path (on an eighth of the rows),
   interleaved; ns a term (one multiply-add).
2. The whole forward of --kernel fa2 (run_flash, bf16, B=1, causal) with mma="blas" and
   mma="tensor-core", and
3. the backward with its own forward (flash_backward, the same inputs and a random dO: the
   forward's matmuls are the two modes' only difference; the backward's own run through
   BLAS in both), each at H=8, N=2048, d=64 and H=32, N=4096, d=128. Interleaved: every
   repetition runs both modes, in turn, the first mode alternating, so that the load of a
   shared machine hits both alike; medians of wall times reported, and beside them the
   process's CPU time (both threads), which other work on the machine disturbs less.

4. What a user waits for: `osm attention … --dtype bf16 --kernel fa2 --causal --no-reference`
   and `osm backward …` (its own forward, then the kernel's backward), each a fresh process
   (start-up, loading the .npy files, the run, the summary), with the default matmuls (the
   tensor cores') and with `--mma blas`, interleaved, at both sizes.

Goal (MET / MISSED): tensor-core ≤ 1.5× blas, forward and backward, at both sizes; printed for
the library's runs (2.-3.) and for the commands (4.).

Usage: python benchmarks/bench_mma.py [--reps 3] [--big-reps 1] [--skip-big] [--skip-backward]
                                      [--skip-commands]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from osm_cli.precision import mma  # noqa: E402
from osm_cli.precision.backward import flash_backward  # noqa: E402
from osm_cli.precision.kernels import run_flash  # noqa: E402
from osm_cli.precision.model import model  # noqa: E402

GOAL = 1.5
MODES = ("blas", "tensor-core")
SIZES = ((8, 2048, 64), (32, 4096, 128))


def bf16(rng, shape):
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).astype(np.float32)


def cpu_model() -> tuple[str, str]:
    """The CPU's model name and its widest vector ISA, from /proc/cpuinfo (Linux)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == (platform.processor() or
                                                        platform.machine()):
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags
           else "unknown" if not flags else "SSE")
    return name, isa


def machine() -> None:
    name, isa = cpu_model()
    print(f"machine: {os.cpu_count()} CPU(s), {name}, {isa}; python {platform.python_version()}, "
          f"numpy {np.__version__}")
    for lib in threadpool_info():
        if lib["user_api"] == "blas":
            print(f"  numpy's BLAS: {lib['internal_api']} {lib.get('version')}, kernel "
                  f"{lib.get('architecture', '-')}, {lib['num_threads']} thread(s)")
    if mma.HAVE_NUMBA:
        import llvmlite.binding as llvm
        import numba

        print(f"  numba {numba.__version__} (LLVM's host CPU: {llvm.get_host_cpu_name()})")
    else:
        print("  numba not installed: the numpy path")
    print("  load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


def timed(fn) -> tuple[float, float]:
    """fn's wall time and the CPU time over it: this process's (all threads) and its finished
    children's (section 4's commands)."""
    def cpu() -> float:
        t = os.times()
        return time.process_time() + t.children_user + t.children_system

    t0, c0 = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - t0, cpu() - c0


def interleaved(runs: dict, reps: int, cpu: dict | None = None) -> dict:
    """Median wall time of each run, the runs taken in turn each repetition, the first one
    alternating; cpu, where given, gets the median CPU times."""
    times = {name: [] for name in runs}
    cpus = {name: [] for name in runs}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            wall, used = timed(runs[name])
            times[name].append(wall)
            cpus[name].append(used)
    if cpu is not None:
        cpu.update({name: statistics.median(t) for name, t in cpus.items()})
    return {name: statistics.median(t) for name, t in times.items()}


def one_matmul(reps: int) -> None:
    rng = np.random.default_rng(0)
    a, b = bf16(rng, (8, 1024, 64)), bf16(rng, (8, 64, 128))
    few = a[:, :128]
    mma.tensor_core(a[:, :16], b)  # compile (or load numba's cache) before timing
    runs = {"blas": lambda: np.matmul(a, b), "numba": lambda: mma.tensor_core(a, b),
            "numpy": lambda: mma.tensor_core_numpy(few, b)}
    wide = mma.HAVE_NUMBA and mma.AVX512  # the default kernel is AVX-512's: both, called alike
    if wide:
        from osm_cli.precision import _mma_avx512, _mma_numba

        out, c = np.empty((8, 1024, 128), np.float32), np.zeros((8, 1024, 128), np.float32)
        for name, kern in (("avx512", _mma_avx512), ("portable", _mma_numba)):
            kern.mma(a, b, c, out)  # compile (or load its cache)
            runs[name] = lambda kern=kern: kern.mma(a, b, c, out)
    calls = 5  # a timing of 5 calls each (one takes a few ms: the machine's noise is larger)
    with threadpool_limits(1, user_api="blas"):  # one thread each, as in the kernel's loop
        med = interleaved({name: (lambda fn=fn: [fn() for _ in range(calls)])
                           for name, fn in runs.items()}, max(reps, 5))
    terms = a.size * b.shape[-1] * calls
    ns = {k: v / terms * 1e9 for k, v in med.items()}
    ns["numpy"] *= a.shape[1] / few.shape[1]
    print(f"1. S = Q·Kᵀ, (8, 1024, 64) @ (8, 64, 128), bf16, one thread: ns a term: BLAS "
          f"{ns['blas']:.3f}, tensor-core numba {ns['numba']:.3f} ({ns['numba'] / ns['blas']:.1f}× "
          f"BLAS), numpy {ns['numpy']:.1f} ({ns['numpy'] / ns['numba']:.0f}× numba)")
    if wide:
        print(f"   the kernels alone (out given): AVX-512's {ns['avx512']:.3f}, the portable one "
              f"{ns['portable']:.3f} ({ns['portable'] / ns['avx512']:.2f}×)")
    print()


def row(what: str, h: int, n: int, d: int, runs: dict, reps: int) -> float:
    cpu: dict = {}
    med = interleaved(runs, reps, cpu)
    ratio = med["tensor-core"] / med["blas"]
    print(f"   {what:8} H={h:<3} N={n:<5} d={d:<4} blas {med['blas']:7.2f} s   tensor-core "
          f"{med['tensor-core']:7.2f} s   {ratio:5.2f}×  {'MET' if ratio <= GOAL else 'MISSED'}"
          f"   (CPU {cpu['blas']:.2f} s, {cpu['tensor-core']:.2f} s: "
          f"{cpu['tensor-core'] / cpu['blas']:.2f}×)")
    return ratio


def inputs(h: int, n: int, d: int):
    rng = np.random.default_rng(1)
    return [bf16(rng, (1, h, n, d)) for _ in range(4)]


def forward(h: int, n: int, d: int, reps: int) -> float:
    q, k, v, _ = inputs(h, n, d)
    m = model("bf16")
    runs = {how: (lambda how=how: run_flash(m, q, k, v, kernel="fa2", causal=True,
                                            trace_at=None, mma=how)) for how in MODES}
    return row("forward", h, n, d, runs, reps)


def backward(h: int, n: int, d: int, reps: int) -> float:
    q, k, v, do = inputs(h, n, d)
    m = model("bf16")
    runs = {how: (lambda how=how: flash_backward(m, q, k, v, do, kernel="fa2", mma=how,
                                                 causal=True, trace_at=None)) for how in MODES}
    return row("backward", h, n, d, runs, reps)


def commands(sizes, reps: int, big_reps: int, backward_too: bool) -> list[float]:
    """Section 4: the commands a user runs, fresh processes, on .npy files of the inputs."""
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for h, n, d in sizes:
            files = []
            for name, x in zip(("q", "k", "v", "do"), inputs(h, n, d), strict=True):
                files.append(str(Path(tmp) / f"{name}.npy"))
                np.save(files[-1], x)
            what = [("forward", ["attention", *files[:3]])]
            if backward_too:
                what.append(("backward", ["backward", *files]))
            for label, args in what:
                line = [sys.executable, "-m", "osm_cli", *args, "--dtype", "bf16", "--kernel",
                        "fa2", "--causal", "--no-reference"]
                runs = {how: (lambda line=line, how=how: subprocess.run(
                    line + ([] if how == "tensor-core" else ["--mma", how]), check=True,
                    stdout=subprocess.DEVNULL, cwd=ROOT)) for how in MODES}
                ratios.append(row(label, h, n, d, runs, reps if (h, n, d) == sizes[0]
                                  else big_reps))
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big-reps", type=int, default=1)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-backward", action="store_true")
    ap.add_argument("--skip-commands", action="store_true")
    args = ap.parse_args()
    machine()
    print("medians of interleaved runs\n")
    one_matmul(args.reps)
    for *_, d in SIZES:  # warm: numba's caches loaded for every call's types, tables built
        q, k, v, do = inputs(2, 256, d)
        for how in MODES:
            flash_backward(model("bf16"), q, k, v, do, kernel="fa2", mma=how, causal=True,
                           trace_at=None)
    print(f"2.-3. --kernel fa2, bf16, B=1, causal; goal tensor-core ≤ {GOAL}× blas (MET / MISSED)")
    ratios = []
    for h, n, d in SIZES[:1] if args.skip_big else SIZES:
        reps = args.reps if (h, n, d) == SIZES[0] else args.big_reps
        ratios.append(forward(h, n, d, reps))
        if not args.skip_backward:
            ratios.append(backward(h, n, d, reps))
    worst = max(ratios)
    print(f"\nworst ratio of the library's runs {worst:.2f}×: "
          f"{'MET' if worst <= GOAL else 'MISSED'}")
    if not args.skip_commands:
        print("\n4. the commands, fresh processes (osm attention / osm backward … --dtype bf16 "
              "--kernel fa2 --causal --no-reference; the default against --mma blas)")
        sizes = SIZES[:1] if args.skip_big else SIZES
        worst = max(commands(sizes, args.reps, args.big_reps, not args.skip_backward))
        print(f"\nworst ratio of the commands {worst:.2f}×: "
              f"{'MET' if worst <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
