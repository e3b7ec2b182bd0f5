"""Judging a kernel (osm check): its output (and LSE) against the float64 reference of the
dtype-rounded inputs, by FlashAttention's test rule, row by row and head by head.

Leaves out: the rule itself (rule.py), printing (present/), reading files (io/).

Example: check(o, q, k, v, "fp16", lse=lse, causal=True).verdict.passed
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.names import LSE_BASES
from osm_cli.core.notebook import Notebook
from osm_cli.errors import OsmError
from osm_cli.flash.forward import ScoreOptions
from osm_cli.flash.options import split_options
from osm_cli.flash.reference import reference
from osm_cli.flash.shapes import as_bhnd

from .dtypes import (
    DTYPES,
    PIECE,
    Rounding,
    bits,
    blocks,
    dtype_name,
    resolve_dtype,
    round_inputs,
    round_to,
    ulp,
)
from .kernels import run_flash
from .model import model, plain
from .names import CHECK_RULES
from .presets import default_kernel, mma_for, preset_refusals
from .rule import Verdict, judged, lse_errors, max_abs, max_abs_diff


@dataclass(frozen=True)
class RowError:
    """One query row of a judged output: its largest error, in ulps, and its LSE error."""

    batch: int
    head: int
    query: int
    err: float  # max_j |out − ref| against the dtype-rounded reference
    ulps: float | None  # err in ulps of the dtype at the row's largest |ref|; None where that
    #                     is 0 and err is not (a row that sees no key: 0 has no ulp to count in)
    lse_err: float | None


@dataclass(frozen=True)
class HeadError:
    """One head of a judged output (of a varlen batch: one sequence's rows of a head, batch
    the sequence)."""

    batch: int
    head: int
    err: float  # max |out − ref| over the head's rows
    rows_over: int  # rows of this head over the bound of the tensor the heads are ranked by
    lse_err: float | None = None  # max |LSE − ref| over the head's rows (None: no LSE judged)


@dataclass(frozen=True)
class CheckReport(Notebook):
    """What `check` returns: the verdicts and where the errors are (in Jupyter, as check's
    tables: notebook.py)."""

    shape: tuple
    notes: tuple[Rounding, ...]
    verdict: Verdict
    model_err: float | None  # osm's flash model on the same inputs: what a faithful kernel errs
    rows: tuple[RowError, ...]
    heads: tuple[HeadError, ...]
    rows_over: int
    total_rows: int
    hint: str = ""
    grads: tuple = ()  # gradcheck.GradCheck per gradient judged (dq, dk, dv given)
    kernel: str | None = None  # the preset whose model ran beside (presets.py); None: no model
    mma: str | None = None  # how the model's matmuls rounded (presets.mma_for); None: no model
    rule: str = "fa"  # the rule that gave the verdicts (names.CHECK_RULES)
    lse_base: str = "e"  # the base the kernel's LSE was read in
    tensors: tuple = ()  # diagnose.TensorVerdict per judged tensor (out, lse, dq, dk, dv)
    model_lse_err: float | None = None  # max |LSE − ref64| of osm's model of the kernel
    bias: tuple = ()  # strict.HeadBias per head, the most significant first
    no_key_rows: int = 0  # query rows that see no key (their output must be exactly 0)
    probe: object = None  # probe.Probe, run when a tensor fails (None: not run)
    tile_map: object = None  # locate.TileMap of the traced failing head (None: none)
    other_rules: tuple = ()  # strict.OtherRule per (rule, tensor), with rules_table
    varlen: bool = False  # rows are (sequence, query) of a varlen batch: batch is the sequence
    ranked_by: str = "out"  # the tensor the worst rows and heads are ranked by: out or lse

    @property
    def passed(self) -> bool:
        """Every judged tensor passes under the chosen rule (FlashAttention's by default)."""
        if self.tensors:
            return all(t.passed for t in self.tensors)
        return self.verdict.passed and all(g.rule.passed for g in self.grads)

    @property
    def failures(self) -> tuple:
        """The tensors that fail, in the order out, lse, dq, dk, dv."""
        return tuple(t for t in self.tensors if not t.passed)

    @property
    def worst_grad(self):
        """The gradient nearest its bound (or furthest past it); None without gradients."""
        return max(self.grads, key=lambda g: g.severity, default=None)

    def _tables(self):
        from .notebook import check_tables

        return check_tables(self)


def _lse_as_bhnd(lse: np.ndarray, ref_lse: np.ndarray, layout: str) -> np.ndarray:
    """An LSE shaped like osm's (ref_lse: FlashAttention's (B, H, t)), or for bnhd inputs as
    Q's shape without d (osm 0.2's (B, t, H))."""
    lse = np.asarray(lse)
    if lse.shape == ref_lse.shape:
        return lse
    if layout == "bnhd" and lse.ndim >= 2 and lse.shape == ref_lse.swapaxes(-1, -2).shape:
        return lse.swapaxes(-1, -2)
    raise OsmError(f"LSE has shape {tuple(lse.shape)}; attention of these Q, K, V gives "
                   f"{tuple(ref_lse.shape)}")


def check(out, q, k, v, dtype, *, lse=None, do=None, dq=None, dk=None, dv=None, dsink=None,
          top: int = 5,
          with_model: bool = True, grad_rule: str = "fa3", opts: ScoreOptions | None = None,
          kernel: str | None = None, mma: str | None = None, descale=None, rule: str = "fa",
          lse_base: str = "e", probe: bool = True, rules_table: bool = False,
          baseline: dict | None = None, **options) -> CheckReport:
    """Judge an external kernel's output (and LSE, and gradients) for inputs q, k, v in `dtype`.

    dtype is a dtype or its name ("fp16", "bfloat16", …). opts (or its fields as keywords:
    causal, scale, layout, causal_align, window, mask) as attention's. dq, dk, dv (any of them)
    are the kernel's gradients for the upstream gradient do, judged by FlashAttention's backward
    rule `grad_rule` (gradcheck.GRAD_RULES); dsink, the sinks' gradient (one per query head),
    by FlashAttention-4's (gradcheck._sink_check). kernel names the preset whose model runs beside
    (presets.py; default fa2 for 16-bit, fa4-sm100 for FP8, tiles otherwise), mma how its
    matmuls round (presets.mma_for: a preset's tensor cores, tiles' BLAS, by default).
    descale (emulate.Descale, FP8): q, k, v hold x / descale; the reference and plain
    attention see x, the model takes the factors as the kernel does.
    rule: "fa" (FlashAttention's, the default) or "model" (error ≤ 1.25× osm's model of the
    kernel, and no head biased) decides each tensor's verdict; a row that sees no key must be
    exactly 0 under both. lse_base: "e" or "2", the base of the kernel's LSE. probe: on a
    failure, try the other conventions on the failing heads (probe.py) and locate the failing
    rows (locate.py). rules_table: also say what other projects' tolerance rules would.
    Example: check(o, q, k, v, "fp16", lse=lse, causal=True).passed
    """
    from .diagnose import diagnose

    if rule not in CHECK_RULES:
        raise OsmError(f"`rule` must be one of {', '.join(CHECK_RULES)}, not {rule!r}")
    if str(lse_base) not in LSE_BASES:
        raise OsmError(f"`lse_base` must be one of {', '.join(LSE_BASES)}, not {lse_base!r}")
    if rule == "model" and not with_model:
        raise OsmError("`rule` model judges against osm's model of the kernel, which "
                       "`with_model` False skips: give one of them")
    opts = split_options(options, opts)[0]
    dt = resolve_dtype(dtype)[1] if isinstance(dtype, str) else np.dtype(dtype)
    kname = kernel or default_kernel(dtype_name(dt), opts)
    preset_refusals(kname, descale=descale, dtype=dtype_name(dt))  # with the model or not
    mma = mma_for(kname, mma)
    given = {n: g for n, g in (("dq", dq), ("dk", dk), ("dv", dv), ("dsink", dsink))
             if g is not None}
    if given and do is None:
        raise OsmError("judging gradients needs dO, the upstream gradient they were computed "
                       "for")
    if do is not None and not given:
        raise OsmError("dO was given but no gradient to judge (dQ, dK, dV or dsink)")
    arrays = {"Q": q, "K": k, "V": v, **({} if do is None else {"dO": do})}
    rounded, notes = round_inputs(arrays, dt)
    q, k, v = rounded[:3]
    out = np.asarray(out)
    if out.dtype.kind not in "f" and out.dtype not in (
            DTYPES["bfloat16"], DTYPES["float8_e4m3fn"], DTYPES["float8_e5m2"]):
        raise OsmError(f"OUT has dtype {out.dtype}; a kernel's output is floating point")
    eq, ek, ev = (q, k, v) if descale is None else descaled_inputs(q, k, v, descale, opts)
    base = baseline or {}
    ref, ref_lse = (base["ref"], base["ref_lse"]) if base else reference(eq, ek, ev, opts)
    if out.shape != ref.shape:
        raise OsmError(f"OUT has shape {tuple(out.shape)}; attention of Q {tuple(np.shape(q))}, "
                       f"K {tuple(np.shape(k))}, V {tuple(np.shape(v))} gives {tuple(ref.shape)}")
    if out.size == 0:  # no PASS for nothing judged (docs/inputs.md#zero-size-inputs)
        raise OsmError(f"OUT is empty {tuple(out.shape)}: there is nothing to judge")
    if lse is not None:
        lse = _lse_as_bhnd(lse, ref_lse, "packed" if opts.packing.active else opts.layout)
        if str(lse_base) == "2":
            lse = np.asarray(lse, dtype=np.float64) * math.log(2.0)
    # the model, plain attention, then ref rounded: in this order the largest temporaries of
    # each meet the fewest full-size arrays (a layer's check stays under 1 GB: bench_check.py)
    model_err, name, mres, beside = None, None, None, {}
    if with_model:
        m, name = model(dtype_name(dt)), kname
        extra = {} if name == "tiles" else {"mma": mma, "descale": descale}
        mres = run_flash(m, q, k, v, trace_at=None, kernel=name, opts=opts, **extra)
    pt, pt_lse = (base["pt"], base["pt_lse"]) if base else plain(eq, ek, ev, dt, opts)
    ref_d = round_to(ref, dt, np.float64)  # the rule's own `ref`, also judged row by row below
    lse_err = None if lse is None else lse_errors(lse, ref_lse)
    if with_model:
        model_err = max_abs_diff(mres.out, ref)
        # what a faithful kernel errs: the bound where plain attention overflowed (rule.py)
        beside["model_err"] = max_abs_diff(mres.out, ref_d)
        if lse is not None and np.shape(mres.lse) == np.shape(ref_lse):
            beside["model_lse_err"] = max_abs(lse_errors(mres.lse, ref_lse))
    verdict = judged(out, ref, ref_d, pt, dt, lse_err, ref_lse, pt_lse, **beside)
    del pt
    view = view_of(opts)
    failing_lse = lse is not None and verdict.lse is not None and not verdict.lse.passed
    rows, heads, over, row_err = worst(out, ref_d, lse_err, verdict.rule.bound, dt, view, top,
                                       by_lse=failing_lse and verdict.rule.passed,
                                       cu_seqlens=packed_offsets(opts))
    grads = ()
    if given:
        from .gradcheck import check_grads  # the backward's reference, only when judged

        grads = check_grads(q, k, v, rounded[3], dt, given, opts, top=top,
                            with_model=with_model, rule=grad_rule, kernel=name, mma=mma,
                            refs=base.get("grads"), pts=base.get("grad_pts"))
    rep = CheckReport(tuple(out.shape), notes, verdict, model_err, rows, heads,
                      int(np.count_nonzero(over)), int(over.size),
                      "" if verdict.passed else _hint(out, dt), grads, name,
                      mma if with_model else None)
    diag = diagnose(rep, out=out, ref=ref, ref_d=ref_d, ref_lse=ref_lse, lse=lse,
                    lse_err=lse_err, row_err=row_err, model=mres, q=eq, k=ek, v=ev, opts=opts,
                    dt=dt, rule=rule, probe=probe, rules_table=rules_table,
                    blocks_known=kernel is not None, given=given, top=top,
                    lse_base=str(lse_base))
    return replace(rep, rule=rule, lse_base=str(lse_base), **diag)


def descaled_inputs(q, k, v, descale, opts: ScoreOptions):
    """FP8's stored Q, K, V times their descale factors (emulate.Descale, each (B, Hkv)), in
    float64: the tensors whose attention the kernel computes. One error line for a factor of
    the wrong shape or a non-positive one; a varlen or paged batch takes none."""
    if opts.packing.active:
        raise OsmError("FP8 descale factors are per (batch, kv head) of a dense batch; a varlen "
                       "or paged batch takes none here")
    q4 = as_bhnd(np.asarray(q), opts.layout, "Q")
    k4 = as_bhnd(np.asarray(k), opts.layout, "K")
    b, hq, hk = q4.shape[0], q4.shape[1], k4.shape[1]
    outs = []
    for x, f, name in ((q, descale.q, "q"), (k, descale.k, "k"), (v, descale.v, "v")):
        f = np.asarray(f)
        if f.shape != (b, hk):
            raise OsmError(f"`{name}_descale` has shape {tuple(f.shape)}; it must be (B, Hkv) "
                           f"= ({b}, {hk})")
        f = f.astype(np.float64)
        if not (np.isfinite(f).all() and (f > 0).all()):
            raise OsmError(f"`{name}_descale` must hold finite positive factors")
        x64 = np.array(x, dtype=np.float64)
        if name == "q":
            f = np.repeat(f, hq // max(hk, 1), axis=1)
        view = as_bhnd(x64, opts.layout, name.upper())
        view *= f[:, :, None, None]
        outs.append(x64)
    return tuple(outs)


def worst(out, ref_d, lse_err, bound: float, dt, layout: str, top: int, by_lse: bool = False,
          cu_seqlens=None):
    """The `top` worst rows and heads against the dtype-rounded reference, in (B, H, t), which
    rows are over the rule's bound (NaN counts as over), and every row's error. out may be a
    gradient too (dK's rows are keys). by_lse: rows ranked by their LSE error (the LSE fails,
    the output does not). cu_seqlens: a varlen batch's offsets of these (packed) rows: the
    worst rows are (sequence, row) and the heads a sequence's (batch holds the sequence)."""
    ref_rows, out_rows = rows_view(ref_d, layout), rows_view(out, layout)
    row_err, row_top = row_maxima(out_rows, ref_rows)
    with np.errstate(over="ignore"):  # an error on an all-zero row in float64 is inf ulps of 0
        row_ulps = row_err / ulp(row_top, dt)
    if lse_err is not None:
        lse_err = lse_rows(lse_err, layout)
    over = ~(row_err <= bound)
    key = lse_err if by_lse and lse_err is not None else row_err
    rank = np.where(np.isnan(key), np.inf, key).ravel()
    rows = []
    for flat in np.argsort(-rank, kind="stable")[:top]:
        b, h, i = (int(x) for x in np.unravel_index(int(flat), row_err.shape))
        e = float(row_err[b, h, i])
        u = float(row_ulps[b, h, i]) if row_top[b, h, i] or e == 0 else None
        rows.append(RowError(b, h, i, e, u, None if lse_err is None else float(lse_err[b, h, i])))
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        seq = np.searchsorted(cu, [r.query for r in rows], side="right") - 1
        rows = [replace(r, batch=int(s), query=int(r.query - cu[s]))
                for r, s in zip(rows, seq, strict=True)]
    heads = rank_heads(row_err, over, top, lse_err=lse_err, by_lse=by_lse,
                       cu_seqlens=cu_seqlens)
    return tuple(rows), heads, over, row_err


def rank_heads(row_err, over, top: int, *, lse_err=None, by_lse: bool = False,
               cu_seqlens=None) -> tuple[HeadError, ...]:
    """The `top` worst heads of (B, H, rows) row errors, ranked by the tensor the verdict
    failed: the output's errors, or the LSE's (lse_err, same shape) with by_lse; rows_over
    counts that tensor's rows in `over` (its rows over its bound). cu_seqlens: the rows are a
    varlen batch's packed rows (B = 1), taken a sequence at a time (HeadError.batch is then the
    sequence)."""
    key = lse_err if by_lse and lse_err is not None else row_err
    if cu_seqlens is None:
        def per_head(x, ufunc, empty):  # (B, H)
            return ufunc.reduce(x, axis=-1, initial=empty)
    else:
        n = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
        starts = np.asarray(cu_seqlens, dtype=np.int64)[:-1][n > 0]

        def per_head(x, ufunc, empty):  # (sequences, H); an empty sequence holds `empty`
            got = np.full((n.size, x.shape[1]), empty, dtype=x.dtype)
            if starts.size:
                got[n > 0] = ufunc.reduceat(x[0], starts, axis=-1).T
            return got

    score = per_head(np.where(np.isnan(key), np.inf, key), np.maximum, -np.inf)
    err = per_head(row_err, np.maximum, 0.0)
    count = per_head(np.asarray(over, dtype=np.int64), np.add, 0)
    lse = None if lse_err is None else per_head(lse_err, np.maximum, 0.0)
    heads = []
    for flat in np.argsort(-score.ravel(), kind="stable")[:top]:
        g, h = (int(x) for x in np.unravel_index(int(flat), score.shape))
        heads.append(HeadError(g, h, float(err[g, h]), int(count[g, h]),
                               None if lse is None else float(lse[g, h])))
    return tuple(heads)


def row_maxima(out_rows: np.ndarray, ref_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of (…, rows, d) arrays: max_j |out − ref| in float64 (NaN propagates) and
    max_j |ref| (0 for d = 0), a piece at a time (dtypes.blocks: no whole float64 copy)."""
    lead = ref_rows.shape[:-1]
    err, top = np.zeros(lead), np.zeros(lead)
    if not ref_rows.shape[-1]:
        return err, top
    for ix in blocks(lead, max(1, PIECE // ref_rows.shape[-1])):
        ref = ref_rows[ix]
        with np.errstate(invalid="ignore", over="ignore"):
            err[ix] = np.abs(out_rows[ix].astype(np.float64) - ref).max(axis=-1)
        top[ix] = np.abs(ref).max(axis=-1)
    return err, top


def lse_rows(x, layout: str) -> np.ndarray:
    """An LSE-shaped array as (B, H, rows): FlashAttention's (B, H, t) for both dense layouts,
    (H, total) for a packed batch."""
    view = "bhnd" if layout == "bnhd" else layout
    return rows_view(np.asarray(x)[..., None], view, lse=True)[..., 0]


def view_of(opts: ScoreOptions, x: str = "q") -> str:
    """How check ranks the rows of an array stored like Q (x "q") or K: by the layout, or for
    a packed or paged batch "packed" (rows of (rows, H, d), batch 0) or "fa" ((B, N, H, d),
    LSE (B, H, N))."""
    p = opts.packing
    if not p.active:
        return opts.layout
    packed = p.cu_seqlens_q is not None if x == "q" else (
        p.cu_seqlens_k is not None or p.page_table is not None)
    return "packed" if packed else "fa"


def packed_offsets(opts: ScoreOptions, x: str = "q"):
    """The cu_seqlens of a varlen batch whose rows of an array stored like Q (x "q") or K are
    packed (view_of's "packed"); None for a dense or paged one."""
    if view_of(opts, x) != "packed":
        return None
    p = opts.packing
    return p.cu_seqlens_q if x == "q" else p.cu_seqlens_k


def rows_view(x, layout: str, lse: bool = False) -> np.ndarray:
    """x as (B, H, rows, d) for ranking rows: attention's layouts, or a packed batch's
    (…, H, d) rows as one batch, or FlashAttention's (B, N, H, d) with its LSE (B, H, N)."""
    x = np.asarray(x)
    if layout == "packed":
        if lse:  # FlashAttention's (H, total) LSE, with a trailing axis of 1
            return x[None]
        return x.reshape(-1, *x.shape[-2:]).swapaxes(0, 1)[None]
    if layout == "fa":
        return x if lse else x.swapaxes(1, 2)
    return as_bhnd(x, layout, "rows")


def _hint(out, dt) -> str:
    """A float32 output that fails but holds only bf16 or fp16 values was likely that kernel's."""
    if bits(dt) != 32:
        return ""
    for narrow in ("bfloat16", "float16"):
        if np.array_equal(round_to(out, DTYPES[narrow], np.float64),
                          np.asarray(out, dtype=np.float64), equal_nan=True):
            return (f"every value of OUT fits {narrow}: was it a {narrow} kernel? "
                    f"Judge it with --dtype {narrow}")
    return ""


def output_dtype(out: np.ndarray, name: str) -> np.dtype:
    """The dtype a kernel's output is judged in when --dtype is not given: its own."""
    if out.dtype in DTYPES.values():
        return out.dtype
    raise OsmError(f"{name}: has dtype {out.dtype}; give `dtype` (one of {', '.join(DTYPES)})")


__all__ = ["CheckReport", "HeadError", "RowError", "check", "descaled_inputs", "output_dtype"]
