"""How much memory and time `osm trace` needs on large score files.

Goals:
  1. `osm trace BIG.npy --block B`, BIG.npy a 1-D float64 .npy that osm memory-maps (default
     2·10⁸ scores, a 1.6 GB file; B = 128): the child's peak RSS at most 2× the file's bytes.
     Measured twice: the tables (stdout to a file) and `--json` (stdout to /dev/null). The pages
     of the memory-mapped file that osm reads count in its RSS, so a full pass costs about 1× the
     file by itself; the goal leaves another 1× for everything else.
  2. `osm trace SCORES.npy --json --block 2` on 10⁷ float64 scores, stdout to a file: at most
     5 s wall. Reports the output's size; checks it parses as JSON (json.load, in a child
     process) when it is under 2 GB.
  3. The trace of goal 1 under a memory limit (RLIMIT_AS = 3 × the file's bytes + 1 GiB, set in
     the child before exec): either it succeeds, or it exits with the one "Error: …" line on
     stderr and nothing of the table printed on stdout.

Peak RSS is the child's ru_maxrss from os.wait4; wall time is the whole process, start to exit.
Each child runs with a timeout (--timeout, default 600 s) and is killed past it ("timed out"),
and, so that a run far over its goal fails with MemoryError rather than calling the OOM killer on
a shared machine, under RLIMIT_AS = --ram-cap × MemTotal (default 0.9; 0: no cap). A child that
hits the cap exits with "Error: out of memory …" and its goal reads MISSED.
The scores are random normal (np.random.default_rng(0)), written in chunks with
np.lib.format.open_memmap into a temporary directory (or --dir), never held whole in memory; the
size is scaled down when the free disk (shutil.disk_usage) cannot hold it with room to spare.

A program, not a test: `python benchmarks/bench_memory.py [--quick] [--n N] [--block B]
[--timeout S] [--dir DIR] [--ram-cap F]` (--quick: 10⁷ scores for goals 1 and 3).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_N = 200_000_000
QUICK_N = 10_000_000
JSON_N = 10_000_000  # goal 2's size, whatever --n says
JSON_BLOCK = 2
GOAL_RSS_RATIO = 2.0
GOAL_JSON_S = 5.0
PARSE_LIMIT = 2_000_000_000  # bytes of JSON output past which the json.load check is skipped
CHUNK = 1 << 22  # scores written per chunk: 32 MiB of float64
DISK_RESERVE = 4 * GIB  # left free besides the big file: goal 2's file and JSON output, slack

# Each child runs under this small launcher, not straight from the benchmark: a child started by
# vfork + exec (what subprocess does) inherits its parent's peak RSS into its own ru_maxrss, so a
# child of this process (numpy loaded, the memory-mapped file just written) would report this
# process's peak. The launcher also applies the timeout and, for goal 3, the RLIMIT_AS.
LAUNCHER = """
import os, resource, signal, subprocess, sys, threading, time
out, err, timeout, limit = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])

def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

