"""What PyTorch's FlashAttention-2 kernels compute, read off their machine code, on the GPU
machine (issue 25): the SASS of the flash kernels inside libtorch_cuda.so, and the values of
CUDA's float32 math functions (expf, logf, 1/x, exp2f, __expf, __logf) with and without
--use_fast_math, so that the CPU model can follow the same instructions.

  torch   cuobjdump -xelf the sm_90 cubins of libtorch_cuda.so into a scratch folder, keep
          those whose symbols name FA2's kernels (KINDS: the forward, split-KV forward and
          combine, the backward's dot(dO, O), main loop and dQ conversion) for head dim 64
          in fp16, and write their SASS (one file per cubin kind, functions cut to
          --max-lines) with a table of which math instructions each function uses
          (MUFU.EX2/LG2/RCP, the FMUL/FFMA feeding them, calls to division or libm slow paths).
  libm    nvcc -cubin -arch=sm_90 a small kernel per function, twice (default flags and
          --use_fast_math), write its SASS, and run it (CuPy) on seeded inputs: exp-like
          functions on x ≤ 0 (uniform on [-30, 0], log-uniform down to -104, and near 0), log
          and 1/x on [1, 256] and [2^-20, 2^20]; saved as libm_values.npz (x, and y per
          function and mode) for benchmarks/kernel_ablation.py and the CPU models.

  verify  osm's CPU models of expf, logf and 1/x (osm_cli/precision/gpu_libm.py) against the
          GPU over whole ranges of float32 inputs, in chunks (the CPU side on every core):
          expf on every x in [-104, 0], logf and 1/x on every x in [2^-20, 2^20].

Leaves out: FA4 (its CuTe DSL kernels are compiled at run time).

Usage (on the GPU machine): python3 benchmarks/kernel_sass.py torch --out $OUT/sass
                            python3 benchmarks/kernel_sass.py libm --out $OUT/libm
                            PYTHONPATH=. python3 benchmarks/kernel_sass.py verify --out $OUT/v
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

KINDS = {  # a kernel: the name of its __global__ function (flash_*_launch_template.h)
    "fwd": "flash_fwd_kernel",
    "fwd_splitkv": "flash_fwd_splitkv_kernel",
    "combine": "flash_fwd_splitkv_combine_kernel",
    "bwd": "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
    "dot_do_o": "flash_bwd_dot_do_o_kernel",
    "convert_dq": "flash_bwd_convert_dq_kernel",
}
HDIM64_FP16 = re.compile(rb"kernel_traitsILi64E.{0,80}?half_t", re.S)
MATH = ("MUFU.EX2", "MUFU.LG2", "MUFU.RCP", "MUFU.TANH", "CALL.REL", "FCHK", "MUFU.RSQ")


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def torch_lib() -> Path:
    import torch

    lib = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cuda.so",):
        if (lib / name).exists():
            return lib / name
    raise SystemExit(f"libtorch_cuda.so not under {lib}")


def cmd_torch(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    lib = torch_lib()
    log(f"extracting sm_90 cubins of {lib} ({lib.stat().st_size / 1e9:.2f} GB)")
    t = time.time()
    subprocess.run(["cuobjdump", "-arch", "sm_90", "-xelf", "all", str(lib)], cwd=scratch,
                   check=False,
                   stdout=subprocess.DEVNULL, timeout=args.timeout)
    cubins = sorted(p for p in scratch.iterdir() if "sm_90" in p.name)
    log(f"{len(cubins)} sm_90 cubins in {time.time() - t:.0f}s")
    found: dict[str, list[Path]] = {k: [] for k in KINDS}
    for p in cubins:
        data = p.read_bytes()
        if b"flash" not in data:
            continue
        for kind, pat in KINDS.items():
            if pat.encode() in data and HDIM64_FP16.search(data):
                found[kind].append(p)
    summary = []
    for kind, paths in found.items():
        summary.append(f"{kind}: {len(paths)} cubins: {' '.join(p.name for p in paths[:6])}")
        for p in paths[:args.per_kind]:
            sass = subprocess.run(["cuobjdump", "-sass", str(p)], capture_output=True,
                                  text=True, timeout=300).stdout
            funcs = re.split(r"\n(?=\s*Function : )", sass)
            keep = [f for f in funcs if re.search(KINDS[kind] + r"I", f.split("\n", 1)[0])]
            text = []
            for f in keep[:args.functions]:
                lines = f.split("\n")
                head = lines[0].strip()
                counts = {m: sum(m in ln for ln in lines) for m in MATH}
                summary.append(f"  {head[:260]}\n    {len(lines)} lines; " + ", ".join(
                    f"{m} {n}" for m, n in counts.items() if n))
                text.append("\n".join(lines[:args.max_lines]))
            (out / f"{kind}_{p.stem}.sass").write_text("\n\n".join(text))
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))


LIBM_SRC = r"""
extern "C" __global__ void run(const float* x, float* y, int n, int which) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float a = x[i], r;
  switch (which) {
    case 0: r = expf(a); break;
    case 1: r = logf(a); break;
    case 2: r = 1.f / a; break;
    case 3: r = exp2f(a); break;
    case 4: r = __expf(a); break;
    case 5: r = __logf(a); break;
    default: r = 0.f;
  }
  y[i] = r;
}
"""
FUNCS = ("expf", "logf", "recip", "exp2f", "__expf", "__logf")
EXPLIKE = {"expf", "exp2f", "__expf"}


def libm_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(x for exp-like functions, x for log and 1/x): seeded, float32."""
    rng = np.random.default_rng(25)
    neg = np.concatenate([
        -rng.uniform(0, 30, n // 2),
        -np.exp(rng.uniform(np.log(1e-6), np.log(104), n // 4)),
        -rng.uniform(0, 2.0 ** -10, n // 8),
        -rng.uniform(0, 1, n - n // 2 - n // 4 - n // 8)]).astype(np.float32)
    pos = np.concatenate([rng.uniform(1, 256, n // 2),
                          np.exp2(rng.uniform(-20, 20, n - n // 2))]).astype(np.float32)
    return neg, pos


def cmd_libm(args) -> None:
    import cupy as cp

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = out / "libm.cu"
    src.write_text(LIBM_SRC)
    neg, pos = libm_inputs(args.n)
    res = {"x_exp": neg, "x_log": pos}
    for mode, flags in (("default", []), ("fast", ["--use_fast_math"])):
        cubin = out / f"libm_{mode}.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", *flags, "-o", str(cubin),
                        str(src)], check=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
        (out / f"libm_{mode}.sass").write_text(sass)
        mod = cp.RawModule(path=str(cubin))
        run = mod.get_function("run")
        for w, name in enumerate(FUNCS):
            x = neg if name in EXPLIKE else pos
            xd = cp.asarray(x)
            yd = cp.empty_like(xd)
            run(((x.size + 255) // 256,), (256,), (xd, yd, np.int32(x.size), np.int32(w)))
            res[f"{name}_{mode}"] = cp.asnumpy(yd)
        log(f"{mode}: {len(sass.splitlines())} SASS lines")
    path = out / "libm_values.npz"
    np.savez_compressed(path, **res)
    log(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


RANGES = {"expf": (np.float32(-104.0), np.float32(-0.0)),
          "logf": (np.float32(2.0 ** -20), np.float32(2.0 ** 20)),
          "recip": (np.float32(2.0 ** -20), np.float32(2.0 ** 20))}


def _model_chunk(job):
    name, lo, hi = job
    from osm_cli.precision import gpu_libm

    bits = np.arange(lo, hi, dtype=np.uint32)
    return getattr(gpu_libm, name)(bits.view(np.float32))


def cmd_verify(args) -> None:
    """Every float32 input of RANGES through the GPU (CuPy, the libm cubin) and the CPU model,
    compared bit for bit (NaN equal to NaN)."""
    import multiprocessing as mp

    import cupy as cp

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = out / "libm.cu"
    src.write_text(LIBM_SRC)
    cubin = out / "libm_default.cubin"
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-o", str(cubin), str(src)],
                   check=True)
    run = cp.RawModule(path=str(cubin)).get_function("run")
    lines = []
    with mp.Pool(args.workers) as pool:
        for name in args.functions:
            lo_f, hi_f = RANGES[name]
            a, b = (int(np.array(x).view(np.uint32)) for x in (lo_f, hi_f))
            lo, hi = min(a, b), max(a, b) + 1  # negative floats: bits grow as x falls
            t = time.time()
            chunk = args.chunk
            jobs = [(name, c, min(c + chunk, hi)) for c in range(lo, hi, chunk)]
            bad = total = 0
            worst = []
            for (nm, c0, c1), model in zip(jobs, pool.imap(_model_chunk, jobs), strict=True):
                x = np.arange(c0, c1, dtype=np.uint32).view(np.float32)
                xd = cp.asarray(x)
                yd = cp.empty_like(xd)
                run(((x.size + 255) // 256,), (256,),
                    (xd, yd, np.int32(x.size), np.int32(FUNCS.index(nm))))
                gpu = cp.asnumpy(yd)
                diff = ~((gpu.view(np.uint32) == model.view(np.uint32))
                         | (np.isnan(gpu) & np.isnan(model)))
                bad += int(diff.sum())
                total += x.size
                if diff.any() and len(worst) < 8:
                    worst += [(float(x[i]), float(gpu[i]), float(model[i]))
                              for i in np.flatnonzero(diff)[:4]]
            line = (f"verify {name:6}: {bad} mismatches over {total} inputs in "
                    f"[{lo_f:g}, {hi_f:g}] ({time.time() - t:.0f}s) {worst[:4]}")
            log(line)
            lines.append(line)
    (out / "verify.txt").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("torch")
    p.add_argument("--out", required=True)
    p.add_argument("--scratch", default="/tmp/torch_cubins")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--per-kind", type=int, default=1, help="cubins of each kind to dump")
    p.add_argument("--functions", type=int, default=2, help="functions of each cubin")
    p.add_argument("--max-lines", type=int, default=12000)
    p = sub.add_parser("libm")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=1 << 18)
    p = sub.add_parser("verify")
    p.add_argument("--out", required=True)
    p.add_argument("--functions", nargs="*", default=["expf", "logf", "recip"])
    p.add_argument("--chunk", type=int, default=1 << 24)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 4)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    {"torch": cmd_torch, "libm": cmd_libm, "verify": cmd_verify}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
