"""How long `osm trace` takes on 10^7 scores, against a one-shot numpy softmax.

Goal (issue 2): 10^7 float64 scores read from a .npy file, block 4096, the whole `osm trace`
process in under 2 s. Writes the scores to a temporary .npy, then times (best of 3):

  - `osm trace FILE -b 4096` (tables to a pipe) and `--json` to /dev/null, whole process;
  - `python -c "import numpy"` as the floor any Python program pays to start;
  - a naive numpy one-shot (np.load + stabilized softmax) in this process and in a subprocess.

Prints the times and the ratios osm / numpy. A program, not a test: run it with
`python benchmarks/bench_trace.py [N]`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GOAL_S = 2.0
BLOCK = 4096
REPEATS = 3

ONE_SHOT = """
import sys
import numpy as np
s = np.load(sys.argv[1])
m = s.max()
e = np.exp(s - m)
p = e / e.sum()
print(float(m + np.log(e.sum())))
"""


def best_of(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(cmd: list[str], stdout=subprocess.PIPE) -> None:
    result = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr.decode()}")


def one_shot_in_process(path: Path) -> None:
    s = np.load(path)
    m = s.max()
    e = np.exp(s - m)
    e / e.sum()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    osm = shutil.which("osm")
    osm_cmd = [osm] if osm else [sys.executable, "-m", "osm_cli"]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scores.npy"
        np.save(path, rng.normal(0.0, 3.0, n))
        print(f"{n:,} float64 scores ({path.stat().st_size / 1e6:.0f} MB .npy), block {BLOCK}, "
              f"best of {REPEATS}")
        run([*osm_cmd, "trace", str(path), "-b", str(BLOCK)])  # warm the file cache

        results = {
            "osm trace (tables)": best_of(
                lambda: run([*osm_cmd, "trace", str(path), "-b", str(BLOCK)])
            ),
            "osm trace --json > /dev/null": best_of(
                lambda: run([*osm_cmd, "trace", str(path), "-b", str(BLOCK), "--json"],
                            stdout=subprocess.DEVNULL)
            ),
            "python -c 'import numpy'": best_of(
                lambda: run([sys.executable, "-c", "import numpy"])
            ),
            "numpy one-shot, subprocess": best_of(
                lambda: run([sys.executable, "-c", ONE_SHOT, str(path)])
            ),
            "numpy one-shot, in process": best_of(lambda: one_shot_in_process(path)),
        }
    width = max(map(len, results))
    for name, t in results.items():
        print(f"  {name:<{width}}  {t:7.3f} s")
    sub = results["numpy one-shot, subprocess"]
    inproc = results["numpy one-shot, in process"]
    for name in ("osm trace (tables)", "osm trace --json > /dev/null"):
        t = results[name]
        verdict = "meets" if t < GOAL_S else "MISSES"
        print(f"{name}: {t / sub:.1f}x the numpy one-shot subprocess, {t / inproc:.1f}x in "
              f"process; {verdict} the {GOAL_S:g} s goal")


if __name__ == "__main__":
    main()
