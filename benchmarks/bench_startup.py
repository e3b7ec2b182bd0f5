"""How long `osm --help` takes, the whole process, against what any Python program pays to start.

Goal (issue 13, item 3): `osm --help` in at most 0.3 s on the project's machine (2 cores). Runs,
interleaved round by round so that a busy moment hits every command alike:

  - `osm --help` (the installed script, or `python -m osm_cli` with --src);
  - `osm trace --help`, which builds one command's options the same way;
  - `python -c pass`, the interpreter's own start, and `python -c "import typer"`, the floor of
    any typer program; `python -c "import numpy"` for scale (what `--help` no longer loads).

Prints each one's best and median and the ratio to the interpreter's start, then the verdict on
the median beside the goal: MET or MISSED. A program, not a test:

    python benchmarks/bench_startup.py [--repeats N] [--src CHECKOUT]

--src runs `python -m osm_cli` from another checkout (for example the main branch before this
change) in place of the installed `osm`, to measure the two side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

GOAL_S = 0.3


def timed(cmd: list[str], env: dict, cwd: str | None) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            cwd=cwd)
    took = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr.decode()}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="rounds (each runs every command)")
    ap.add_argument("--src", help="a checkout to run as `python -m osm_cli` instead of `osm`")
    args = ap.parse_args()
    env, cwd = dict(os.environ), None
    if args.src:  # `python -m` puts the working folder first on the path: run from the checkout
        cwd = env["PYTHONPATH"] = os.path.abspath(args.src)
        osm = [sys.executable, "-m", "osm_cli"]
    else:
        found = shutil.which("osm")
        osm = [found] if found else [sys.executable, "-m", "osm_cli"]
    py = sys.executable
    commands = {
        "osm --help": [*osm, "--help"],
        "osm trace --help": [*osm, "trace", "--help"],
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import typer'": [py, "-c", "import typer"],
        "python -c 'import numpy'": [py, "-c", "import numpy"],
    }
    for cmd in commands.values():  # warm the file cache
        timed(cmd, env, cwd)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, cmd in commands.items():
            times[name].append(timed(cmd, env, cwd))
    where = f" (from {args.src})" if args.src else ""
    print(f"{os.cpu_count()} cores, {args.repeats} interleaved rounds{where}")
    floor = statistics.median(times["python -c pass"])
    width = max(map(len, times))
    print(f"  {'':<{width}}     best   median   median / python -c pass")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<{width}}  {min(ts):6.3f} s {med:6.3f} s   {med / floor:5.2f}x")
    med = statistics.median(times["osm --help"])
    verdict = "MET" if med <= GOAL_S else "MISSED"
    print(f"osm --help: median {med:.3f} s, goal <= {GOAL_S:g} s: {verdict}")


if __name__ == "__main__":
    main()
