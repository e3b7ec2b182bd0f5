"""Which modelled step buys which bits of the kernels' outputs (issue 25): FA2's forward build
(PyTorch's UNFUSE_FMA, 1/l without fast math), its split-KV combine (CUDA's expf and logf), and
the backward's arithmetic (kernel_backward.py), each switched back one at a time, against the
kernels captured on an H200 (samples/kernels). Runs on the CPU.

Part F, forward (fa2 on SDPA's flash captures, mma=tensor-core): identical share of O (%) and
  of the LSE for the preset, then Δ (percentage points of O) with one step switched back:
    exp→fma      P = ex2 of one FMA (the fused form PyTorch's build turns off)
    1/l→rcp      O·rcp.approx(l) (a fast-math build's reciprocal)
    comb→np      the combine's exp and log correctly rounded (numpy), not CUDA's expf/logf
    comb→fast    the combine's exp and log as __expf / __logf (ex2, lg2.approx: fast math)
Part B, backward (fa2 on SDPA's flash captures, fa4 on FA4's; dQ, dK, dV): per case the
  identical share (%) and the largest difference in ulps of the element's own value (u) of the
  preset with mma=tensor-core, and osm's blas model for comparison; dQ's run-to-run changes
  on the GPU (the capture's reruns: its atomics) beside it; then, over all cases, the mean
  share and the count of elements more than 2 ulps off with one step switched:
    exp          FA2 "unfused" ↔ FA4 "fma"
    delta        D = rowsum(dO∘O) in numpy's order ("plain") or the other kernel's
    reverse_q    the Q tiles' order flipped (dK, dV's accumulation order)
    scale_c      c = scale·log2e from the float32 scale or the double one
Cases whose name starts with fresh_ are held out: the models were not tuned on them (the
results file says which were looked at when); they are reported apart.

Usage: python benchmarks/kernel_bits.py [--captures DIR] [--part F B] [--only SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from captures import load_cases  # noqa: E402

import osm_cli.precision.splitkv as splitkv  # noqa: E402
from osm_cli.flash.options import split_options  # noqa: E402
from osm_cli.precision import gpu_approx  # noqa: E402
from osm_cli.precision.backward import flash_backward  # noqa: E402
from osm_cli.precision.dtypes import DTYPES, ulp  # noqa: E402
from osm_cli.precision.emulate import run_kernel  # noqa: E402
from osm_cli.precision.gpu_ops import F32, LN2, LOG2E  # noqa: E402
from osm_cli.precision.kernel_backward import kernel_backward  # noqa: E402
from osm_cli.precision.model import model  # noqa: E402
from osm_cli.precision.presets import PRESETS  # noqa: E402

PRESET_OF = {"flash": "fa2", "fa4": "fa4"}
GRADS = ("dq", "dk", "dv")


def held_out(case) -> bool:
    return case.name.startswith("fresh_")


def select(folder: Path, only, kernels=("flash", "fa4")):
    return [c for c in load_cases(folder) if c.kernel in kernels
            and (not only or any(o in c.label for o in only))]


# ----------------------------------------------------------------------------- forward
def _fast_exp(x):
    return gpu_approx.ex2((np.asarray(x, F32) * F32(LOG2E)).astype(F32))


def _fast_log(x):
    return (gpu_approx.lg2(np.asarray(x, F32)) * F32(LN2)).astype(F32)


COMBINES = {"libm": (splitkv.expf, splitkv.logf),
            "np": (lambda x: np.exp(x, dtype=F32), lambda x: np.log(x, dtype=F32)),
            "fast": (_fast_exp, _fast_log)}


def forward_run(case, preset, combine="libm"):
    a = case.arrays
    q, k, v = (np.asarray(a[n], np.float32) for n in "qkv")
    splitkv.expf, splitkv.logf = COMBINES[combine]
    try:
        r = run_kernel(preset, model(case.dtype), q, k, v, trace_at=None, mma="tensor-core",
                       **case.opts)
    finally:
        splitkv.expf, splitkv.logf = COMBINES["libm"]
    same = float(np.mean(r.out == np.asarray(a["out"], np.float32)))
    lse = float(np.mean(r.lse == a["lse"])) if "lse" in a else float("nan")
    return same, lse, r.options.splits


def part_f(folder: Path, only) -> None:
    print("Part F: FA2's forward build and split-KV combine (identical share of O and LSE, %; "
          "Δ O in percentage points with one step switched back; mma=tensor-core)\n")
    base = PRESETS["fa2"]
    variants = (("exp→fma", replace(base, exp="exp2-fma"), "libm"),
                ("1/l→rcp", replace(base, normalise="reciprocal"), "libm"),
                ("comb→np", base, "np"), ("comb→fast", base, "fast"))
    head = "".join(f"{lab:>10}" for lab, *_ in variants)
    for title, keep in (("tuning set", False), ("held out (fresh_*)", True)):
        rows = [c for c in select(folder, only, ("flash",)) if held_out(c) == keep]
        if not rows:
            continue
        print(f"  {title}")
        print(f"  {'case':44}{'splits':>7}{'O':>9}{'LSE':>8}{head}")
        deltas = {lab: [] for lab, *_ in variants}
        for c in rows:
            same, lse, splits = forward_run(c, base)
            cells = []
            for lab, p, comb in variants:
                if comb != "libm" and splits <= 1:
                    cells.append(f"{'·':>10}")
                    continue
                d = 100 * (forward_run(c, p, comb)[0] - same)
                deltas[lab].append(d)
                cells.append(f"{d:+10.3f}")
            print(f"  {c.label:44}{splits:7d}{100 * same:9.3f}{100 * lse:8.2f}{''.join(cells)}",
                  flush=True)
        mean = "".join(f"{np.mean(v) if v else float('nan'):+10.3f}" for v in deltas.values())
        print(f"  {'mean Δ (pp)':44}{'':7}{'':9}{'':8}{mean}\n")


# ----------------------------------------------------------------------------- backward
def element_ulps(a, b, dt) -> np.ndarray:
    """|a − b| in ulps of the dtype at the larger of |a|, |b|, element by element."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.abs(a - b) / ulp(np.maximum(np.abs(a), np.abs(b)), dt)


