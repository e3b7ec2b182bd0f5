"""Is a revision of osm slower than another? bench_attention.py --quick's cases, side by side.

Goal (issue 8): `python benchmarks/bench_attention.py --quick` no slower after the layout change
(78eaf9b, "Layers as folders") than before it (its parent, 78eaf9b^). Each revision's own
benchmark prints its own numbers at its own time, so two runs of it cannot be compared on a
machine that other work loads. This program times the same cases for every revision in one run,
interleaved: round by round, each revision's probe runs in its own process, from its own source
tree (`git archive REV`, on PYTHONPATH), and the best time of each case over the rounds is kept.

The cases are bench_attention.py --quick's: `attention()` fp32, B = 1, H = 8, N = 1024, d = 64,
full and causal (the trace on, as the CLI runs it; best of --repeats, default 10, within a
round), and the whole `osm attention` process at H = 1, N = 8192, d = 64: full, --causal and
--no-reference.
Each revision's time is also given over the first's; the verdict is the last revision's, and
"no slower" allows 5 % for noise.

A program, not a test: `python benchmarks/bench_revisions.py [REV ...] [--rounds N]`
(default revisions 78eaf9b^ and HEAD; "." is the working tree as it is).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOISE = 1.05  # a ratio up to this counts as no slower

# Runs inside a child whose PYTHONPATH is one revision's tree; prints its best times as JSON.
PROBE = r"""
import json, subprocess, sys, time
import numpy as np
from osm_cli.flash.forward import attention

files, repeats = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 8, 1024, 64), dtype=np.float32) for _ in range(3))
cases = {"attention() full": lambda: attention(q, k, v),
         "attention() causal": lambda: attention(q, k, v, causal=True)}
best = {}
for name, fn in cases.items():
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    best[name] = min(times)
paths = [f"{files}/{n}.npy" for n in "qkv"]
for extra in ([], ["--causal"], ["--no-reference"]):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "osm_cli", "attention", *paths, *extra], check=True,
                   stdout=subprocess.DEVNULL)
    best["osm attention N=8192 " + (" ".join(extra) or "full")] = time.perf_counter() - start
print(json.dumps(best))
"""


def export(rev: str, into: Path) -> Path:
    """The source tree of `rev` (a commit, or "." for the working tree) under `into`."""
    if rev == ".":
        return ROOT
    tree = into / rev.replace("/", "_").replace("^", "_parent").replace("~", "_back")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def describe(rev: str) -> str:
    if rev == ".":
        return "the working tree"
    out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", rev],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out[:70]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="*", default=["78eaf9b^", "HEAD"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    import numpy as np  # the inputs; the probes import their own osm

    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        rng = np.random.default_rng(1)
        for name in "qkv":
            np.save(tmp_path / f"{name}.npy", rng.standard_normal((1, 8192, 64), dtype=np.float32))
        trees = {rev: export(rev, tmp_path) for rev in args.revs}
        best: dict[str, dict[str, float]] = {rev: {} for rev in args.revs}
        for _ in range(args.rounds):
            for rev, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run([sys.executable, "-c", PROBE, tmp, str(args.repeats)],
                                     env=env, capture_output=True, text=True, check=True,
                                     cwd=tree).stdout
                for case, seconds in json.loads(out).items():
                    best[rev][case] = min(best[rev].get(case, math.inf), seconds)
    first, last = args.revs[0], args.revs[-1]
    for i, rev in enumerate(args.revs):
        print(f"  [{i}] {rev}: {describe(rev)}")
    heads = "".join(f"{f'[{i}]':>10}" for i in range(len(args.revs)))
    ratios = "".join(f"{f'[{i}]/[0]':>10}" for i in range(1, len(args.revs)))
    print(f"\n{'best of ' + str(args.rounds) + ' rounds, seconds':40}{heads}{ratios}   [last]")
    for case in best[first]:
        cells = "".join(f"{best[rev][case]:10.3f}" for rev in args.revs)
        cells += "".join(f"{best[rev][case] / best[first][case]:9.3f}×" for rev in args.revs[1:])
        ratio = best[last][case] / best[first][case]
        print(f"  {case:38}{cells}   {'no slower' if ratio <= NOISE else 'SLOWER'}")
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
