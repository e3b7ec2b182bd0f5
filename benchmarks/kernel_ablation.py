"""Which modelled step of a kernel preset buys which share of bit-identical outputs, and what the
GPU's approximate instructions add (issue 12).

Part 1 (CPU): for every captured forward case (the fa2 preset on SDPA's flash cases, fa4 on
FlashAttention-4's), the preset with mma="tensor-core" (its best match) and then one modelled
step switched back at a time (dataclasses.replace on the Preset):

  exp        "exp2-fma" (exp2 of one FMA, the kernels') → "exp" (osm's exp(S·scale − m·scale))
  normalise  "reciprocal" → "divide"
  row_sum    "quad" → "plain"
  reverse    True → False (K/V tiles first to last)
  block_k    the kernel's → osm's default for the head dim (the same for d ≤ 64: shown anyway)
  mma        "tensor-core" → "blas"

Part 2 (GPU instructions): the CPU computes exp2, tanh and 1/x correctly rounded; the kernels
run ex2.approx.ftz.f32, tanh.approx.f32 (FA4's softcap) and rcp.approx.ftz.f32. Their values
were measured on an H200 (--measure, run there through the device tool) on exactly the float32
inputs osm's model feeds them, and are kept in samples/gpu_ops/{ex2,tanh,rcp}.npz (input bits,
output). This part reruns the model with Ops whose callables look the measured values up
(searchsorted on the input bits; an input not in the table falls back to the CPU's value and
is counted as a miss) and prints how the identical share moves.

Part 3 (CPU): every forward case with the preset's ops correctly rounded (Ops.rounded(), osm
before gpu_approx) and with the default ops, the H200's own instructions modelled bit for bit
(osm_cli/precision/gpu_approx.py), in both mma modes.

Usage:
  python benchmarks/kernel_ablation.py                  # all parts, offline
  python benchmarks/kernel_ablation.py --part 3         # the default ops' table only
  python benchmarks/kernel_ablation.py --record DIR     # the CPU's op inputs as .npy (small)
  python3 benchmarks/kernel_ablation.py --measure OUT   # on the GPU: Triton inline PTX, live
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

from osm_cli.flash.options import default_blocks  # noqa: E402
from osm_cli.precision.emulate import run_kernel  # noqa: E402
from osm_cli.precision.gpu_ops import Ops  # noqa: E402
from osm_cli.precision.model import model  # noqa: E402
from osm_cli.precision.presets import PRESETS  # noqa: E402

PRESET_OF = {"flash": "fa2", "fa4": "fa4"}
OPS = ("ex2", "tanh", "rcp")
PTX = {"ex2": "ex2.approx.ftz.f32 $0, $1;", "tanh": "tanh.approx.f32 $0, $1;",
       "rcp": "rcp.approx.ftz.f32 $0, $1;"}
# the cases whose op inputs were measured: the softcap case and the plain ones
GPU_CASES = ("fa4/bfloat16/softcap", "fa4/bfloat16/combo", "fa4/bfloat16/sink",
             "fa4/bfloat16/plain", "fa4/float16/plain",
             "fa4/bfloat16/plain_d128", "flash/bfloat16/noncausal", "flash/float16/noncausal")
GPU_CONFIGS = (("CPU ops (osm)", ()), ("GPU tanh", ("tanh",)), ("GPU ex2", ("ex2",)),
               ("GPU rcp", ("rcp",)), ("GPU all three", OPS))
TABLES = ROOT / "samples" / "gpu_ops"


def cpu_op(name: str):
    """osm's correctly rounded value of an op (gpu_ops.Ops.rounded())."""
    base = Ops.rounded()
    return {"ex2": base.exp2, "tanh": base.tanh_, "rcp": base.recip}[name]


def cases(folder: Path, only=()):
    out = []
    for c in load_cases(folder):
        if c.kernel in PRESET_OF and (not only or any(o in c.label for o in only)):
            out.append(c)
    return out