def backward_run(case, mma="tensor-core", arith=None) -> dict:
    a = case.arrays
    opts = split_options(dict(case.opts))[0]
    q, k, v, do = (a[n].astype(np.float32) for n in ("q", "k", "v", "do"))
    fb = flash_backward(model(case.dtype), q, k, v, do, a["out"].astype(np.float32), a["lse"],
                        opts=opts, trace_at=None, kernel=PRESET_OF[case.kernel], mma=mma,
                        arith=arith)
    dt = DTYPES[case.dtype]
    out = {}
    for g in GRADS:
        m, kk = getattr(fb, g), a[g].astype(np.float32)
        u = element_ulps(m, kk, dt)
        out[g] = (float(np.mean(m == kk)), float(u.max(initial=0)), int((u > 2).sum()))
    if "dq_reruns" in a:  # the GPU's own reruns: elements whose bits change run to run
        alt = a["dq_reruns"].astype(np.float32)
        kk = a["dq"].astype(np.float32)
        nondet = (alt != kk[None]).any(axis=0)
        off = fb.dq != kk
        out["nondet"] = (int(nondet.sum()), int((off & nondet).sum()), int(off.sum()))
    return out


ABLATIONS = {
    "fa2": (("exp→fma", dict(exp="fma")), ("delta→plain", dict(delta="plain")),
            ("delta→fa4", dict(delta="fa4")), ("reverse_q→F", dict(reverse_q=False)),
            ("scale_c→f64", dict(scale_c="f64"))),
    "fa4": (("exp→unfused", dict(exp="unfused")), ("delta→plain", dict(delta="plain")),
            ("delta→fa2", dict(delta="fa2")), ("reverse_q→T", dict(reverse_q=True)),
            ("scale_c→f32", dict(scale_c="f32")), ("group→head", dict(group_fp32=False))),
}


def _cell(r) -> str:
    share, worst, _ = r
    return f"{100 * share:8.3f} {worst:4.0f}u"


def part_b(folder: Path, only) -> None:
    print("Part B: the backward (identical share of dQ, dK, dV, % and the largest difference "
          "in ulps of the element's own value; > 2u: elements more than 2 ulps off; blas: "
          "osm's model before the kernel's arithmetic; reruns: dQ elements the GPU's own "
          "reruns changed, then how many of the model's differing dQ elements are among "
          "them)\n")
    for name, kern in (("fa2", "flash"), ("fa4", "fa4")):
        for title, keep in (("tuning set", False), ("held out (fresh_*)", True)):
            rows = [c for c in select(folder, only, (kern,)) if c.has_grads
                    and held_out(c) == keep]
            if not rows:
                continue
            print(f"  {name}, {title}")
            print(f"  {'case':44}{'dQ':>14}{'dK':>14}{'dV':>14}   {'> 2u':>5}"
                  f"   {'blas dQ, dK, dV':>22}   reruns")
            totals = {"share": {g: [] for g in GRADS}, "big": 0}
            runs = {lab: {"share": [], "big": 0} for lab, _ in ABLATIONS[name]}
            for c in rows:
                r = backward_run(c)
                b = backward_run(c, mma="blas")
                big = sum(r[g][2] for g in GRADS)
                totals["big"] += big
                for g in GRADS:
                    totals["share"][g].append(r[g][0])
                nd = r.get("nondet")
                ndt = f"{nd[0]:3d}; {nd[1]} of the {nd[2]}" if nd else ""
                blas = " ".join(f"{100 * b[g][0]:6.2f}" for g in GRADS)
                print(f"  {c.label:44}{''.join(_cell(r[g]) for g in GRADS)}   {big:5d}   "
                      f"{blas:>22}   {ndt}", flush=True)
                for lab, changes in ABLATIONS[name]:
                    arith = kernel_backward(name, "tensor-core", **changes)
                    x = backward_run(c, arith=arith)
                    runs[lab]["share"].append(np.mean([x[g][0] for g in GRADS]))
                    runs[lab]["big"] += sum(x[g][2] for g in GRADS)
            base = np.mean([np.mean(v) for v in totals["share"].values()])
            print(f"  {'all cases: mean share, elements > 2u':44}{100 * base:13.3f}%"
                  f"{'':28}{totals['big']:5d}")
            for lab, v in runs.items():
                print(f"    {lab:42}{100 * np.mean(v['share']):13.3f}%{'':28}{v['big']:5d}")
            print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captures", type=Path, default=ROOT / "samples" / "kernels")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--part", nargs="*", default=["F", "B"])
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("osm's kernel models against kernels captured on an NVIDIA H200 "
          f"({args.captures}); this program runs on the CPU\n")
    if "F" in args.part:
        part_f(args.captures, args.only)
    if "B" in args.part:
        part_b(args.captures, args.only)
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
