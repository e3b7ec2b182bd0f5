"""What `osm backward` reports, computed in one place: the tiled backward (or the flash model's
under --dtype), its gradients against the float64 closed-form reference, and under --dtype the
backward test rule's verdict on each gradient.

Leaves out: the algorithms (flash/backward.py, precision/backward.py), files (io/), tables
and JSON (present/).

Example: backward_report(q, k, v, do, ScoreOptions(causal=True), Tiling()).errors["dq"]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.flash.backward import Backward, attention_backward
from osm_cli.flash.options import ScoreOptions, Tiling
from osm_cli.flash.packed import Packed, plan_packing, traced_row
from osm_cli.flash.reference import reference_backward
from osm_cli.flash.shapes import as_bhnd
from osm_cli.precision.backward import flash_backward, kernel_arithmetic
from osm_cli.precision.dtypes import Rounding
from osm_cli.precision.gradcheck import GRADS, GradCheck, check_grads
from osm_cli.precision.model import Model
from osm_cli.precision.presets import kernel_for, mma_for
from osm_cli.precision.rule import max_abs


@dataclass(frozen=True)
class BackwardReport:
    """Everything `osm backward` shows: the run, its errors, the traced rows' references."""

    result: Backward
    layout: str = "bhnd"  # the inputs' layout (ScoreOptions.layout)
    model: Model | None = None  # the precision model of --dtype (None: the plain run)
    notes: tuple[Rounding, ...] = ()  # per input: what rounding to the model's dtype did
    errors: dict | None = None  # per gradient: max_abs_err, max_rel_err (None: not compared)
    ref_rows: dict | None = None  # the reference's traced rows: dq (query I), dk and dv (key J)
    verdicts: tuple[GradCheck, ...] = ()  # under --dtype: each gradient by the backward rule
    packed: Packed | None = None  # a varlen or paged batch's sequences (None: dense)
    kernel: str = "tiles"  # the preset whose forward gave O and LSE (presets.py)
    mma: str = "blas"  # how the matmuls rounded (presets.mma_for: resolved, never None)
    kernel_arith: bool = False  # the backward ran the kernel's own arithmetic (kernel_backward)
    shown: bool = False  # the kernel named on the screen (a model ran, or --kernel was given)

    @property
    def grads(self) -> dict:
        r = self.result
        return {"dq": r.dq, "dk": r.dk, "dv": r.dv}

    @property
    def traced_rows(self) -> dict:
        """The run's traced rows: dQ of the traced query, dK and dV of the traced key."""
        return _rows(self.grads, self.result, self.layout, self.packed)


def _rows(grads: dict, res: Backward, layout: str, packed: Packed | None = None) -> dict:
    """dQ's traced query row (several traced rows: (rows, d), as res.trace.queries), dK's and dV's
    traced key row (of the traced sequence when packed is a varlen or paged batch)."""
    b, h, i = res.trace.at
    many = len(res.trace.queries) > 1
    out = {}
    for name, g in grads.items():
        if packed is not None:
            if name == "dq":
                rows = [traced_row(packed, g, (b, h, qi)) for qi in res.trace.queries or (i,)]
                out[name] = np.stack(rows) if many else rows[0]
            else:
                out[name] = traced_row(packed, g, (b, res.trace.kv_head, i), key=res.trace.key)
            continue
        g4 = as_bhnd(np.asarray(g), layout, name)
        out[name] = (g4[b, h, list(res.trace.queries) if many else i] if name == "dq" else
                     g4[b, res.trace.kv_head, res.trace.key])
    return out


def backward_report(
    q, k, v, do, opts: ScoreOptions, tiling: Tiling, *, out=None, lse=None,
    model: Model | None = None, notes: tuple = (), with_reference: bool = True,
    kernel: str | None = None, mma: str | None = None, **run_kw,
) -> BackwardReport:
    """Run the backward on q, k, v, do (the forward's out and lse if given, else osm's own) and
    check it against the float64 closed-form gradients.

    q, k, v, do hold `model`'s values already (precision.model.prepare gives `notes`); run_kw
    are attention_backward's trace_at, trace_key and progress. Under a model the tiles default
    to the kernel's backward tiles, and each gradient is judged by the backward rule. kernel
    names the preset (kernel_for's default) whose forward gives O and LSE when none is given
    and whose backward is modelled (FA2's, or FA4's for fa4 and fa4-sm100: precision/
    backward.py); mma is how the matmuls round (mma_for: a preset's tensor cores by default).
    """
    name = kernel_for(model, kernel, opts)
    mma = mma_for(name, mma)
    shown = model is not None or kernel is not None
    if model is None:
        res = attention_backward(q, k, v, do, out=out, lse=lse, opts=opts, tiling=tiling,
                                 **run_kw)
    else:
        given = tiling.block_q is not None or tiling.block_k is not None
        res = flash_backward(model, q, k, v, do, out, lse, opts=opts,
                             tiling=tiling if given else None, kernel=name, mma=mma, **run_kw)
    packed = plan_packing(q, k, v, opts.packing) if opts.packing.active else None
    about = {"kernel": name, "mma": mma, "shown": shown,
             "kernel_arith": model is not None and kernel_arithmetic(name, model, opts, mma)}
    rep = BackwardReport(res, opts.layout, model, notes, packed=packed, **about)
    if not with_reference:
        return rep
    grads = reference_backward(q, k, v, do, opts)
    refs = dict(zip(GRADS, grads, strict=True))
    errs = {}
    mine = {**rep.grads, **({} if res.dsink is None else {"dsink": res.dsink})}
    for name, g in mine.items():
        want = grads.dsink if name == "dsink" else refs[name]
        err = max_abs(np.asarray(g, dtype=np.float64) - want)
        top = max_abs(want)
        errs[name] = {"max_abs_err": err, "max_rel_err": err / top if top else 0.0}
    verdicts = ()
    if model is not None:
        verdicts = check_grads(q, k, v, do, model.dtype, rep.grads, opts, with_model=False,
                               refs=refs)
    return BackwardReport(res, opts.layout, model, notes, errs,
                          _rows(refs, res, opts.layout, packed), verdicts, packed, **about)


__all__ = ["BackwardReport", "backward_report"]