killed = threading.Event()
with open(out, "wb") as o, open(err, "wb") as e:
    start = time.perf_counter()
    proc = subprocess.Popen(sys.argv[5:], stdout=o, stderr=e,
                            preexec_fn=cap if limit > 0 else None)
    lock = threading.Lock()
    reaped = False

    def kill():
        with lock:
            if not reaped:
                killed.set()
                os.kill(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    with lock:
        reaped = True
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
print(proc.returncode, wall, usage.ru_maxrss, usage.ru_utime + usage.ru_stime, int(killed.is_set()))
"""


@dataclass
class Run:
    label: str
    code: int
    wall: float
    peak: int  # bytes
    cpu: float
    timed_out: bool
    stdout: Path
    stderr: Path
    input_bytes: int

    @property
    def ratio(self) -> float:
        return self.peak / self.input_bytes

    def line(self) -> str:
        state = "timed out" if self.timed_out else f"exit {self.code}"
        return (f"  {self.label:28} {state:9}  wall {self.wall:7.2f} s  "
                f"user+sys {self.cpu:7.2f} s  peak RSS {self.peak / MIB:8.0f} MiB  "
                f"RSS / input {self.ratio:5.2f}×")

    def stderr_lines(self) -> list[str]:
        return self.stderr.read_text(errors="replace").splitlines()

    def show_stderr(self, most: int = 5) -> None:
        lines = self.stderr_lines()
        for line in lines[:most]:
            print(f"      stderr: {line}")
        if len(lines) > most:
            print(f"      stderr: … ({len(lines) - most} more line(s))")


def osm_command() -> list[str]:
    osm = shutil.which("osm")
    return [osm] if osm else [sys.executable, "-m", "osm_cli"]


RAM_CAP = 0  # bytes of RLIMIT_AS on every child, 0: none (main sets it from --ram-cap)


def launch(label: str, cmd: list[str], tmp: Path, input_bytes: int, timeout: float,
           stdout: str | Path | None = None, limit: int = 0) -> Run:
    """Run `cmd` under the launcher: stdout to `stdout` (a file in tmp by default), stderr to a
    file in tmp, RLIMIT_AS `limit` bytes (0: RAM_CAP only), killed after `timeout` seconds."""
    caps = [x for x in (limit, RAM_CAP) if x > 0]
    limit = min(caps) if caps else 0
    tag = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
    out = Path(stdout) if stdout is not None else tmp / f"{tag}.stdout"
    err = tmp / f"{tag}.stderr"
    launcher = [sys.executable, "-c", LAUNCHER, str(out), str(err), str(timeout), str(limit)]
    try:
        proc = subprocess.run([*launcher, *cmd], capture_output=True, text=True, check=False,
                              timeout=timeout + 120)  # a backstop: the launcher kills first
    except subprocess.TimeoutExpired:
        return Run(label, -9, timeout + 120, 0, 0.0, True, out, err, input_bytes)
    if proc.returncode != 0:
        sys.exit(f"the launcher failed ({proc.returncode}):\n{proc.stderr}")
    code, wall, maxrss, cpu, killed = proc.stdout.split()
    return Run(label, int(code), float(wall), int(maxrss) * 1024,  # ru_maxrss: KiB on Linux
               float(cpu), killed == "1", out, err, input_bytes)


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes; empty where there is none."""
    info = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return info


def machine() -> None:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    print(f"{platform.platform()}, python {platform.python_version()}, numpy {np.__version__}")
    print(f"  {os.cpu_count()} CPU(s): {cpu}")
    mem = meminfo()
    if mem:
        print(f"  RAM {mem.get('MemTotal', 0) / GIB:.1f} GiB total, "
              f"{mem.get('MemAvailable', 0) / GIB:.1f} GiB available")
    # other work on the same machine shows up here, in the wall times above all
    print("  load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


def write_scores(path: Path, n: int) -> int:
    """n random normal float64 scores to a .npy, CHUNK at a time; returns the file's bytes."""
    rng = np.random.default_rng(0)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n,))
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        mm[start:stop] = rng.standard_normal(stop - start)
        mm.flush()
    del mm
    return path.stat().st_size