def share(case, kernel, mma="tensor-core", ops=None) -> float:
    """The share of O's elements where the model equals the kernel's captured output."""
    a = case.arrays
    q, k, v = (np.asarray(a[n], np.float32) for n in "qkv")
    r = run_kernel(kernel, model(case.dtype), q, k, v, trace_at=None, mma=mma, ops=ops,
                   **dict(case.opts))
    return float(np.mean(r.out == np.asarray(a["out"], np.float32)))


def variants(p):
    """(label, preset, mma) switching one step of preset p at a time."""
    yield "preset", p, "tensor-core"
    yield "exp→exp", replace(p, exp="exp"), "tensor-core"
    yield "norm→div", replace(p, normalise="divide"), "tensor-core"
    yield "sum→plain", replace(p, row_sum="plain"), "tensor-core"
    yield "reverse→F", replace(p, reverse=False), "tensor-core"
    yield "bk→osm", None, "tensor-core"  # filled per head dim by the caller
    yield "mma→blas", p, "blas"


def part1(folder: Path, only) -> None:
    print("Part 1: one modelled step switched at a time (identical share of O, %; the preset "
          "run with mma=tensor-core; Δ in percentage points vs the preset)\n")
    labels = [lab for lab, *_ in variants(PRESETS["fa2"])]
    for name in ("fa2", "fa4"):
        base = PRESETS[name]
        rows = [c for c in cases(folder, only) if PRESET_OF[c.kernel] == name]
        if not rows:
            continue
        print(f"{name} on {'SDPA flash' if name == 'fa2' else 'FlashAttention-4'} cases")
        head = "".join(f"{lab:>10}" for lab in labels)
        print(f"  {'case':28}{head}  bk kernel/osm")
        deltas = {lab: [] for lab in labels}
        for c in rows:
            d = c.arrays["q"].shape[-1]
            dv = c.arrays["v"].shape[-1]
            kbk = base.block_k(d, dv, bool(c.opts.get("causal") or c.opts.get("window")))
            obk = default_blocks(d)[1]
            cells = []
            ref = None
            for lab, p, mma in variants(base):
                if lab == "bk→osm":
                    p = replace(base, widths=((10**9, obk),))
                try:
                    s = 100 * share(c, p, mma)
                except Exception as exc:  # a feature the variant does not take
                    cells.append(f"{'ERR':>10}")
                    print(f"    ({lab}: {type(exc).__name__}: {exc})")
                    continue
                if ref is None:
                    ref = s
                    cells.append(f"{s:10.2f}")
                else:
                    deltas[lab].append(s - ref)
                    cells.append(f"{s - ref:+10.2f}")
            print(f"  {c.label:28}{''.join(cells)}  {kbk}/{obk}", flush=True)
        mean = "".join(f"{'':>10}" if lab == "preset" else
                       f"{np.mean(deltas[lab]) if deltas[lab] else float('nan'):+10.2f}"
                       for lab in labels)
        print(f"  {'mean Δ (pp)':28}{mean}\n")


class Recorder:
    """Ops callables that record every float32 input (and their output) per op."""

    def __init__(self, fns: dict):
        self.fns = fns
        self.seen = {n: [] for n in fns}

    def ops(self) -> Ops:
        def wrap(name):
            def f(x):
                x = np.ascontiguousarray(x, dtype=np.float32)
                y = np.asarray(self.fns[name](x), dtype=np.float32)
                self.seen[name].append((x.ravel().copy(), y.ravel().copy()))
                return y
            return f
        return Ops(**{n: wrap(n) for n in self.fns})

    def pairs(self, name):
        if not self.seen[name]:
            return np.zeros(0, np.uint32), np.zeros(0, np.float32)
        x = np.concatenate([a for a, _ in self.seen[name]]).view(np.uint32)
        y = np.concatenate([b for _, b in self.seen[name]])
        xs, idx = np.unique(x, return_index=True)
        return xs, y[idx]


