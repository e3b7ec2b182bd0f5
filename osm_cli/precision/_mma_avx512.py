"""_mma_numba.py's 16-bit path in AVX-512's own instructions, where the CPU has them (AVX-512F
and DQ: Intel since Skylake-SP, AMD since Zen 4): the same bits in fewer vector instructions.

- `mma(a, b, c, out)`: _mma_numba.mma's arithmetic and fallbacks (the float64 rows, the
  whole call in float64 where an operand has more than 11 significant bits).
- `available()`: whether numba compiles for a CPU with AVX-512F and DQ (the features numba
  targets: the host's, or NUMBA_CPU_FEATURES, NUMBA_ENABLE_AVX).

What differs from _mma_numba's `_element`, 16 output columns at a time as explicit 512-bit
vectors (LLVM IR written here; numba's loop vectorizer cannot use the two instructions):
- a chunk's largest magnitude by VRANGEPS (imm 11: the larger of |x| and |y|, sign cleared),
  one instruction a term where the portable kernel takes two (the magnitude, the maximum);
- the sum put into float32 toward zero by VCVTDQ2PS with its rounding mode set to toward zero
  ({rz-sae}), where the portable kernel rounds to nearest and steps back.
Both give the same values, so the same bits (tests/precision/test_mma.py compares the two
kernels and the float64 reference on every dtype, extremes, widths and scales). The rest is
_element's: products exact in float32, q = 2^(E − 25) from the largest term's exponent bits,
the 17 terms times 1/q truncated to int32 and added, the sum times q.

Measured (benchmarks/bench_mma.py section 1, S = Q·Kᵀ of bf16 tiles, one thread, a 2-core Xeon
with AVX-512): 0.106 ns a term against the portable kernel's 0.119, 1.13× (8-17 % over several
runs; vector instructions a 16-column chunk: 92 against 114, and the kernel is bound by them).

Leaves out: the panels, the range checks' fallbacks and the float64 rows (_mma_numba.py,
shared), which kernel a call takes (mma.tensor_core).

Example: mma(a, b, np.zeros((1, 2, 3), np.float32), out) fills out (1, 2, 3)
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ._mma_numba import HUGE, K16, MAG, PANEL, TAIL, TINY, padded, row64, setup

LANES = 16
F32X16 = ir.VectorType(ir.FloatType(), LANES)
I32X16 = ir.VectorType(ir.IntType(32), LANES)
I32 = ir.IntType(32)
RANGE = "llvm.x86.avx512.mask.range.ps.512"
TO_FLOAT = "llvm.x86.avx512.sitofp.round.v16f32.v16i32"
MAX_ABS = 11  # VRANGEPS imm8: the larger magnitude (bits 1:0 = 11), its sign cleared (3:2 = 10)
TOWARD_ZERO = 11  # _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC
CURRENT = 4  # _MM_FROUND_CUR_DIRECTION (VRANGEPS rounds nothing)


def available() -> bool:
    """Whether the CPU numba compiles for has AVX-512F and AVX-512DQ: the features numba itself
    targets (NUMBA_CPU_FEATURES where set, else the host's, less AVX where NUMBA_ENABLE_AVX is
    0), the last +name or -name of a feature deciding."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    from numba.core import codegen, config

    given = config.CPU_FEATURES
    features = codegen.get_host_cpu_features() if given is None else given
    on: dict[str, bool] = {}
    for item in features.split(","):
        item = item.strip()
        if item[:1] in "+-" and len(item) > 1:
            on[item[1:]] = item[0] == "+"
    return on.get("avx512f", False) and on.get("avx512dq", False)


def _declare(module, name: str, ret, args):
    """The LLVM intrinsic `name`, declared once in module."""
    got = module.globals.get(name)
    return got if got is not None else ir.Function(module, ir.FunctionType(ret, args), name)


def _splat(builder, x, ty):
    vec = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(ty, ir.Undefined),
                                  ir.Constant(I32X16, [0] * LANES))


def _lanes(value: int):
    return ir.Constant(I32X16, [value] * LANES)