def fit_to_disk(n: int, where: Path) -> int:
    """n, or fewer scores where the free disk cannot hold 8·n bytes plus DISK_RESERVE."""
    free = shutil.disk_usage(where).free
    room = free - DISK_RESERVE
    print(f"  free disk at {where}: {free / GIB:.1f} GiB")
    if 8 * n <= room:
        return n
    fits = max(0, room // 8) // 1_000_000 * 1_000_000
    if fits < 1_000_000:
        sys.exit(f"not enough free disk at {where} for even 10⁶ scores besides "
                 f"{DISK_RESERVE / GIB:.0f} GiB kept free")
    print(f"  scaled down: {n:,} scores would need {8 * n / GIB:.1f} GiB; using {fits:,}")
    return fits


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def goal_rss(run: Run) -> None:
    limit = GOAL_RSS_RATIO * run.input_bytes
    if run.timed_out:
        why = "MISSED (timed out)"
    elif run.code != 0:
        why = f"MISSED (exit {run.code})"
    else:
        why = verdict(run.peak <= limit)
    print(f"    goal peak RSS ≤ {GOAL_RSS_RATIO:g}× input ({limit / MIB:.0f} MiB): {why}")
    if run.code != 0 and not run.timed_out:
        run.show_stderr()


def big_file(osm: list[str], path: Path, size: int, block: int, tmp: Path,
             timeout: float) -> None:
    print(f"\n== goal 1: `osm trace BIG.npy --block {block}`, peak RSS ≤ {GOAL_RSS_RATIO:g}× "
          f"the file ({size / MIB:.0f} MiB) ==")
    cmd = [*osm, "trace", str(path), "--block", str(block)]
    tables = launch("tables, stdout to a file", cmd, tmp, size, timeout)
    print(tables.line())
    print(f"      stdout {tables.stdout.stat().st_size:,} bytes")
    goal_rss(tables)
    as_json = launch("--json, stdout to /dev/null", [*cmd, "--json"], tmp, size, timeout,
                     stdout=os.devnull)
    print(as_json.line())
    goal_rss(as_json)


def json_case(osm: list[str], path: Path, size: int, tmp: Path, timeout: float) -> None:
    print(f"\n== goal 2: `osm trace SCORES.npy --json --block {JSON_BLOCK}`, {JSON_N:,} scores "
          f"({size / MIB:.0f} MiB), at most {GOAL_JSON_S:g} s ==")
    cmd = [*osm, "trace", str(path), "--json", "--block", str(JSON_BLOCK)]
    run = launch("--json, stdout to a file", cmd, tmp, size, timeout)
    print(run.line())
    out_bytes = run.stdout.stat().st_size
    print(f"      output {out_bytes:,} bytes ({out_bytes / MIB:.0f} MiB)")
    if run.timed_out:
        print(f"    goal wall ≤ {GOAL_JSON_S:g} s: MISSED (timed out)")
        return
    if run.code != 0:
        print(f"    goal wall ≤ {GOAL_JSON_S:g} s: MISSED (exit {run.code})")
        run.show_stderr()
        return
    print(f"    goal wall ≤ {GOAL_JSON_S:g} s: {verdict(run.wall <= GOAL_JSON_S)}")
    if out_bytes >= PARSE_LIMIT:
        print(f"      JSON check skipped: the output is not under {PARSE_LIMIT / 1e9:g} GB")
    else:
        # in a child, so that the parsed document's memory is not this process's
        check = [sys.executable, "-c", "import json, sys; json.load(open(sys.argv[1]))",
                 str(run.stdout)]
        parsed = launch("json.load of the output", check, tmp, out_bytes, timeout,
                        stdout=os.devnull)
        state = "timed out" if parsed.timed_out else f"exit {parsed.code}"
        print(f"      json.load: {'parses' if parsed.code == 0 else 'does NOT parse'} ({state}, "
              f"{parsed.wall:.1f} s, peak RSS {parsed.peak / MIB:.0f} MiB)")
        if parsed.code != 0 and not parsed.timed_out:
            for line in parsed.stderr_lines()[-1:]:
                print(f"      json.load: {line}")
    run.stdout.unlink()  # it may be large; the disk is shared


def limited(osm: list[str], path: Path, size: int, block: int, tmp: Path,
            timeout: float) -> None:
    limit = 3 * size + GIB
    if RAM_CAP and RAM_CAP < limit:
        print(f"  note: the RAM cap ({RAM_CAP / MIB:.0f} MiB) is below this goal's limit and "
              "replaces it")
    print(f"\n== goal 3: `osm trace BIG.npy --block {block}` under RLIMIT_AS = 3 × file + 1 GiB "
          f"({limit / MIB:.0f} MiB): success, or one Error: line and no table ==")
    cmd = [*osm, "trace", str(path), "--block", str(block)]
    run = launch("tables, memory-limited", cmd, tmp, size, timeout, limit=limit)
    print(run.line())
    out_bytes = run.stdout.stat().st_size
    errs = [line for line in run.stderr_lines() if line.strip()]
    print(f"      stdout {out_bytes:,} bytes, stderr {len(errs)} line(s)")
    if run.timed_out:
        print("    goal: MISSED (timed out)")
        return
    if run.code == 0:
        print("    goal (succeeds): met")
        return
    run.show_stderr()
    partial = out_bytes > 0
    one_error = len(errs) == 1 and errs[0].startswith("Error:")
    print(f"      partial table output before the error: {'yes' if partial else 'no'}; "
          f"one Error: line: {'yes' if one_error else 'no'}")
    print(f"    goal (fails cleanly): {verdict(one_error and not partial and run.code > 0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_N:,} scores for goals 1 and 3 (a smoke run)")
    parser.add_argument("--n", type=int, default=None,
                        help=f"scores in the big file (default {DEFAULT_N:,})")
    parser.add_argument("--block", type=int, default=128, help="--block for goals 1 and 3")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write the files (default: a temporary directory)")
    parser.add_argument("--ram-cap", type=float, default=0.9, metavar="F",
                        help="RLIMIT_AS on every child, as a fraction of MemTotal (0: none)")
    args = parser.parse_args()
    n = args.n if args.n is not None else (QUICK_N if args.quick else DEFAULT_N)
    if n < 1 or args.block < 1 or args.timeout <= 0:
        parser.error("--n, --block and --timeout must be positive")
    if args.ram_cap < 0:
        parser.error("--ram-cap must be 0 or more")
    global RAM_CAP
    RAM_CAP = int(args.ram_cap * meminfo().get("MemTotal", 0))

    machine()
    osm = osm_command()
    print(f"  osm: {' '.join(osm)}")
    print(f"  RLIMIT_AS on every child: "
          f"{f'{RAM_CAP / GIB:.1f} GiB ({args.ram_cap:g} × MemTotal)' if RAM_CAP else 'none'}")
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_memory_") as name:
        tmp = Path(name)
        n = fit_to_disk(n, tmp)
        big = tmp / "big.npy"
        size = write_scores(big, n)
        print(f"  big file: {n:,} float64 scores, {size:,} bytes ({size / MIB:.0f} MiB)")
        if n == JSON_N:
            small, small_size = big, size
        else:
            small = tmp / "scores.npy"
            small_size = write_scores(small, JSON_N)

        big_file(osm, big, size, args.block, tmp, args.timeout)
        json_case(osm, small, small_size, tmp, args.timeout)
        limited(osm, big, size, args.block, tmp, args.timeout)
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