def record(folder: Path, out: Path) -> None:
    """The float32 inputs osm's model feeds ex2, tanh and rcp on the GPU cases (CPU ops)."""
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder({n: cpu_op(n) for n in OPS})
    for c in cases(folder):
        if c.label in GPU_CASES:
            share(c, PRESETS[PRESET_OF[c.kernel]], "tensor-core", rec.ops())
    for n in OPS:
        xs, _ = rec.pairs(n)
        np.save(out / f"{n}.npy", xs.view(np.float32))
        print(f"{n}: {xs.size} distinct inputs -> {out / (n + '.npy')}")


def gpu_ops():
    """ex2 / tanh / rcp as the GPU's approximate PTX instructions (Triton inline asm)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def k_ex2(X, Y, N, BLOCK: tl.constexpr):
        off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + off, mask=off < N, other=0.0)
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(Y + off, y, mask=off < N)

    @triton.jit
    def k_tanh(X, Y, N, BLOCK: tl.constexpr):
        off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + off, mask=off < N, other=0.0)
        y = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(Y + off, y, mask=off < N)

    @triton.jit
    def k_rcp(X, Y, N, BLOCK: tl.constexpr):
        off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + off, mask=off < N, other=0.0)
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
        tl.store(Y + off, y, mask=off < N)

    kernels = {"ex2": k_ex2, "tanh": k_tanh, "rcp": k_rcp}  # the PTX of PTX, literally

    def fn(name):
        kern = kernels[name]

        def f(x):
            x = np.ascontiguousarray(x, dtype=np.float32)
            flat = torch.from_numpy(x.ravel().copy()).cuda()
            y = torch.empty_like(flat)
            n = flat.numel()
            if n:
                kern[(triton.cdiv(n, 1024),)](flat, y, n, BLOCK=1024)
            return y.cpu().numpy().reshape(x.shape)
        return f

    return {n: fn(n) for n in OPS}


def gpu_part(folder: Path, lookup: dict, note: str, inputs: Path | None = None,
             out: Path | None = None) -> None:
    """The identical share with the GPU's ops (lookup: name -> callable), one config a row."""
    print(f"Part 2: the GPU's approximate instructions ({note}); identical share of O, %, "
          "mma=tensor-core\n")
    sel = [c for c in cases(folder) if c.label in GPU_CASES]
    rec = Recorder(lookup)
    if inputs is not None:  # the CPU-recorded inputs: how far the GPU's ops are from osm's
        print(f"  {'op':5} {'inputs':>8} {'≠ CPU':>8} {'max ulps':>8}")
        for n in OPS:
            p = inputs / f"{n}.npy"
            if not p.exists():
                continue
            x = np.load(p)
            y = rec.ops().exp2(x) if n == "ex2" else (
                rec.ops().tanh_(x) if n == "tanh" else rec.ops().recip(x))
            cpu = cpu_op(n)(x)
            diff = ~((y == cpu) | (np.isnan(y) & np.isnan(cpu)))
            fin = diff & np.isfinite(y) & np.isfinite(cpu)
            ulps = np.abs(y[fin].view(np.int32).astype(np.int64)
                          - cpu[fin].view(np.int32).astype(np.int64))
            print(f"  {n:5} {x.size:8d} {diff.mean():8.2%} {ulps.max(initial=0):8d}")
        print()
    head = "".join(f"{lab:>15}" for lab, _ in GPU_CONFIGS)
    print(f"  {'case':28}{head}")
    misses = {}
    for c in sel:
        p = PRESETS[PRESET_OF[c.kernel]]
        cells = []
        for _lab, names in GPU_CONFIGS:
            ops = rec.ops()
            ops = replace(Ops.rounded(), **{n: getattr(ops, n) for n in names})
            cells.append(f"{100 * share(c, p, 'tensor-core', ops):15.2f}")
        print(f"  {c.label:28}{''.join(cells)}", flush=True)
    for n, f in lookup.items():
        if hasattr(f, "misses"):
            misses[n] = f.misses
    if misses:
        print("  table misses (inputs not measured: the CPU's value used): "
              + ", ".join(f"{n} {m}" for n, m in misses.items()))
    if out is not None:
        for n in OPS:
            xs, ys = rec.pairs(n)
            if inputs is not None and (inputs / f"{n}.npy").exists():
                x0 = np.load(inputs / f"{n}.npy")
                y0 = lookup[n](x0)
                xs = np.concatenate([xs, x0.view(np.uint32)])
                ys = np.concatenate([ys, y0])
                xs, idx = np.unique(xs, return_index=True)
                ys = ys[idx]
            np.savez_compressed(out / f"{n}.npz", x=xs, y=ys, instruction=PTX[n].split()[0])
            print(f"  saved {n}: {xs.size} measured values -> {out / (n + '.npz')}")
    print()


