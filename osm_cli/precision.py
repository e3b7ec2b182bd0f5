"""Number formats: the dtypes osm knows, their limits, a real kernel's rounding, and a verdict.

float16 and float64 come from numpy; bfloat16 and the float8 formats from ml_dtypes. Every
threshold is computed from finfo at run time (NUMERICS §6 is the check, not the source).

The precision models (NUMERICS §5) run the same tiled attention as attention.py with rounding
put where a kernel rounds:
- "flash": Q, K, V rounded to the dtype; S, m, l, α and O in float32 (or float64 accumulation);
  P = exp(S − m) in float32, l summed from it unrounded, P rounded to the dtype before P·V; the
  final O / l rounded to the dtype; LSE kept in float32.
- "naive": plain attention in the dtype, each op's result rounded to it as PyTorch does for
  16-bit tensors (float32 inside the matmul and the softmax): Q·scale, S, softmax(S), P·V.
`prepare` and `run` turn attention's --dtype, --precision and --accum into a model and its run.
The verdict is FlashAttention's own test rule (NUMERICS §5). Rounding is round-to-nearest-even
by numpy/ml_dtypes `astype`; values are carried in float32 (float64 for float64) holding exactly
the dtype's numbers, because numpy's matmul has no 16- or 8-bit path.
Leaves out: the algorithm itself (online.py, attention.py), printing (render.py), JSON
(documents.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from .attention import (
    Attention,
    as_bhnd,
    attention,
    check_finite,
    check_traced,
    default_blocks,
    default_scale,
    mask_about,
    masked_as,
    reference,
    row_of,
    split_runs,
)
from .errors import OsmError
from .online import Trace, online_softmax
from .reference import naive_softmax, stable_softmax

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
ALIASES = {
    "fp64": "float64", "double": "float64", "f64": "float64",
    "fp32": "float32", "single": "float32", "f32": "float32",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
}


def resolve_dtype(name: str) -> tuple[str, np.dtype]:
    """(canonical name, dtype) for a dtype name or alias. Example: resolve_dtype("bf16")."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        known = ", ".join([*DTYPES, *ALIASES])
        raise OsmError(f"unknown dtype {name!r}; known: {known}")
    return key, DTYPES[key]


def finfo(dtype: np.dtype):
    """finfo for numpy's and ml_dtypes' floating types alike."""
    return ml_dtypes.finfo(dtype)


@dataclass(frozen=True)
class Limits:
    """Where exp leaves a dtype's range: overflow to inf above, underflow to 0 below."""

    max_finite: float
    overflow_at: float
    underflow_at: float


def limits(dtype: np.dtype) -> Limits:
    """exp(x) overflows for x > ln(max finite) and rounds to 0 below ln(smallest subnormal / 2).

    Half the smallest subnormal is the tie that round-to-nearest-even sends to 0.
    Example: limits(np.dtype(np.float16)) -> Limits(65504.0, 11.09, -17.33)
    """
    fi = finfo(dtype)
    tiny = float(fi.smallest_subnormal)
    return Limits(float(fi.max), math.log(float(fi.max)), math.log(tiny) - math.log(2.0))


# ---------------------------------------------------------------------------------------------
# overflow-demo

DEMO_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class DemoRow:
    dtype: str
    max_finite: float
    overflow_at: float
    underflow_at: float
    exp: np.ndarray
    naive: np.ndarray
    stable: np.ndarray
    online: np.ndarray
    held: np.ndarray | None = None  # the values as the dtype holds them (float64)
    fits: bool = True  # False when a finite value is beyond the dtype's range (held as inf/nan)


@dataclass(frozen=True)
class Demo:
    values: np.ndarray
    rows: tuple[DemoRow, ...]
    overflow_note: str
    masked: tuple[tuple[str, np.ndarray, str], ...]
    masked_note: str


