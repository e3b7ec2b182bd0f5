"""Which loop runs a model: a kernel preset's own (emulate.py) or osm's readable tiles.

`run_flash(m, q, k, v, kernel=...)` is the flash model of dtype-valued inputs under a kernel's
schedule and arithmetic: "fa2", "fa4" and "fa4-sm100" run the preset's loop (presets.py,
emulate.py); "tiles" runs flash/'s own loop (block_q, block_k and the tile order as given,
exp(S − m), O / l) with P rounded and O / l rounded (model.py). (docs/numerics.md#kernel-presets).
Leaves out: where values are rounded (model.py), the verdict (rule.py).

Example: run_flash(model("bf16"), q, k, v, kernel="fa4", causal=True).out
"""

from __future__ import annotations

from osm_cli.errors import OsmError
from osm_cli.flash.forward import Attention, Hooks, attention

from .emulate import run_kernel
from .model import Model, finish
from .names import KERNELS
from .presets import SMS, fa2_plan, mma_for, preset


def run_flash(m: Model, q, k, v, *, kernel: str | None = None,
              sms: int = SMS, **kwargs) -> Attention:
    """The flash model of `kernel` (default "tiles") on q, k, v, which should already hold the
    dtype's values (round_inputs); kwargs are attention's (opts, tiling or their fields,
    masked_lse, trace_at) and, for a preset, run_kernel's (mma, descale, threshold, ops).

    Where P is rounded relative to a running max, the kernel's schedule decides which max, and
    its arithmetic (exp2 on an FMA, the reciprocal) the last bits: a preset matches its kernel
    element by element far more often than osm's own tiles do.
    """
    name = kernel or "tiles"
    if name not in KERNELS:
        raise OsmError(f"unknown kernel {name!r}; the presets are {', '.join(KERNELS)}")
    if name == "tiles":
        mma_for(name, kwargs.pop("mma", None))  # tiles take numpy's matmuls only
        for key in ("descale", "threshold", "ops"):
            if kwargs.pop(key, None) is not None:
                raise OsmError(f"`{key}` belongs to a kernel preset; `kernel` tiles is osm's own "
                               "loop")
        return finish(m, attention(q, k, v, hooks=Hooks(m.accum, m.p_round), **kwargs))
    return run_kernel(preset(name), m, q, k, v, sms=sms, **kwargs)


__all__ = ["SMS", "fa2_plan", "run_flash"]