class Table:
    """An op's measured values looked up by input bits (misses: the CPU's value, counted)."""

    def __init__(self, name: str, path: Path):
        z = np.load(path)
        self.x, self.y = z["x"], z["y"]
        self.cpu = cpu_op(name)
        self.misses = 0

    def __call__(self, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        b = x.view(np.uint32)
        i = np.minimum(np.searchsorted(self.x, b), max(self.x.size - 1, 0))
        hit = self.x[i] == b if self.x.size else np.zeros(b.shape, bool)
        self.misses += int((~hit).sum())
        return np.where(hit, self.y[i] if self.x.size else 0, self.cpu(x)).astype(np.float32)


def part3(folder: Path, only) -> None:
    """Every forward case: the preset with correctly rounded ops (osm before gpu_approx) and
    with the default ops (the H200's own, gpu_approx.py), in both mma modes."""
    print("Part 3: the H200's approximate instructions as modelled by default "
          "(osm_cli/precision/gpu_approx.py) against correctly rounded ones; identical share "
          "of O, %\n")
    head = "".join(f"{h:>14}" for h in ("blas rounded", "blas H200", "tc rounded", "tc H200"))
    print(f"  {'case':32}{head}")
    for c in cases(folder, only):
        p = PRESETS[PRESET_OF[c.kernel]]
        cells = [100 * share(c, p, mma, ops) for mma in ("blas", "tensor-core")
                 for ops in (Ops.rounded(), Ops())]
        print(f"  {c.label:32}{''.join(f'{v:14.2f}' for v in cells)}", flush=True)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captures", type=Path, default=ROOT / "samples" / "kernels")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--record", type=Path, help="write the CPU's op inputs (.npy) here")
    ap.add_argument("--measure", type=Path, help="on the GPU: measure, write tables here")
    ap.add_argument("--inputs", type=Path, default=ROOT / "benchmarks" / "gpu_ops_inputs")
    ap.add_argument("--tables", type=Path, default=TABLES)
    ap.add_argument("--part", type=int, nargs="*", default=[1, 2, 3])
    args = ap.parse_args()
    if args.record:
        record(args.captures, args.record)
        return
    if args.measure:
        import torch
        args.measure.mkdir(parents=True, exist_ok=True)
        print(f"measuring on {torch.cuda.get_device_name()} (torch {torch.__version__})\n")
        gpu_part(args.captures, gpu_ops(), "measured live on this GPU", args.inputs,
                 args.measure)
        return
    t0 = time.perf_counter()
    print("osm kernel-preset ablation against kernels captured on an NVIDIA H200 "
          "(samples/kernels); this program runs on the CPU\n")
    if 1 in args.part:
        part1(args.captures, args.only)
    if 3 in args.part:
        part3(args.captures, args.only)
    if 2 not in args.part:
        pass
    elif all((args.tables / f"{n}.npz").exists() for n in OPS):
        gpu_part(args.captures, {n: Table(n, args.tables / f"{n}.npz") for n in OPS},
                 f"values measured on an H200, looked up from {args.tables.relative_to(ROOT)}",
                 args.inputs if args.inputs.exists() else None)
    else:
        print(f"Part 2 skipped: no measured tables in {args.tables}")
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