def overflow_demo(values=(100.0, 102.0, 99.0), dtypes=DEMO_DTYPES) -> Demo:
    """Each method of softmax computed in each dtype, and the fully masked row."""
    xs = np.asarray(values, dtype=np.float64)
    rows = []
    for name in dtypes:
        dt = DTYPES[name]
        lim = limits(dt)
        fits = bool((np.abs(xs[np.isfinite(xs)]) <= lim.max_finite).all())
        # A value beyond the dtype's range is held as inf (nan in e4m3fn): no method can work
        # with it, and the numbers below show that rather than warn about it.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            x = xs.astype(dt)
            e = np.exp(x)
            block = max(1, (len(xs) + 1) // 2)
            if not fits:
                online = np.full(len(xs), np.nan)
            else:
                # Online softmax held in the dtype itself, except in float8_e4m3fn: it cannot
                # hold m = -inf, so its kernels keep m and l in float32 (precision flash).
                m = model(name, "naive" if has_inf(dt) else "flash")
                online = trace_in(xs, m, block).probabilities
            naive, stable = naive_softmax(x), stable_softmax(x)
        rows.append(
            DemoRow(
                name, lim.max_finite, lim.overflow_at, lim.underflow_at,
                e.astype(np.float64), naive.astype(np.float64), stable.astype(np.float64),
                online.astype(np.float64), x.astype(np.float64), fits,
            )
        )
    return Demo(xs, tuple(rows), _demo_note(xs, rows), *_masked_row())


def _demo_note(xs: np.ndarray, rows: list[DemoRow]) -> str:
    """A few plain sentences on what happened in each dtype."""
    usable = [r for r in rows if r.fits]
    overflow = [r for r in usable if not np.isfinite(r.exp).all()]  # inf, or nan in e4m3fn
    underflow = [r for r in usable if r not in overflow and not np.isfinite(r.naive).all()]
    fine = [r for r in usable if np.isfinite(r.naive).all()]
    top = float(xs.max())
    note = []
    if overflow:
        where = ", ".join(
            f"{r.dtype} above {r.overflow_at:.2f}"
            + ("" if has_inf(DTYPES[r.dtype]) else " (to nan: it has no inf)") for r in overflow)
        note.append(
            f"Naive softmax computes exp(x) first, and exp overflows to inf for x in {where}: "
            f"exp({top:g}) does not fit, so the sum is inf and inf / inf = nan."
        )
    if underflow:
        names = ", ".join(r.dtype for r in underflow)
        note.append(
            f"In {names} every exp(x) is 0 (the values are -inf or below the underflow "
            "threshold), so naive softmax is 0 / 0 = nan."
        )
    if fine:
        where = ", ".join(f"{r.dtype} (fails above {r.overflow_at:.2f})" for r in fine)
        note.append(f"Naive softmax still works in {where}.")
    if all(np.isneginf(xs)):
        note.append(
            "Every value is masked (-inf): stabilized and online softmax give 0 for every "
            "entry, not nan (see the fully masked row below)."
        )
    else:
        note.append(
            "Stabilized and online softmax subtract the max first, so every exponent is ≤ 0 and "
            + ("every dtype gives a finite answer." if len(usable) == len(rows)
               else "every dtype that can hold the values gives a finite answer.")
        )
    for r in rows:
        if not r.fits:
            note.append(
                f"The values do not fit {r.dtype} (largest finite {r.max_finite:.4g}): it holds "
                "them as inf or nan before any softmax starts, so it is left out of the softmax "
                "table."
            )
    return " ".join(note)


def _masked_row():
    neg = np.full(3, -np.inf, dtype=np.float32)
    masked = (
        ("naive", naive_softmax(neg), "exp(-inf) = 0 for all: 0 / 0 = nan"),
        ("stabilized (textbook)", stable_softmax(neg, guard=False),
         "max = -inf, and (-inf) - (-inf) = nan"),
        ("online (osm)", online_softmax(neg, block=2).probabilities,
         "m stays -inf, l = 0: subtract 0 instead of -inf, output 0"),
    )
    masked_note = (
        "osm gives 0, not NaN, for a row with every score masked, as FlashAttention kernels do "
        "(seed 000 §1.1 warns of this case). Its LSE is -inf by default."
    )
    return masked, masked_note


# ---------------------------------------------------------------------------------------------
# Rounding to a dtype

PRECISIONS = ("flash", "naive")
ACCUMS = ("float32", "float64")


def bits(dtype) -> int:
    """Storage bits of a dtype. Example: bits(DTYPES["bfloat16"]) -> 16."""
    return int(finfo(dtype).bits)


def carrier(dtype) -> np.dtype:
    """The numpy dtype that carries a dtype's values exactly: float64 for float64, else float32."""
    return np.dtype(np.float64) if bits(dtype) > 32 else np.dtype(np.float32)


def has_inf(dtype) -> bool:
    """False for float8_e4m3fn, whose overflow (and -inf) becomes nan."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isinf(np.array(np.inf).astype(dtype).astype(np.float64)))


def round_to(x, dtype, like=None) -> np.ndarray:
    """x rounded to `dtype` (round to nearest even, numpy/ml_dtypes astype), carried in `like`.

    `like` defaults to carrier(dtype). Overflow gives ±inf (nan in float8_e4m3fn); magnitudes
    below half the smallest subnormal give 0. A float64 input goes to bfloat16 and float8 through
    float32, as ml_dtypes (and PyTorch) convert.

    Example: round_to(np.array([1 / 3]), DTYPES["bfloat16"]) -> [0.333984375]
    """
    dt = np.dtype(dtype)
    like = carrier(dt) if like is None else np.dtype(like)
    x = np.asarray(x)
    if x.dtype == dt == like:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dt).astype(like)


def ulp(x, dtype) -> np.ndarray:
    """The spacing of `dtype` at |x|: 2^(e − mantissa bits), subnormal spacing below the normals.

    Example: ulp(1.0, DTYPES["float16"]) -> 2^-10; ulp(300.0, DTYPES["bfloat16"]) -> 2.0
    """
    fi = finfo(dtype)
    a = np.maximum(np.abs(np.asarray(x, dtype=np.float64)), float(fi.smallest_normal))
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.floor(np.log2(np.where(np.isfinite(a), a, float(fi.max))))
    return np.ldexp(1.0, (e - int(fi.nmant)).astype(int))


@dataclass(frozen=True)
class Rounding:
    """What rounding one array to a dtype did: how many values moved, overflowed, underflowed."""

    name: str
    size: int
    changed: int
    overflowed: int  # finite values that became ±inf (nan in a dtype without inf)
    underflowed: int  # non-zero values that became 0
    max_abs_change: float  # over the values that stayed finite


def rounding(name: str, x: np.ndarray, r: np.ndarray) -> Rounding:
    """Compare x with its rounded copy r. -inf in x (a mask) counts as unchanged."""
    # In float32 unless x needs float64: the comparisons are exact either way, and cheaper.
    wide = np.float64 if np.float64 in (np.asarray(x).dtype, np.asarray(r).dtype) else np.float32
    x64, r64 = np.asarray(x, dtype=wide), np.asarray(r, dtype=wide)
    finite = np.isfinite(x64)
    over = finite & ~np.isfinite(r64)
    under = finite & (x64 != 0) & (r64 == 0)
    moved = finite & np.isfinite(r64) & (x64 != r64)
    with np.errstate(invalid="ignore"):
        change = np.abs(np.where(moved, r64 - x64, 0.0))
    return Rounding(name, int(x64.size), int(np.count_nonzero(moved | over)),
                    int(np.count_nonzero(over)), int(np.count_nonzero(under)),
                    float(change.max(initial=0.0)))


def round_inputs(arrays: dict, dtype) -> tuple[tuple, tuple[Rounding, ...]]:
    """Attention inputs rounded to dtype, carried in float32 (float64 for float64).

    Raises OsmError for non-finite inputs and for values the dtype cannot hold (overflow).
    Example: (q, k, v), notes = round_inputs({"Q": q, "K": k, "V": v}, DTYPES["bfloat16"])
    """
    name_of = dtype_name(dtype)
    lim = float(finfo(dtype).max)
    rounded, notes = [], []
    for name, x in arrays.items():
        x = np.asarray(x)
        check_finite(x if x.dtype.kind == "f" else x.astype(np.float32), name, bhnd=False)
        r = round_to(x, dtype)
        note = rounding(name, x, r)
        if note.overflowed:
            over = np.abs(np.asarray(x, dtype=np.float64)) > lim
            at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(over)[0]), x.shape))
            raise OsmError(
                f"{name}: {note.overflowed} value(s) overflow {name_of} (largest finite "
                f"{lim:g}), the first {float(np.asarray(x)[at]):g} at index {at}; scale the "
                "inputs or pick a wider --dtype"
            )
        rounded.append(r)
        notes.append(note)
    return tuple(rounded), tuple(notes)


def dtype_name(dtype) -> str:
    """The canonical name of a dtype osm knows (else numpy's name)."""
    dt = np.dtype(dtype)
    return next((n for n, d in DTYPES.items() if d == dt), dt.name)


# ---------------------------------------------------------------------------------------------
# The precision models of attention


@dataclass(frozen=True)
class Model:
    """Which dtype, which precision model, which accumulation (the state's dtype)."""

    name: str
    dtype: np.dtype
    precision: str
    accum: np.dtype

    @property
    def p_round(self):
        """P rounded to the dtype before P·V, or None where the dtype is as wide as the state."""
        return None if bits(self.dtype) >= bits(self.accum) else self.round_p

    def round_p(self, p: np.ndarray) -> np.ndarray:
        # Kernels convert the float32 P tile to the input dtype for the tensor-core P·V.
        return p.astype(self.dtype).astype(p.dtype)

    def describe(self) -> str:
        if self.precision == "naive":
            return (f"naive: plain attention in {self.name}, each op rounded to {self.name} "
                    "(Q·scale, S, softmax, P·V)")
        if self.p_round is None:
            return f"flash: inputs in {self.name}, state and arithmetic in {self.accum.name}"
        return (f"flash: Q, K, V in {self.name}; S, m, l, α, O in {self.accum.name}; "
                f"P rounded to {self.name} before P·V; O / l rounded to {self.name}; "
                f"LSE in {self.accum.name}")


def model(dtype: str = "float32", precision: str | None = None, accum: str | None = None) -> Model:
    """A Model from names. precision defaults to flash; accum to float32 (float64 for float64).

    Example: model("bf16").describe()
    """
    name, dt = resolve_dtype(dtype)
    precision = precision or "flash"
    if precision not in PRECISIONS:
        raise OsmError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if accum is None:
        acc = carrier(dt)
    else:
        acc_name, acc = resolve_dtype(accum)
        if acc_name not in ACCUMS:
            raise OsmError(f"accumulation must be float32 or float64, not {accum!r}")
    return Model(name, dt, precision, acc)


SMS = 132  # streaming multiprocessors of an H100 / H200 SXM (an A100 has 108)
SCHEDULES = ("fa2", "tiles")


def _num_splits(work: int, slots: int, n_blocks: int, most: int = 128) -> int:
    """FlashAttention-2's split-KV heuristic (flash_api.cpp num_splits_heuristic)."""
    if work >= 0.8 * slots:
        return 1
    most = min(most, slots, n_blocks)

    def eligible(n: int) -> bool:  # n splits that do not just repeat n - 1's blocks per split
        return n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1))

    eff = {}
    for n in range(1, most + 1):
        if eligible(n):
            waves = work * n / slots
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    return next((n for n, e in eff.items() if e >= 0.85 * best), 1)


