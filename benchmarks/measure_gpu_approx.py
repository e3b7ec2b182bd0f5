"""Measure the GPU's approximate float32 instructions over their whole input domain, find their
structure, and check osm's model of them (osm_cli/precision/gpu_approx.py) bit for bit.

Runs on a CUDA GPU (written for the H200 through the device tool); the instructions run as
inline PTX in tiny Triton kernels, one thread an input, every input generated from its bit
pattern in the kernel, so all 2^32 float32 inputs of an instruction take seconds.

Instructions: ex2.approx.ftz.f32 and ex2.approx.f32, lg2.approx.ftz.f32 and lg2.approx.f32,
tanh.approx.f32, rcp.approx.ftz.f32.

  explore OUT   every input of every instruction against the correctly rounded value (float64
                on the GPU, rounded once), ulp histograms per input exponent; the structure
                hypotheses below, their mismatch counts per input exponent; the tables the model
                is built from (written to OUT/approx_tables.npz) and a JSON summary.
  build FILE    measure the tables osm's model holds and write them in its format (the file
                osm_cli/precision/data/gpu_approx_h200.npz was written so).
  verify OUT    osm's numpy model (gpu_approx.py, run on the machine's CPU cores) against the
                hardware: every input in each domain, mismatch counts (the goal is 0).

Structure hypotheses tested (docs/gpu-approx.md says what was found):
  ex2   x is turned into fixed point X = q(x·2^F) (q: floor, trunc or round-to-nearest-even;
        F = 22, 23, 24); ex2(x) = T[X mod 2^F] · 2^(X div 2^F) with T[f] = ex2(f·2^-F), flushed
        to zero below 2^-126 (ftz).
  lg2   x = 2^e·m (m in [1, 2)): lg2(x) = round(e + G[m]) with G[m] = lg2(m) (round to nearest
        even, or toward zero), and the fixed-point grid of G.
  rcp   rcp(2^e·m) = 2^-e · rcp(m).
  tanh  odd symmetry; per input exponent, the fewest mantissa bits the output depends on
        (input truncated or rounded to k bits); which output mantissa bits are ever set.

What was found: docs/gpu-approx.md; the numbers: benchmarks/results/gpu_approx_h200.txt.

Usage (on the GPU machine; only torch, Triton and numpy are needed there, no install of osm):
  python3 benchmarks/measure_gpu_approx.py explore $OUT
  python3 benchmarks/measure_gpu_approx.py build $OUT/gpu_approx_h200.npz
  python3 benchmarks/measure_gpu_approx.py verify $OUT --tables $OUT/gpu_approx_h200.npz
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PTX = {"ex2": "ex2.approx.ftz.f32 $0, $1;", "ex2_noftz": "ex2.approx.f32 $0, $1;",
       "lg2": "lg2.approx.ftz.f32 $0, $1;", "lg2_noftz": "lg2.approx.f32 $0, $1;",
       "tanh": "tanh.approx.f32 $0, $1;", "rcp": "rcp.approx.ftz.f32 $0, $1;"}
CHUNK = 1 << 28  # inputs per launch (1 GiB of float32)
DEV = "cuda"  # --dry: "cpu", torch's own functions standing in for the instructions
T0 = time.perf_counter()


def log(*a) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------- the kernels
KERNEL_SRC = """
import triton
import triton.language as tl


