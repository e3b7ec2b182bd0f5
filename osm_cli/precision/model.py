"""Where a kernel rounds: the precision models of attention for a dtype
(docs/numerics.md#precision-model).

- "flash": Q, K, V rounded to the dtype; S, m, l, α and O in float32 (or float64 accumulation);
  P = exp(S − m) in float32, l summed from it unrounded, P rounded to the dtype before P·V; the
  final O / l rounded to the dtype; LSE kept in float32. It runs flash/'s own tiled forward
  with the Hooks of the model.
- "naive": plain attention in the dtype, each op's result rounded to it as PyTorch does for
  16-bit tensors (float32 inside the matmul and the softmax): Q·scale, S, softmax(S), P·V.

`prepare` and `run` turn attention's --dtype, --precision and --accum into a model and its run.
Leaves out: a kernel's schedule (kernels.py), the verdict (rule.py), check (check.py).

Example: model("bf16").describe()
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from osm_cli.errors import OsmError
from osm_cli.flash.forward import (
    Attention,
    Hooks,
    ScoreOptions,
    attention,
    attention_trace,
    masked_as,
    run_options,
    shapes_of,
)
from osm_cli.flash.options import split_options
from osm_cli.flash.records import Counters, Tiles
from osm_cli.flash.reference import reference
from osm_cli.flash.shapes import as_bhnd, check_traced, row_of

from .dtypes import Rounding, bits, carrier, resolve_dtype, round_inputs, round_to
from .names import ACCUMS, PRECISIONS
from .rule import Verdict, judge


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
        out = self.name
        if self.name.startswith("float8"):  # FA4's FP8 kernels write bf16 (emulate._finish)
            out = f"bfloat16 (FA4's FP8 output; to {self.name} with --kernel tiles)"
        return (f"flash: Q, K, V in {self.name}; S, m, l, α, O in {self.accum.name}; "
                f"P rounded to {self.name} before P·V; O / l rounded to {out}; "
                f"LSE in {self.accum.name}")


    def describe_backward(self, kernel: str | None = None) -> str:
        if self.p_round is None:
            return f"flash backward: inputs in {self.name}, arithmetic in {self.accum.name}"
        fa4 = kernel in ("fa4", "fa4-sm100")
        group = ("GQA's dK, dV summed over the group in float32" if fa4 else
                 "GQA's dK, dV rounded per query head before the group's sum")
        return (f"flash backward ({'FA4' if fa4 else 'FA2'}): Q, K, V, O, dO in {self.name}; "
                f"D, S, P, dP, dS in {self.accum.name}; P and dS rounded to {self.name} before "
                f"their matmuls; dQ, dK, dV accumulated in {self.accum.name}, rounded to "
                f"{self.name} at the end; {group}")


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


def finish(m: Model, res: Attention) -> Attention:
    """The final O / l rounded to the dtype (LSE stays in the state's dtype)."""
    if bits(m.dtype) >= bits(res.out.dtype):
        return res
    def rounded(x):
        return None if x is None else round_to(x, m.dtype, x.dtype)

    return replace(res, out=rounded(res.out),
                   trace=replace(res.trace, outs=rounded(res.trace.outs)))


def plain(q, k, v, dtype, opts: ScoreOptions | None = None,
          **options) -> tuple[np.ndarray, np.ndarray]:
    """Plain attention in `dtype`, FlashAttention's test `pt` (upcast=False): (out, lse).

    Each op's result is rounded to the dtype, with float32 inside the op, as PyTorch computes
    16-bit tensors: Q·scale, S = (Q·scale)·Kᵀ, a float mask added, softmax(S), P·V. LSE is the
    logsumexp of the rounded S, in float32. This is attention.reference with each op rounded
    (opts, or its fields as keywords); outputs are shaped like attention's and carried in
    float32 (float64 for float64).
    """
    dt = np.dtype(dtype)
    c = carrier(dt)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return reference(q, k, v, opts, **options, rnd=lambda x: round_to(x, dt, c), carry=c)


def prepare(dtype: str | None, precision: str | None, accum: str | None, q, k,
            v) -> tuple[Model | None, tuple, tuple[Rounding, ...]]:
    """attention's --dtype, --precision and --accum: (model, (q, k, v) rounded to its dtype,
    rounding notes), or (None, (q, k, v), ()) without a dtype.

    Example: m, (q, k, v), notes = prepare("bf16", None, None, q, k, v)
    """
    if dtype is None:
        if precision is not None or accum is not None:
            raise OsmError("`precision` and `accum` need `dtype`")
        return None, (q, k, v), ()
    m = model(dtype, precision, accum)
    rounded, notes = round_inputs({"Q": q, "K": k, "V": v}, m.dtype)
    return m, rounded, notes


def prepare_backward(dtype: str | None, given: dict):
    """backward's --dtype: (model, (q, k, v, do) rounded to its dtype, rounding notes) of the
    tensors given by name; bfloat16 or float8 inputs (which only a kernel in that dtype makes)
    run as their own dtype's model when no dtype is named."""
    from .dtypes import shared_narrow

    q, k, v = given["q"], given["k"], given["v"]
    m, (q, k, v), notes = prepare(dtype or shared_narrow(q, k, v), None, None, q, k, v)
    do = given["do"]
    if m is not None:
        (do,), more = round_inputs({"dO": do}, m.dtype)
        notes = (*notes, *more)
    return m, (q, k, v, do), notes


def hooks_for(m: Model | None, splits: int | None = None, order=None,
              threshold: float = 0.0) -> Hooks:
    """attention's Hooks for m's tiled run: the state's dtype and P's rounding (none for None).

    precision naive has no tiles, so it refuses splits, a tile order (a permutation; None is
    forward) and a rescale threshold rather than ignore them.
    """
    if m is None:
        return Hooks()
    if m.precision == "naive":
        for flag, given in (("`splits`", splits is not None), ("`order`", order is not None),
                            ("`rescale_threshold`", bool(threshold))):
            if given:
                raise OsmError(f"{flag} needs the tiled run; `precision` naive is one-shot "
                               "attention")
        return Hooks()
    return Hooks(m.accum, m.p_round)


def run(m: Model | None, q, k, v, **kwargs) -> Attention:
    """attention (m None), or m's run of it: flash rounds the final O / l to the dtype; naive is
    plain attention in the dtype, one shot. kwargs are attention's (hooks=hooks_for(m))."""
    if m is None:
        return attention(q, k, v, **kwargs)
    if m.precision == "naive":
        return run_naive(m, q, k, v, **kwargs)
    return finish(m, attention(q, k, v, **kwargs))


def run_naive(m: Model, q, k, v, *, trace_at=(0, 0, 0), masked_lse="neg-inf", opts=None,
              tiling=None, hooks=None, progress=None, **options) -> Attention:
    """precision naive as an Attention record: plain attention in the dtype, one shot (no tiles)."""
    opts, tiling, _ = split_options(options, opts, tiling, hooks)
    hooks_for(m, order=tiling.order, threshold=tiling.threshold)
    trace_at = check_traced(trace_at, as_bhnd(np.asarray(q), opts.layout, "Q").shape[:3])
    out, lse = plain(q, k, v, m.dtype, opts)
    empty = np.isneginf(lse)
    lse = masked_as(lse, masked_lse)
    outs = None if trace_at is None else row_of(out, trace_at, opts.layout).copy()
    return Attention(
        out=out, lse=lse, shapes=shapes_of(q, k, v),
        options=run_options(opts, q, masked_lse, softcap=None, alibi=False, sinks=False,
                            one_shot=True),
        tiles=Tiles(block_q=0, block_k=0),
        counters=Counters(rescales=0, masked_rows=int(np.count_nonzero(empty)), row_visits=0),
        trace=attention_trace((0, 0, 0) if trace_at is None else (*trace_at[:2], trace_at[2][0]),
                              () if trace_at is None else trace_at[2], (), outs),
    )


def judge_run(m: Model, res: Attention, ref, ref_lse, q, k, v, opts: ScoreOptions) -> Verdict:
    """A model's run judged: errors vs float64 and the FA rule with plain attention as pt."""
    if m.precision == "naive":
        pt, pt_lse = res.out, res.lse
    else:
        pt, pt_lse = plain(q, k, v, m.dtype, opts)
    return judge(res.out, ref, pt, m.dtype, lse=res.lse, ref_lse=ref_lse, pt_lse=pt_lse)


def storable(m: Model | None, out: np.ndarray) -> np.ndarray:
    """O for --out: in the dtype where numpy has it (float16/32/64), else float32 holding it;
    as it is without a model."""
    if m is None:
        return out
    return out.astype(m.dtype) if m.dtype.kind == "f" else out