def fa2_plan(b: int, h: int, t: int, s: int, d: int, sms: int = SMS) -> tuple[int, int, int]:
    """(block_q, block_k, splits) of FlashAttention-2's forward for these sizes.

    Few (batch · head · 64-row) blocks for the GPU's 2·sms slots: the split-KV kernel, with
    64-row tiles, block_k 256 (d ≤ 64), 128 (d ≤ 128) or 64, and `splits` key ranges merged in
    float32. Otherwise the standard kernel: 128-row tiles, block_k 128 (d ≤ 64) else 64.
    Example: fa2_plan(1, 8, 1024, 1024, 64) -> (64, 256, 2)
    """
    block_n = 256 if d <= 64 else 128 if d <= 128 else 64
    splits = _num_splits(b * h * -(-t // 64), 2 * sms, -(-s // block_n))
    if splits <= 1:
        return (*default_blocks(d), 1)
    return 64, block_n, splits


def run_flash(m: Model, q, k, v, *, schedule: str = "tiles", sms: int = SMS,
              **kwargs) -> Attention:
    """The flash model: attention.attention on dtype-valued inputs with P rounded, O / l rounded.

    q, k, v should already hold the dtype's values (round_inputs); kwargs are attention's.
    schedule "tiles" runs attention's own tiles (block_q, block_k, order as given); "fa2" follows
    FlashAttention-2's kernel: its tile sizes, K/V tiles visited last to first, and the split-KV
    kernel (key ranges run separately, O / l and LSE merged in float32) where its heuristic picks
    it for a GPU of `sms` multiprocessors. Where P is rounded relative to a running max, the
    schedule decides which max, so "fa2" matches that kernel element by element more often.
    """
    if schedule not in SCHEDULES:
        raise OsmError(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    if schedule == "tiles":
        return finish(m, attention(q, k, v, accum=m.accum, p_round=m.p_round, **kwargs))
    layout = kwargs.get("layout", "bhnd")
    b, h, t, d = as_bhnd(np.asarray(q), layout, "Q").shape
    s = as_bhnd(np.asarray(k), layout, "K").shape[2]
    bq, bk, splits = fa2_plan(b, h, t, s, d, sms)
    n_blocks = -(-s // bk)
    per = max(1, -(-n_blocks // splits))
    # no keys at all: one empty range, whose rows are fully masked (O = 0, LSE -inf)
    ranges = [(first * bk, min(s, (first + per) * bk)) for first in range(0, n_blocks, per)]
    ranges = ranges or [(0, 0)]
    parts = split_runs(q, k, v, ranges, reverse=True, accum=m.accum, p_round=m.p_round,
                       block_q=bq, block_k=bk, **kwargs)
    res = parts[0] if len(parts) == 1 else _merge_parts(parts, m.accum)
    masked = kwargs.get("masked_lse", "neg-inf")
    if masked != "neg-inf":
        res = replace(res, lse=masked_as(res.lse, masked))
    return finish(m, res)


def _merge_parts(parts: list, accum: np.dtype) -> Attention:
    """FA2's split-KV combine (merge.merge_detail in `accum`): LSE = logsumexp over splits,
    O = Σ exp(LSE_s − LSE)·O_s, with the parts' tile counts added up."""
    from .merge import merge_detail

    merged = merge_detail([p.out for p in parts], [p.lse for p in parts], dtype=accum)
    lse = merged.lse
    head = parts[0]
    return replace(head, out=merged.out.astype(accum), lse=lse, tiles_computed=sum(
        p.tiles_computed for p in parts), tiles_skipped=sum(p.tiles_skipped for p in parts),
        rescales=sum(p.rescales for p in parts), masked_rows=int(np.isneginf(lse).sum()),
        trace=(), trace_out=None)


def finish(m: Model, res: Attention) -> Attention:
    """The final O / l rounded to the dtype (LSE stays in the state's dtype)."""
    if bits(m.dtype) >= bits(res.out.dtype):
        return res
    trace_out = None if res.trace_out is None else round_to(res.trace_out, m.dtype,
                                                            res.trace_out.dtype)
    return replace(res, out=round_to(res.out, m.dtype, res.out.dtype), trace_out=trace_out)


def plain(q, k, v, dtype, **mask_kw) -> tuple[np.ndarray, np.ndarray]:
    """Plain attention in `dtype`, FlashAttention's test `pt` (upcast=False): (out, lse).

    Each op's result is rounded to the dtype, with float32 inside the op, as PyTorch computes
    16-bit tensors: Q·scale, S = (Q·scale)·Kᵀ, a float mask added, softmax(S), P·V. LSE is the
    logsumexp of the rounded S, in float32. This is attention.reference with each op rounded
    (mask_kw are its causal, scale, layout, causal_align, window and mask); outputs are shaped
    like attention's and carried in float32 (float64 for float64).
    """
    dt = np.dtype(dtype)
    c = carrier(dt)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return reference(q, k, v, **mask_kw, rnd=lambda x: round_to(x, dt, c), carry=c)


# ---------------------------------------------------------------------------------------------
# The verdict: FlashAttention's test rule (NUMERICS §5)


F64_TOLERANCE = 1e-12  # float64 runs: max|out − ref| ≤ this · max(1, max|ref|)


@dataclass(frozen=True)
class Rule:
    """err ≤ 2·pt_err + 2·rounding, FlashAttention's rule for one quantity (O or LSE)."""

    err: float  # max |out − ref|
    pt_err: float  # max |pt − ref|, plain same-dtype attention
    rounding: float  # max |(ref + 0.3 − 0.3) − ref|, the 0.3 arithmetic in the dtype
    bound: float
    passed: bool
    note: str = ""


def _max_abs(d: np.ndarray) -> float:
    # NaN propagates (a NaN anywhere fails the rule); empty arrays have no error.
    return float(np.max(np.abs(d))) if d.size else 0.0


def _rule(err: float, pt_err: float, rounding_err: float) -> Rule:
    if not math.isfinite(pt_err):
        return Rule(err, pt_err, rounding_err, math.inf, math.isfinite(err),
                    "plain same-dtype attention overflowed, so the rule bounds nothing")
    bound = 2 * pt_err + 2 * rounding_err
    return Rule(err, pt_err, rounding_err, bound, bool(err <= bound))


def fa_rule(out, ref, pt, dtype) -> Rule:
    """FlashAttention's test: ref = the upcast reference cast back to the dtype, pt = plain.

    Pass when max|out − ref| ≤ 2·max|pt − ref| + 2·max|(ref + 0.3 − 0.3) − ref|, the last done in
    the dtype. osm's upcast reference is float64 (FlashAttention's tests use float32); cast to a
    16- or 8-bit dtype the two agree except at rounding ties.

    Example: fa_rule(out, ref64, pt, DTYPES["float16"]).passed
    """
    dt = np.dtype(dtype)
    return _fa_rule(out, round_to(ref, dt, np.float64), pt, dt)


def _fa_rule(out, ref_d, pt, dt: np.dtype) -> Rule:
    """fa_rule with ref already rounded to the dtype (ref_d, float64), for callers that keep it."""
    err = _max_abs(np.asarray(out, dtype=np.float64) - ref_d)
    pt_err = _max_abs(np.asarray(pt, dtype=np.float64) - ref_d)
    r = ref_d.astype(dt)
    third = np.array(0.3).astype(dt)
    with np.errstate(over="ignore", invalid="ignore"):
        moved = ((r + third) - third).astype(np.float64)
    rounding_err = _max_abs(moved - ref_d)
    if bits(dt) > 32:
        # In float64 plain attention is the reference itself (pt_err = 0): no narrower baseline.
        bound = F64_TOLERANCE * max(1.0, _max_abs(ref_d))
        return Rule(err, pt_err, rounding_err, bound, bool(err <= bound),
                    f"float64: the reference's own precision; bound {F64_TOLERANCE:g}·max|ref|")
    return _rule(err, pt_err, rounding_err)


def lse_errors(lse, ref_lse) -> np.ndarray:
    """|lse − ref| per row; on fully masked rows (ref −inf) any convention (−inf, +inf, 0) is 0."""
    x = np.asarray(lse, dtype=np.float64)
    ref = np.asarray(ref_lse, dtype=np.float64)
    masked = np.isneginf(ref)
    ok_masked = np.isinf(x) | (x == 0)
    with np.errstate(invalid="ignore"):
        d = np.abs(x - np.where(masked, 0.0, ref))
    return np.where(masked, np.where(ok_masked, 0.0, np.inf), np.where(np.isnan(x), np.nan, d))


def lse_rule(lse, ref_lse, pt_lse) -> Rule:
    """The same rule for the LSE (osm's extension): pt's LSE is the logsumexp of the dtype-rounded
    scores, and the 0.3 arithmetic is done in float32, the LSE's own dtype."""
    return _lse_rule(lse_errors(lse, ref_lse), lse_errors(pt_lse, ref_lse), ref_lse)


def _lse_rule(errs: np.ndarray, pt_errs: np.ndarray, ref_lse) -> Rule:
    """lse_rule from the per-row lse_errors of the run (errs) and of plain attention (pt_errs)."""
    ref = np.asarray(ref_lse, dtype=np.float64)
    finite = ref[np.isfinite(ref)].astype(np.float32)
    third = np.float32(0.3)
    moved = ((finite + third) - third).astype(np.float64)
    return _rule(_max_abs(errs), _max_abs(pt_errs), _max_abs(moved - finite))


@dataclass(frozen=True)
class Verdict:
    """A run (or an external kernel) judged against the float64 reference and the FA rule."""

    dtype: str
    err: float  # max |out − ref64|
    plain_err: float  # max |pt − ref64|
    lse_err: float | None  # max |lse − ref64 LSE|
    plain_lse_err: float
    rule: Rule
    lse: Rule | None

    @property
    def passed(self) -> bool:
        return self.rule.passed and (self.lse is None or self.lse.passed)


def judge(out, ref, pt, dtype, *, lse=None, ref_lse=None, pt_lse=None) -> Verdict:
    """Errors against the float64 reference (ref, ref_lse) and the FA rule with plain `pt`."""
    ref64 = np.asarray(ref, dtype=np.float64)
    lse_err = None if lse is None else lse_errors(lse, ref_lse)
    return _judged(out, ref64, round_to(ref64, dtype, np.float64), pt, dtype, lse_err, ref_lse,
                   pt_lse)


def _judged(out, ref64, ref_d, pt, dtype, lse_err, ref_lse, pt_lse) -> Verdict:
    """judge, given ref64 rounded to the dtype (ref_d) and the run's per-row lse_errors (None
    without an LSE), which check() goes on to use row by row."""
    err = _max_abs(np.asarray(out, dtype=np.float64) - ref64)
    plain_err = _max_abs(np.asarray(pt, dtype=np.float64) - ref64)
    pt_lse_err = None if lse_err is None and pt_lse is None else lse_errors(pt_lse, ref_lse)
    lrule = None if lse_err is None else _lse_rule(lse_err, pt_lse_err, ref_lse)
    return Verdict(
        dtype_name(dtype), err, plain_err, None if lrule is None else lrule.err,
        _max_abs(pt_lse_err) if pt_lse is not None else math.nan,
        _fa_rule(out, ref_d, pt, np.dtype(dtype)), lrule,
    )


# ---------------------------------------------------------------------------------------------
# A score vector traced in a dtype (osm trace --dtype)


@dataclass(frozen=True)
class LowTrace:
    """online softmax of dtype-rounded scores, beside a float64 run on the unrounded scores.

    precision flash holds m, α, l in float32 (as kernels do) and rounds the final p to the dtype;
    naive holds every value (m, α, l, p) in the dtype itself. All arrays are float64 holding the
    dtype's values; rows are the rows of the input (a vector is one row).
    """

    model: Model
    scores: np.ndarray  # as the dtype holds them; -inf (a mask) stays -inf
    rounding: Rounding
    trace: Trace
    probabilities: np.ndarray  # p as the dtype holds it
    naive: np.ndarray  # naive softmax computed in the dtype
    exact: np.ndarray  # float64 stabilized softmax of the unrounded scores
    max_diff: np.ndarray  # per row max |p − exact|
    ulps: np.ndarray  # per element |p − exact| in ulps of the dtype at exact
    p_underflowed: int  # p = 0 in the dtype where the float64 p > 0
    alpha_underflowed: tuple[int, ...] = ()  # blocks whose α rounded to 0 from a finite m


def trace_in(scores, m: Model, block: int = 2, form: str = "rescale", row: int = 0) -> LowTrace:
    """Round the scores to m's dtype and run online softmax the way m's precision holds values.

    Example: trace_in(np.array([2., 4., 1., 3.]), model("bf16", "naive")).trace.steps[0].l
    -> 1.1328125 (e^-2 + 1 in bfloat16)
    """
    s64 = np.asarray(scores, dtype=np.float64)
    held = np.where(np.isneginf(s64), -np.inf, round_to(s64, m.dtype, np.float64))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if m.precision == "naive":
            if not has_inf(m.dtype):
                raise OsmError(f"{m.name} has no -inf, so a running max cannot start at "
                               "m = -inf in it; use --precision flash (m, l in float32)")
            tr = online_softmax(held.astype(m.dtype), block, form, row=row)
            p = np.asarray(tr.probabilities).astype(m.dtype).astype(np.float64)
        else:
            tr = online_softmax(held.astype(m.accum), block, form, row=row)
            p = round_to(tr.probabilities, m.dtype, np.float64)
        naive = naive_softmax(held.astype(m.dtype)).astype(np.float64)
    # The dtype's values as float64, so that records print and serialise like any other.
    tr = replace(tr, m=np.asarray(tr.m, dtype=np.float64), l=np.asarray(tr.l, dtype=np.float64),
                 lse=np.asarray(tr.lse, dtype=np.float64), probabilities=p)
    exact = stable_softmax(s64)
    diff = np.abs(p - exact)
    with np.errstate(invalid="ignore"):
        ulps = diff / ulp(exact, m.dtype)
    max_diff = np.atleast_2d(diff).max(axis=-1)
    gone = tuple(st.block for st in tr.steps
                 if st.scale == 0 and math.isfinite(st.m_prev) and math.isfinite(st.m))
    return LowTrace(m, held, rounding("scores", s64, held), tr, p, naive, exact, max_diff, ulps,
                    int(np.count_nonzero((p == 0) & (exact > 0))), gone)


# ---------------------------------------------------------------------------------------------
# Running a model and judging it (osm attention --dtype), and judging a kernel (osm check)


def prepare(dtype: str | None, precision: str | None, accum: str | None, q, k,
            v) -> tuple[Model | None, tuple, tuple[Rounding, ...]]:
    """attention's --dtype, --precision and --accum: (model, (q, k, v) rounded to its dtype,
    rounding notes), or (None, (q, k, v), ()) without a dtype.

    Example: m, (q, k, v), notes = prepare("bf16", None, None, q, k, v)
    """
    if dtype is None:
        if precision is not None or accum is not None:
            raise OsmError("--precision and --accum need --dtype")
        return None, (q, k, v), ()
    m = model(dtype, precision, accum)
    rounded, notes = round_inputs({"Q": q, "K": k, "V": v}, m.dtype)
    return m, rounded, notes


def run_kwargs(m: Model | None, splits: int | None = None, order=None,
               threshold: float = 0.0) -> dict:
    """attention's keywords for m's tiled run: the state's dtype and P's rounding ({} for none).

    precision naive has no tiles, so it refuses splits, a tile order (a permutation; None is
    forward) and a rescale threshold rather than ignore them.
    """
    if m is None:
        return {}
    if m.precision == "naive":
        for flag, given in (("--splits", splits is not None), ("--order", order is not None),
                            ("--rescale-threshold", bool(threshold))):
            if given:
                raise OsmError(f"{flag} needs the tiled run; --precision naive is one-shot "
                               "attention")
        return {}
    return {"accum": m.accum, "p_round": m.p_round}


def run(m: Model | None, q, k, v, **kwargs) -> Attention:
    """attention.attention (m None), or m's run of it: flash rounds the final O / l to the dtype;
    naive is plain attention in the dtype, one shot. kwargs are attention's (with run_kwargs(m))."""
    if m is None:
        return attention(q, k, v, **kwargs)
    if m.precision == "naive":
        return run_naive(m, q, k, v, **kwargs)
    return finish(m, attention(q, k, v, **kwargs))


def run_naive(m: Model, q, k, v, *, trace_at=(0, 0, 0), masked_lse="neg-inf",
              **kwargs) -> Attention:
    """precision naive as an Attention record: plain attention in the dtype, one shot (no tiles)."""
    run_kwargs(m, order=kwargs.get("order"), threshold=kwargs.get("threshold", 0.0))
    mask_kw = {key: kwargs[key] for key in ("causal", "scale", "layout", "causal_align", "window",
                                            "mask") if key in kwargs}
    check_traced(trace_at, as_bhnd(np.asarray(q), mask_kw.get("layout", "bhnd"), "Q").shape[:3])
    out, lse = plain(q, k, v, m.dtype, **mask_kw)
    scale = mask_kw.get("scale")
    scale = default_scale(np.shape(q)[-1]) if scale is None else scale
    empty = np.isneginf(lse)
    lse = masked_as(lse, masked_lse)
    trace_out = None
    if trace_at is not None:
        trace_out = row_of(out, trace_at, mask_kw.get("layout", "bhnd")).copy()
    return Attention(
        out, lse, float(scale), tuple(np.shape(q)), tuple(np.shape(k)), tuple(np.shape(v)), 0, 0,
        bool(mask_kw.get("causal", False)), mask_kw.get("causal_align", "bottom-right"),
        mask_kw.get("window"), masked_lse, 0, 0, 0, int(np.count_nonzero(empty)), (),
        trace_at or (0, 0, 0), trace_out,
        {"tiles_total": 0, "one_shot": True, "mask": mask_about(mask_kw.get("mask"))},
    )


def judge_run(m: Model, res: Attention, ref, ref_lse, q, k, v, **mask_kw) -> Verdict:
    """A model's run judged: errors vs float64 and the FA rule with plain attention as pt."""
    if m.precision == "naive":
        pt, pt_lse = res.out, res.lse
    else:
        pt, pt_lse = plain(q, k, v, m.dtype, **mask_kw)
    return judge(res.out, ref, pt, m.dtype, lse=res.lse, ref_lse=ref_lse, pt_lse=pt_lse)


def storable(m: Model, out: np.ndarray) -> np.ndarray:
    """O for --out: in the dtype where numpy has it (float16/32/64), else float32 holding it."""
    return out.astype(m.dtype) if m.dtype.kind == "f" else out


@dataclass(frozen=True)
class RowError:
    """One query row of a judged output: its largest error, in ulps, and its LSE error."""

    batch: int
    head: int
    query: int
    err: float  # max_j |out − ref| against the dtype-rounded reference
    ulps: float  # err in ulps of the dtype at the row's largest |ref|
    lse_err: float | None


@dataclass(frozen=True)
class HeadError:
    batch: int
    head: int
    err: float
    rows_over: int  # rows of this head whose error exceeds the rule's bound


@dataclass(frozen=True)
class CheckReport:
    shape: tuple
    notes: tuple[Rounding, ...]
    verdict: Verdict
    model_err: float | None  # osm's flash model on the same inputs: what a faithful kernel errs
    rows: tuple[RowError, ...]
    heads: tuple[HeadError, ...]
    rows_over: int
    total_rows: int
    hint: str = ""


def _lse_as_bhnd(lse: np.ndarray, ref_lse: np.ndarray, layout: str) -> np.ndarray:
    """An LSE shaped like osm's (ref_lse), or (B, H, t) as FlashAttention returns it for bnhd."""
    lse = np.asarray(lse)
    if lse.shape == ref_lse.shape:
        return lse
    if layout == "bnhd" and lse.ndim >= 2 and lse.shape == ref_lse.swapaxes(-1, -2).shape:
        return lse.swapaxes(-1, -2)
    raise OsmError(f"LSE has shape {tuple(lse.shape)}; attention of these Q, K, V gives "
                   f"{tuple(ref_lse.shape)}")


def check(out, q, k, v, dtype, *, lse=None, top: int = 5, with_model: bool = True,
          **mask_kw) -> CheckReport:
    """Judge an external kernel's output (and LSE) for inputs q, k, v in `dtype`.

    dtype is a dtype or its name ("fp16", "bfloat16", …). mask_kw are attention's causal,
    scale, layout, causal_align, window and mask.
    Example: check(o, q, k, v, "fp16", lse=lse, causal=True).verdict.passed
    """
    dt = resolve_dtype(dtype)[1] if isinstance(dtype, str) else np.dtype(dtype)
    (q, k, v), notes = round_inputs({"Q": q, "K": k, "V": v}, dt)
    out = np.asarray(out)
    kind = out.dtype.kind
    if kind not in "f" and out.dtype not in (DTYPES["bfloat16"], DTYPES["float8_e4m3fn"],
                                             DTYPES["float8_e5m2"]):
        raise OsmError(f"OUT has dtype {out.dtype}; a kernel's output is floating point")
    ref, ref_lse = reference(q, k, v, **mask_kw)
    if out.shape != ref.shape:
        raise OsmError(f"OUT has shape {tuple(out.shape)}; attention of Q {tuple(np.shape(q))}, "
                       f"K {tuple(np.shape(k))}, V {tuple(np.shape(v))} gives {tuple(ref.shape)}")
    layout = mask_kw.get("layout", "bhnd")
    if lse is not None:
        lse = _lse_as_bhnd(lse, ref_lse, layout)
    pt, pt_lse = plain(q, k, v, dt, **mask_kw)
    ref_d = round_to(ref, dt, np.float64)  # the rule's own `ref`, also judged row by row below
    lse_err = None if lse is None else lse_errors(lse, ref_lse)
    verdict = _judged(out, ref, ref_d, pt, dt, lse_err, ref_lse, pt_lse)
    model_err = None
    if with_model:
        m = model(dtype_name(dt))
        model_err = _max_abs(run_flash(m, q, k, v, trace_at=None, schedule="fa2",
                                       **mask_kw).out - ref)
    # Per row, against the dtype-rounded reference, in (B, H, t).
    ref_rows = as_bhnd(ref_d, layout, "ref")
    diff = np.abs(as_bhnd(out, layout, "OUT").astype(np.float64) - ref_rows)
    row_err = diff.max(axis=-1) if diff.shape[-1] else np.zeros(diff.shape[:-1])
    with np.errstate(over="ignore"):  # an error on an all-zero row in float64 is inf ulps of 0
        row_ulps = row_err / ulp(np.abs(ref_rows).max(axis=-1, initial=0.0), dt)
    if lse_err is not None:
        lse_err = as_bhnd(lse_err[..., None], layout, "LSE")[..., 0]
    over = ~(row_err <= verdict.rule.bound)  # NaN counts as over
    rank = np.where(np.isnan(row_err), np.inf, row_err).ravel()
    order = np.argsort(-rank, kind="stable")[:top]
    rows = []
    for flat in order:
        b, h, i = (int(x) for x in np.unravel_index(int(flat), row_err.shape))
        rows.append(RowError(b, h, i, float(row_err[b, h, i]), float(row_ulps[b, h, i]),
                             None if lse_err is None else float(lse_err[b, h, i])))
    head_err = np.where(np.isnan(row_err), np.inf, row_err).max(axis=-1, initial=0.0)
    head_over = over.sum(axis=-1)
    heads = []
    for flat in np.argsort(-head_err.ravel(), kind="stable")[:top]:
        b, h = (int(x) for x in np.unravel_index(int(flat), head_err.shape))
        heads.append(HeadError(b, h, float(row_err[b, h].max(initial=0.0)), int(head_over[b, h])))
    hint = ""
    if not verdict.passed and bits(dt) == 32:
        for narrow in ("bfloat16", "float16"):
            if np.array_equal(round_to(out, DTYPES[narrow], np.float64),
                              np.asarray(out, dtype=np.float64), equal_nan=True):
                hint = (f"every value of OUT fits {narrow}: was it a {narrow} kernel? "
                        f"Judge it with --dtype {narrow}")
                break
    return CheckReport(tuple(out.shape), notes, verdict, model_err, tuple(rows), tuple(heads),
                       int(np.count_nonzero(over)), int(row_err.size), hint)


def output_dtype(out: np.ndarray, name: str) -> np.dtype:
    """The dtype a kernel's output is judged in when --dtype is not given: its own."""
    if out.dtype in DTYPES.values():
        return out.dtype
    raise OsmError(f"{name}: has dtype {out.dtype}; give --dtype (one of {', '.join(DTYPES)})")


def fail_line(rep: CheckReport) -> str:
    """The one line `osm check` prints on stderr when a kernel fails."""
    v, parts = rep.verdict, []
    if not v.rule.passed:
        r = v.rule
        parts.append(f"max|out − ref| = {r.err:.3g} > 2·{r.pt_err:.3g} + 2·{r.rounding:.3g} = "
                     f"{r.bound:.3g} ({v.dtype}); {rep.rows_over} of {rep.total_rows} rows "
                     "over the bound")
    if v.lse is not None and not v.lse.passed:
        r = v.lse
        parts.append(f"max|lse − ref| = {r.err:.3g} > 2·{r.pt_err:.3g} + 2·{r.rounding:.3g} = "
                     f"{r.bound:.3g}")
    return "; ".join(parts) + (f" ({rep.hint})" if rep.hint else "")
