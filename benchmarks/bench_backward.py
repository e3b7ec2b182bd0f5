"""How fast and how lean osm's backward pass is (issue: the backward pass).

Goals:
  1. fp32, B = 1, H = 8, N = 4096, d = 64: `attention_backward()` given the forward's O and LSE
     (as a real backward gets them) at most 3× the time of osm's own forward `attention()`, both
     traced as the CLI runs them; PyTorch's CPU backward of scaled_dot_product_attention
     (torch.autograd.grad of the same output, the graph kept) printed beside them, same run.
  2. `osm backward` at H = 1, N = 32768, d = 64, with the float64 reference check: peak RSS
     under 1 GiB (the child's ru_maxrss from os.wait4, through bench_attention's launcher).

The contenders take turns round by round (best of 3 after a warm-up each), so that load from
other work on the same cores falls on all of them alike.

A program, not a test: `python benchmarks/bench_backward.py [--quick]` (--quick: N = 1024 and
N = 8192).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_attention import GIB, LAUNCHER, best_of, environment

from osm_cli.flash.backward import attention_backward
from osm_cli.flash.forward import attention

GOAL_VS_FORWARD = 3.0


def torch_backward(q, k, v, do):
    """A function timing PyTorch's CPU SDPA backward of these inputs (None without torch)."""
    try:
        import torch
    except ImportError:
        print("  torch is not installed: no PyTorch comparison")
        return None
    tq, tk, tv = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    g = torch.from_numpy(do)

    def run():
        return [x.numpy() for x in torch.autograd.grad(out, (tq, tk, tv), g, retain_graph=True)]

    return run


def speed(n: int, h: int = 8, d: int = 64) -> None:
    print(f"\n== backward, fp32, B = 1, H = {h}, N = {n}, d = {d} (best of 3) ==")
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(4))
    fwd = attention(q, k, v)
    contenders = {
        "osm forward": lambda: attention(q, k, v),
        "osm backward": lambda: attention_backward(q, k, v, do, out=fwd.out, lse=fwd.lse),
    }
    torch_run = torch_backward(q, k, v, do)
    if torch_run is not None:
        contenders["torch backward"] = torch_run
    best, outs = best_of(contenders, 3)
    for name, t in best.items():
        print(f"  {name:15} {t:8.3f} s")
    res = outs["osm backward"]
    print(f"  tiles: {res.tiles.computed} computed, {res.tiles.skipped} skipped")
    if torch_run is not None:
        diff = max(float(np.abs(a - b).max()) for a, b in zip(
            (res.dq, res.dk, res.dv), outs["torch backward"], strict=True))
        print(f"  max |osm − torch| over dQ, dK, dV: {diff:.2e}")
        ratio = best["osm backward"] / best["torch backward"]
        print(f"  osm backward / torch backward  {ratio:6.3f}×")
    r = best["osm backward"] / best["osm forward"]
    print(f"  osm backward / osm forward     {r:6.3f}×   goal ≤ {GOAL_VS_FORWARD}×: "
          f"{'met' if r <= GOAL_VS_FORWARD else 'MISSED'}")


def cli_memory(n: int, d: int = 64) -> None:
    print(f"\n== `osm backward` CLI, fp32, H = 1, N = {n}, d = {d}, with the reference check ==")
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in ("q", "k", "v", "do"):
            path = Path(tmp) / f"{name}.npy"
            np.save(path, rng.standard_normal((1, n, d), dtype=np.float32))
            paths.append(str(path))
        out_file = Path(tmp) / "stdout.txt"
        cmd = [sys.executable, "-c", LAUNCHER, str(out_file),
               sys.executable, "-m", "osm_cli", "backward", *paths]
        for extra in ([], ["--causal"]):
            proc = subprocess.run([*cmd, *extra], capture_output=True, text=True, check=False)
            code, wall, maxrss, cpu = proc.stdout.split()
            peak = int(maxrss) * 1024  # ru_maxrss is in KiB on Linux
            label = " ".join(extra) or "full"
            print(f"  {label:9} exit {code}, wall {float(wall):6.2f} s, user+sys "
                  f"{float(cpu):6.2f} s, peak RSS {peak / 2**20:.0f} MiB ({peak / GIB:.3f} GiB): "
                  f"goal < 1 GiB {'met' if peak < GIB else 'MISSED'}")
            for line in out_file.read_text().splitlines():
                if line.strip().startswith(("tiles", "max |d")):
                    print(f"              {' '.join(line.split())}")
            if code != "0":
                print(f"  stderr: {proc.stderr.strip()}")


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    environment()
    print("  load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    speed(1024 if quick else 4096)
    cli_memory(8192 if quick else 32768)
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