@triton.jit
def k_bits(Y, base, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = (base + off).to(tl.uint32)
    x = bits.to(tl.float32, bitcast=True)
    y = tl.inline_asm_elementwise("ASM", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(Y + off, y, mask=off < n)


@triton.jit
def k_arr(X, Y, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + off, mask=off < n, other=0.0)
    y = tl.inline_asm_elementwise("ASM", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(Y + off, y, mask=off < n)
"""


def kernels():
    """{name: (from_bits(base, n) -> float32 tensor, on(x) -> float32 tensor)}: the instruction
    on the n inputs whose bit patterns are base .. base + n − 1, or on a tensor's values. Each
    instruction's two kernels are written out as a module with the PTX as a string literal
    (Triton reads a kernel's source), then imported."""
    import importlib.util
    import tempfile

    import torch

    if DEV == "cpu":
        return {name: fake(name) for name in PTX}
    folder = Path(tempfile.mkdtemp(prefix="gpu_approx_"))

    def make(name, asm):
        path = folder / f"k_{name}.py"
        path.write_text(KERNEL_SRC.replace("ASM", asm))
        spec = importlib.util.spec_from_file_location(f"k_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)

        def from_bits(base: int, n: int):
            y = torch.empty(n, dtype=torch.float32, device=DEV)
            mod.k_bits[((n + 1023) // 1024,)](y, base, n, BLOCK=1024)
            return y

        def on(x):
            x = x.contiguous().view(-1)
            y = torch.empty_like(x)
            if x.numel():
                mod.k_arr[((x.numel() + 1023) // 1024,)](x, y, x.numel(), BLOCK=1024)
            return y

        return from_bits, on

    return {name: make(name, asm) for name, asm in PTX.items()}


def fake(name):
    """--dry: the correctly rounded function in float32, for a run of the flow on a CPU."""
    def on(x):
        return reference(name, x)

    def from_bits(base, n):
        return on(bits_tensor(base, n))

    return from_bits, on


def bases(span: int):
    """The first input bits of each chunk of [0, span) (--dry: a few chunks only)."""
    if DEV == "cpu":
        return [b for b in (0x3F000000, 0x3F800000, 0x40000000, 0x4300000, 0xBF800000,
                            0xC2F00000) if b + CHUNK <= span]
    return range(0, span, CHUNK)


def bits_tensor(base: int, n: int):
    """The float32 values whose bit patterns are base .. base + n − 1."""
    import torch

    b = torch.arange(base, base + n, dtype=torch.int64, device=DEV)
    b = torch.where(b >= 2**31, b - 2**32, b).to(torch.int32)
    return b.view(torch.float32)


def ordered(x):
    """float32 bits as int64 in the order of the values (−0 and +0 both 0)."""
    import torch

    i = x.view(torch.int32).to(torch.int64)
    return torch.where(i >= 0, i, -(i & 0x7FFFFFFF))


def ulps(a, b):
    """a − b in ulps (both float32 tensors; NaN pairs 0, NaN against a number 2^40)."""
    import torch

    d = ordered(a) - ordered(b)
    na, nb = torch.isnan(a), torch.isnan(b)
    d = torch.where(na & nb, torch.zeros_like(d), d)
    return torch.where(na ^ nb, torch.full_like(d, 2**40), d)


def reference(name: str, x):
    """The correctly rounded value (float64 on the GPU, rounded once to float32)."""
    import torch

    x64 = x.double()
    with torch.no_grad():
        if name.startswith("ex2"):
            r = torch.exp2(x64)
        elif name.startswith("lg2"):
            r = torch.log2(x64)
        elif name == "tanh":
            r = torch.tanh(x64)
        else:
            r = 1.0 / x64
    return r.float()


def small_int(t):
    """An integer tensor as numpy int8 / int16 / int32, the smallest that holds it."""
    import torch

    a = int(t.abs().max()) if t.numel() else 0
    dt = torch.int8 if a < 2**7 else torch.int16 if a < 2**15 else torch.int32
    return t.to(dt).cpu().numpy()


def band(x):
    """0 .. 511: sign·256 + biased exponent of each float32."""
    import torch

    return ((x.view(torch.int32).to(torch.int64) >> 23) & 0x1FF)


# ----------------------------------------------------------------------------- explore
def hist_ulps(name, from_bits, summary):
    """Every input against the correctly rounded value: per input band (sign, exponent) the
    count of inputs, of differing outputs and the largest |ulps|; and a global histogram."""
    import torch

    n_band = torch.zeros(512, dtype=torch.int64, device=DEV)
    n_diff = torch.zeros(512, dtype=torch.int64, device=DEV)
    max_d = torch.zeros(512, dtype=torch.int64, device=DEV)
    hist = torch.zeros(2 * 64 + 3, dtype=torch.int64, device=DEV)
    for base in bases(2**32):
        x = bits_tensor(base, CHUNK)
        y = from_bits(base, CHUNK)
        d = ulps(y, reference(name, x))
        bd = band(x)
        n_band += torch.bincount(bd, minlength=512)
        n_diff += torch.bincount(bd[d != 0], minlength=512)
        max_d.scatter_reduce_(0, bd, d.abs(), reduce="amax")
        hist += torch.bincount((d.clamp(-65, 65) + 65), minlength=131)
    nb, nd, md = (t.cpu().numpy() for t in (n_band, n_diff, max_d))
    summary[name] = {
        "differ_from_correctly_rounded": int(nd.sum()), "inputs": int(nb.sum()),
        "ulp_histogram_-65..65(clipped)": {int(i - 65): int(c) for i, c in
                                           enumerate(hist.cpu().numpy()) if c},
        "bands": {f"{'-' if b >= 256 else '+'}e{(b & 255) - 127}":
                  [int(nd[b]), int(md[b])] for b in range(512) if nd[b]}}
    log(f"{name}: {int(nd.sum())} of 2^32 differ from the correctly rounded value; "
        f"histogram {summary[name]['ulp_histogram_-65..65(clipped)']}")


def tally(bad, samples, ok, x, y, pred) -> None:
    """Count the inputs (where ok) whose measured y differs from a hypothesis' pred, per band,
    into bad; keep up to 8 × 64 of them (x, y, pred bits) in samples."""
    import torch

    mis = ok & (ulps(y, pred) != 0)
    bad += torch.bincount(band(x)[mis], minlength=512)
    if len(samples) < 8 and mis.any():
        idx = torch.nonzero(mis)[:64, 0]
        samples.append(torch.stack([x[idx].view(torch.int32), y[idx].view(torch.int32),
                                    pred[idx].view(torch.int32)], 1).cpu().numpy())


def ex2_hypotheses(name, from_bits, on, summary, tables):
    """ex2(x) = T[f]·2^i with X = q(x·2^F), i = X >> F, f = X mod 2^F (module docstring)."""
    import torch

    res = {}
    ftz = not name.endswith("noftz")
    for F in (22, 23, 24):
        f_all = torch.arange(0, 2**F, dtype=torch.float64, device=DEV) * 2.0**-F
        T = on(f_all.float()).double()
        if F in (23, 24):
            ref = torch.exp2(f_all).float()
            tables[f"{name}_T{F}_minus_cr"] = small_int(T.float().view(torch.int32)
                                                        - ref.view(torch.int32))
        for mode in ("floor", "trunc", "rne"):
            bad = torch.zeros(512, dtype=torch.int64, device=DEV)
            samples = []
            for base in bases(2**32):
                x = bits_tensor(base, CHUNK)
                y = from_bits(base, CHUNK)
                x64 = x.double()
                ok = torch.isfinite(x64) & (x64.abs() < 200)
                s = torch.where(ok, x64, torch.zeros_like(x64)) * 2.0**F
                X = {"floor": torch.floor, "trunc": torch.trunc, "rne": torch.round}[mode](s)
                X = X.to(torch.int64)
                i, f = X >> F, X & (2**F - 1)
                pred = torch.ldexp(T[f], i.double())
                if ftz:
                    pred = torch.where(pred < 2.0**-126, torch.zeros_like(pred), pred)
                tally(bad, samples, ok, x, y, pred.float())
            b = bad.cpu().numpy()
            key = f"F{F}_{mode}"
            res[key] = {"mismatches": int(b.sum()),
                        "bands": {f"{'-' if k >= 256 else '+'}e{(k & 255) - 127}": int(b[k])
                                  for k in range(512) if b[k]}}
            if samples:
                s = np.concatenate(samples)[:64]
                res[key]["samples_x_hw_pred_hex"] = [[f"{int(v) & 0xFFFFFFFF:08x}" for v in row]
                                                     for row in s[:12]]
                tables[f"{name}_{key}_samples"] = s
            log(f"{name} {key}: {int(b.sum())} mismatches")
    summary[name + "_hypotheses"] = res


def mantissa_hypotheses(name, from_bits, on, summary, tables):
    """lg2 and rcp as a function of the mantissa and the exponent (module docstring)."""
    import torch

    m = 1.0 + torch.arange(0, 2**23, dtype=torch.float64, device=DEV) * 2.0**-23
    G = on(m.float())
    ref = reference(name, m.float())
    tables[f"{name}_m_minus_cr"] = small_int(G.view(torch.int32) - ref.view(torch.int32))
    G64 = G.double()
    if name.startswith("lg2"):
        grid = {}
        for K in range(20, 40):
            grid[K] = bool(torch.all(torch.frac(G64 * 2.0**K) == 0))
        summary[name + "_G_on_grid_2^-K"] = grid
        H = on((m / 2).float())
        tables[f"{name}_half_m_minus_cr"] = small_int(
            H.view(torch.int32) - reference(name, (m / 2).float()).view(torch.int32))
    res = {}
    modes = ("rne", "rtz") if name.startswith("lg2") else ("scale",)
    for mode in modes:
        bad = torch.zeros(512, dtype=torch.int64, device=DEV)
        samples = []
        for base in bases(2**31):  # the positive inputs
            x = bits_tensor(base, CHUNK)
            y = from_bits(base, CHUNK)
            xi = x.view(torch.int32).to(torch.int64)
            e = (xi >> 23) & 255
            ok = (e > 0) & (e < 255)
            mi = xi & 0x7FFFFF
            if name.startswith("lg2"):
                exact = (e - 127).double() + G64[mi]
                pred = exact.float()
                if mode == "rtz":
                    over = pred.double().abs() > exact.abs()
                    pred = torch.where(over, torch.nextafter(pred, torch.zeros_like(pred)), pred)
            else:
                pred = torch.ldexp(G64[mi], (127 - e).double())
                pred = torch.where(pred < 2.0**-126, torch.zeros_like(pred), pred).float()
            tally(bad, samples, ok, x, y, pred)
        b = bad.cpu().numpy()
        res[mode] = {"mismatches": int(b.sum()),
                     "bands": {f"e{(k & 255) - 127}": int(b[k]) for k in range(512) if b[k]}}
        if samples:
            tables[f"{name}_{mode}_samples"] = np.concatenate(samples)[:256]
        log(f"{name} {mode}: {int(b.sum())} mismatches on positive normal inputs")
    # the negative inputs and the other signs: NaN? (counted)
    x = bits_tensor(2**31 + (127 << 23), 2**23)
    y = on(x)
    res["negative_[1,2)_outputs_nan"] = int(torch.isnan(y).sum())
    summary[name + "_hypotheses"] = res


def tanh_structure(name, from_bits, on, summary, tables):
    """Odd symmetry, output mantissa bits ever set, input quantisation per exponent band."""
    import torch

    sym_bad = 0
    or_bits = torch.zeros(256, 23, dtype=torch.bool, device=DEV)
    eq_x = torch.zeros(256, dtype=torch.int64, device=DEV)
    drops = list(range(1, 24))
    bad_t = torch.zeros(len(drops), 256, dtype=torch.int64, device=DEV)
    bad_r = torch.zeros(len(drops), 256, dtype=torch.int64, device=DEV)
    for base in bases(2**31):
        x = bits_tensor(base, CHUNK)
        y = from_bits(base, CHUNK)
        yn = from_bits(base + 2**31, CHUNK)
        sym_bad += int((ulps(yn, -y) != 0).sum())
        bx = band(x)
        eq_x += torch.bincount(bx[y == x], minlength=256)[:256]
        yi = y.view(torch.int32)
        by = (yi >> 23) & 255
        for bit in range(23):
            hit = ((yi >> bit) & 1).bool()
            or_bits[:, bit] |= torch.bincount(by[hit], minlength=256)[:256] > 0
        xi = x.view(torch.int32).to(torch.int64)
        for j, d in enumerate(drops):
            mask = ~((1 << d) - 1)
            qt = (xi & mask)
            qr = ((xi + (1 << (d - 1))) & mask)
            for q, acc in ((qt, bad_t), (qr, bad_r)):
                q32 = torch.where(q >= 2**31, q - 2**32, q).to(torch.int32).view(torch.float32)
                yq = on(q32)
                mis = (ulps(y, yq) != 0) & torch.isfinite(x)
                acc[j] += torch.bincount(bx[mis], minlength=256)[:256]
    bt, br = bad_t.cpu().numpy(), bad_r.cpu().numpy()
    quant = {}
    for b in range(256):
        okt = [d for j, d in enumerate(drops) if bt[j, b] == 0]
        okr = [d for j, d in enumerate(drops) if br[j, b] == 0]
        quant[f"e{b - 127}"] = {"trunc_max_drop": max(okt, default=0),
                                "round_max_drop": max(okr, default=0),
                                "trunc_bad_by_drop": [int(v) for v in bt[:, b]][:16],
                                "round_bad_by_drop": [int(v) for v in br[:, b]][:16]}
    ob = or_bits.cpu().numpy()
    summary[name + "_structure"] = {
        "odd_symmetry_mismatches": sym_bad,
        "output_equals_input_by_band": {f"e{b - 127}": int(v) for b, v in
                                        enumerate(eq_x.cpu().numpy()) if v},
        "output_lowest_set_mantissa_bit_by_output_band": {
            f"e{b - 127}": int(np.argmax(ob[b])) for b in range(256) if ob[b].any()},
        "input_quantisation": {k: v for k, v in quant.items() if -40 <= int(k[1:]) <= 8}}
    log(f"{name}: odd symmetry mismatches {sym_bad}")
    # the quantised tables: per band with k kept mantissa bits, the outputs at the 2^k inputs
    for b in range(256):
        d = quant[f"e{b - 127}"]["trunc_max_drop"]
        if b - 127 < -40 or b - 127 > 8 or d < 10:
            continue
        x = bits_tensor(b << 23, 2**23)[::2**d].contiguous()
        tables[f"{name}_q_e{b - 127}_drop{d}_bits"] = on(x).view(torch.int32).cpu()
    # a raw dump for the offline analysis: ulps against the correctly rounded value
    x = bits_tensor(127 << 23, 2**23)
    tables[f"{name}_e0_minus_cr"] = small_int(ulps(on(x), reference(name, x)))


def cmd_explore(args) -> None:
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"torch": torch.__version__}
    if DEV == "cuda":
        summary.update(gpu=torch.cuda.get_device_name(),
                       capability=list(torch.cuda.get_device_capability()))
    tables = {}
    ks = kernels()
    for name in args.ops:
        from_bits, on = ks[name]
        t = time.perf_counter()
        try:
            hist_ulps(name, from_bits, summary)
            if name.startswith("ex2"):
                ex2_hypotheses(name, from_bits, on, summary, tables)
            elif name in ("lg2", "lg2_noftz", "rcp"):
                mantissa_hypotheses(name, from_bits, on, summary, tables)
            elif name == "tanh":
                tanh_structure(name, from_bits, on, summary, tables)
        except Exception as e:  # noqa: BLE001 - the other instructions still run
            summary[name + "_error"] = f"{type(e).__name__}: {e}"
            log(f"{name} failed: {e}")
        summary[name + "_seconds"] = time.perf_counter() - t
        (out / "approx_summary.json").write_text(json.dumps(summary, indent=1))
    # ftz against no-ftz: where do they differ?
    for a, b in (("ex2", "ex2_noftz"), ("lg2", "lg2_noftz")):
        if a in args.ops and b in args.ops:
            cnt = torch.zeros(512, dtype=torch.int64, device=DEV)
            for base in bases(2**32):
                x = bits_tensor(base, CHUNK)
                d = ulps(ks[a][0](base, CHUNK), ks[b][0](base, CHUNK)) != 0
                cnt += torch.bincount(band(x)[d], minlength=512)
            c = cnt.cpu().numpy()
            summary[f"{a}_vs_{b}_differ"] = {f"{'-' if k >= 256 else '+'}e{(k & 255) - 127}":
                                             int(c[k]) for k in range(512) if c[k]}
    (out / "approx_summary.json").write_text(json.dumps(summary, indent=1))
    arrays = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in tables.items()}
    for fam in ("ex2", "lg2", "tanh_rcp"):
        part = {k: v for k, v in arrays.items() if k.startswith(tuple(fam.split("_")))}
        # the no-ftz tables repeat the ftz ones on normal inputs (the summary counts where the
        # two instructions differ): only their mismatch samples are kept
        part = {k: v for k, v in part.items() if "noftz" not in k or k.endswith("samples")}
        path = out / f"approx_{fam}.npz"
        np.savez_compressed(path, **part)
        log(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


# ----------------------------------------------------------------------------- build, verify
def model():
    """osm_cli/precision/gpu_approx.py, loaded by path (it needs numpy alone, so the GPU
    machine needs no install of osm)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_approx", ROOT / "osm_cli" / "precision" / "gpu_approx.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measured_tables(ks) -> dict:
    """The instructions on the inputs the model's tables hold (gpu_approx.py's docstring)."""
    import torch

    ga = model()

    j = torch.arange(0, 2**23, dtype=torch.float64, device=DEV)
    out = {"ex2_pos": ks["ex2"][1]((j * 2.0**-23).float()),
           "ex2_neg": ks["ex2"][1]((-j * 2.0**-23).float()),
           "lg2": ks["lg2"][1]((1.0 + j * 2.0**-23).float()),
           "rcp": ks["rcp"][1]((1.0 + j * 2.0**-23).float())}
    for e, d in ga.tanh_drop().items():
        b = ((e + 127) << 23) | (torch.arange(0, 2 ** (23 - d), device=DEV, dtype=torch.int64)
                                 << d)
        out[f"tanh_{e}"] = ks["tanh"][1](b.to(torch.int32).view(torch.float32))
    return {k: v.cpu().numpy() for k, v in out.items()}


def cmd_build(args) -> None:
    """Measure the tables and write them in gpu_approx.py's format."""
    ga = model()
    ks = kernels()
    meas = measured_tables(ks)
    packed = {n: ga.pack(n, meas[n]) for n in ga.table_names()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **packed)
    ga.table.cache_clear()
    back = ga.tables(str(out))
    same = all(np.array_equal(back[n].view(np.int32), meas[n].view(np.int32))
               for n in ga.table_names())
    log(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB); round trip exact: {same}; "
        + ", ".join(f"{n} {v.size / 1e3:.0f} kB" for n, v in packed.items()))


DOMAINS = {  # op: (first input bits, count) — the domains verified
    "ex2": [(0, 2**32)],
    "lg2": [(0, 2**31)],
    "rcp": [(0, 2**32)],
    "tanh": [(0, 2**32)],
}


def verify_task(task):
    """One worker's share: the instruction on the GPU against the model on this CPU core;
    mismatch counts per input band."""
    op, base, n, path, dev = task
    global _KS, _GA, DEV
    DEV = dev
    if "_KS" not in globals():
        _KS, _GA = kernels(), model()
    ga = _GA
    hw = _KS[op][0](base, n).cpu().numpy().view(np.int32)
    xb = np.arange(base, base + n, dtype=np.int64)
    x = np.where(xb >= 2**31, xb - 2**32, xb).astype(np.int32).view(np.float32)
    y = getattr(ga, op)(x, path).view(np.int32)
    bad = (y != hw) & ~(np.isnan(x.view(np.float32)) & np.isnan(y.view(np.float32))
                        & np.isnan(hw.view(np.float32)))
    bad &= ~(np.isnan(y.view(np.float32)) & np.isnan(hw.view(np.float32)))
    bands = np.bincount(((xb[bad] >> 23) & 0x1FF), minlength=512)
    sample = [[int(a) & 0xFFFFFFFF, int(b) & 0xFFFFFFFF, int(c) & 0xFFFFFFFF] for a, b, c in
              zip(xb[bad][:4], hw[bad][:4], y[bad][:4], strict=True)]
    return op, bands, sample


def cmd_verify(args) -> None:
    import multiprocessing as mp

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    step = 1 << 24
    tasks = [(op, b0 + k, min(step, n - k), args.tables, DEV) for op in args.ops
             for b0, n in DOMAINS[op] for k in range(0, n, step)]
    if DEV == "cpu":
        step = CHUNK
        tasks = [(op, b, step, args.tables, DEV) for op in args.ops
                 for b in (0x3F000000, 0x3F800000, 0xBF800000)]
    res = {op: np.zeros(512, np.int64) for op in args.ops}
    samples = {op: [] for op in args.ops}
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for op, bands, sample in pool.imap_unordered(verify_task, tasks):
            res[op] += bands
            if len(samples[op]) < 16:
                samples[op] += sample
    summary = {}
    for op in args.ops:
        b = res[op]
        summary[op] = {"inputs": sum(n for _, n in DOMAINS[op]), "mismatches": int(b.sum()),
                       "bands": {f"{'-' if k >= 256 else '+'}e{(k & 255) - 127}": int(b[k])
                                 for k in range(512) if b[k]},
                       "samples_x_hw_model_hex": [[f"{v:08x}" for v in s]
                                                  for s in samples[op][:16]]}
        log(f"verify {op}: {int(b.sum())} mismatches over {summary[op]['inputs']} inputs; "
            + json.dumps(summary[op]["bands"])[:600])
    (out / "verify_summary.json").write_text(json.dumps(summary, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("explore")
    p.add_argument("out")
    p.add_argument("--ops", nargs="*", default=["ex2", "ex2_noftz", "lg2", "lg2_noftz", "rcp",
                                                  "tanh"])
    p = sub.add_parser("build")
    p.add_argument("out", help="the table file to write (.npz)")
    p = sub.add_parser("verify")
    p.add_argument("out")
    p.add_argument("--tables", help="table file (default: the package's)")
    p.add_argument("--ops", nargs="*", default=list(DOMAINS))
    p.add_argument("--workers", type=int, default=16)
    for p in sub.choices.values():
        p.add_argument("--dry", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dry:  # a run of the flow on a CPU over a few chunks of 2^dry inputs
        global DEV, CHUNK
        DEV, CHUNK = "cpu", 1 << args.dry
    {"explore": cmd_explore, "build": cmd_build, "verify": cmd_verify}[args.cmd](args)


if __name__ == "__main__":
    main()