@intrinsic
def _chunk(typingctx, ar, k0, pan, at, width, acc, n0, stats):
    """One chunk of 16 output columns n0:n0 + 16 of a row: ar[k0:k0 + 16] the row's values, the
    panel's 16 rows at pan[at + j·width] (16 columns each), acc[n0:n0 + 16] the accumulators
    (replaced by the chunk's results); stats[0:16] and stats[16:32] the lanes' largest and
    smallest nonzero largest-term bits so far (the row's range checks)."""
    sig = types.none(ar, k0, pan, at, width, acc, n0, stats)

    def codegen(context, builder, signature, args):
        arv, k0v, panv, atv, wv, accv, n0v, statv = args
        kinds = signature.args

        def data(i, value):
            return context.make_array(kinds[i])(context, builder, value).data

        mod = builder.module
        vrange = _declare(mod, RANGE, F32X16, [F32X16, F32X16, I32, F32X16, ir.IntType(16), I32])
        to_float = _declare(mod, TO_FLOAT, F32X16, [I32X16, I32])
        a_at = builder.gep(data(0, arv), [k0v])
        b_at = builder.gep(data(2, panv), [atv])
        c_at = builder.bitcast(builder.gep(data(5, accv), [n0v]), F32X16.as_pointer())
        s_at = builder.bitcast(data(7, statv), I32X16.as_pointer())

        def larger(x, y):  # max(|x|, |y|)
            return builder.call(vrange, [x, y, ir.Constant(I32, MAX_ABS),
                                         ir.Constant(F32X16, ir.Undefined),
                                         ir.Constant(ir.IntType(16), -1),
                                         ir.Constant(I32, CURRENT)])

        x = builder.load(c_at, align=4)
        products = []
        for j in range(K16):  # the row's value j times the panel's row j: exact
            aj = builder.load(builder.gep(a_at, [ir.Constant(I32, j)]))
            row = builder.gep(b_at, [builder.mul(wv, ir.Constant(wv.type, j))])
            bj = builder.load(builder.bitcast(row, F32X16.as_pointer()), align=4)
            products.append(builder.fmul(_splat(builder, aj, F32X16), bj))
        level = products
        while len(level) > 1:
            level = [larger(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        top = builder.bitcast(larger(level[0], x), I32X16)
        eb = builder.and_(top, _lanes(0x7F800000))  # 2^E (E the largest term's exponent)
        eb = builder.select(builder.icmp_unsigned(">", eb, _lanes(TINY)), eb, _lanes(TINY))
        inv_q = builder.bitcast(builder.sub(_lanes(279 << 23), eb), F32X16)  # 2^(25 − E)
        terms = [builder.fptosi(builder.fmul(t, inv_q), I32X16) for t in (*products, x)]
        while len(terms) > 1:  # exact in int32: any order
            pairs = [builder.add(terms[i], terms[i + 1]) for i in range(0, len(terms) - 1, 2)]
            terms = pairs + terms[len(pairs) * 2:]
        total = builder.call(to_float, [terms[0], ir.Constant(I32, TOWARD_ZERO)])
        q = builder.bitcast(builder.sub(eb, _lanes(25 << 23)), F32X16)
        builder.store(builder.fmul(total, q), c_at, align=4)
        hi_at, lo_at = s_at, builder.gep(s_at, [ir.Constant(I32, 1)])
        hi = builder.load(hi_at, align=4)
        builder.store(builder.select(builder.icmp_signed(">", top, hi), top, hi), hi_at, align=4)
        lo = builder.load(lo_at, align=4)
        nonzero = builder.select(builder.icmp_signed("==", top, _lanes(0)), _lanes(MAG), top)
        builder.store(builder.select(builder.icmp_signed("<", nonzero, lo), nonzero, lo), lo_at,
                      align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(boundscheck=False, nogil=True, cache=True)
def _row16(ar, bp, acc, k, wide, wpad):
    """_mma_numba._row16's row (acc, wpad long, becomes the row's result) by _chunk; returns
    whether some element left the 16-bit path's range."""
    stats = np.empty(2 * LANES, np.int32)
    stats[:LANES] = 0
    stats[LANES:] = MAG
    for kc in range(k // K16):
        k0 = kc * K16
        base = k0 * wpad
        for p in range(wide // PANEL):
            n0 = p * PANEL
            for i in range(0, PANEL, LANES):
                _chunk(ar, k0, bp, base + n0 * K16 + i, PANEL, acc, n0 + i, stats)
        for p in range((wpad - wide) // TAIL):
            n0 = wide + p * TAIL
            _chunk(ar, k0, bp, base + n0 * K16, TAIL, acc, n0, stats)
    return stats[:LANES].max() >= HUGE or stats[LANES:].min() < TINY


@njit(boundscheck=False, nogil=True, cache=True)
def _run(a, b, c, out):
    # _mma_numba._run's loop with this module's rows: a loop of its own, because numba caches
    # no function that takes another as an argument, and a CPU without AVX-512 must never
    # compile _chunk (so no branch in _mma_numba may name it)
    g_, m_, k = a.shape
    width = b.shape[2]
    a2, c2, o2 = a.reshape(g_ * m_, k), c.reshape(g_ * m_, width), out.reshape(g_ * m_, width)
    fast, bp, wide, wpad = setup(a, b, c)
    row = np.zeros(wpad, np.float32)
    for gm in range(g_ * m_):
        row[:width] = c2[gm]
        if not fast or _row16(a2[gm], bp[gm // m_], row, k, wide, wpad):
            row64(a, b, c, out, gm)
        else:
            o2[gm] = row[:width]


def mma(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b + c as the tensor cores accumulate (_mma_numba.mma's bits)."""
    _run(*padded(a, b), c, out)


__all__ = ["available", "mma"]
