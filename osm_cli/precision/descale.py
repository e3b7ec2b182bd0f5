"""FP8's descale factors (FA3/FA4) and what they may be: positive normal float32 numbers whose
products with the scale, the scores and V's largest value stay inside float32.

Leaves out: using them (emulate.py runs the kernel, check.py the reference of descaled inputs).

Example: Descale(np.full((1, 1), 0.5), np.full((1, 1), 0.5), np.ones((1, 1)))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from osm_cli.errors import InputError
from osm_cli.flash.options import FLOAT32_MAX, FLOAT32_TINY


@dataclass(frozen=True)
class Descale:
    """FP8's descale factors (FA3/FA4), float32 of shape (B, Hkv): the stored values are
    x / descale, so S = (Q·Kᵀ)·q_descale·k_descale·scale and O is multiplied by v_descale."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray

    def __post_init__(self):
        """Each factor finite, positive and a normal float32 (1e-45 is 0 there, 3e38·3e38
        inf): refused here, once, naming the value and the limit (docs/inputs.md#kernel-inputs)."""
        for name in ("q", "k", "v"):
            x = np.asarray(getattr(self, name))
            if x.dtype.kind not in "fiu":
                raise InputError(f"{name}_descale must hold real numbers, not {x.dtype}")
            x = x.astype(np.float64)
            bad = ~(np.isfinite(x) & (x >= FLOAT32_TINY) & (x <= FLOAT32_MAX))
            if bad.any():
                raise InputError(f"{name}_descale holds {x[bad].flat[0]:g}; a descale factor must "
                                 f"be positive and a normal float32, from {FLOAT32_TINY:.8g} to "
                                 f"{FLOAT32_MAX:.8g}")


def descale(q_descale, k_descale, v_descale) -> Descale | None:
    """FP8's descale factors as a Descale (None when none is given): all three or none, real
    numbers, held as float32."""
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if all(x is None for x in given.values()):
        return None
    missing = [n for n, x in given.items() if x is None]
    if missing:
        raise InputError("give `q_descale`, `k_descale` and `v_descale` together; missing "
                         f"{', '.join(f'`{n}`' for n in missing)}")
    arrays = {}
    for name, x in given.items():
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiu":
            raise InputError(f"`{name}` must hold real numbers; got dtype {arr.dtype}")
        arrays[name[0]] = arr.astype(np.float32)
    return Descale(**arrays)


def check_reach(c: np.ndarray, vd: np.ndarray, d: int, dtype) -> None:
    """InputError when c = scale·log2e·q_descale·k_descale (float32, per kv group) or
    v_descale leaves float32 with the largest values FP8 inputs of head dim d can hold."""
    # the largest |S| FP8 inputs give, d·max², must stay finite in S's units, and O·v_descale
    reach = float(d) * float(np.finfo(dtype).max) ** 2
    if not (np.isfinite(c).all() and (c >= FLOAT32_TINY).all()
            and float(c.max()) * reach <= FLOAT32_MAX):
        raise InputError(
            f"q_descale·k_descale·scale·log2(e) is {float(np.abs(c).min()):.3g} to "
            f"{float(np.abs(c).max()):.3g} in float32: with scores up to d·max² = {reach:.3g} "
            f"it must stay from {FLOAT32_TINY:.3g} to {FLOAT32_MAX / reach:.3g}")
    if float(vd.max()) * float(np.finfo(dtype).max) > FLOAT32_MAX:
        raise InputError(f"v_descale holds {float(vd.max()):g}: times V's largest "
                         f"{float(np.finfo(dtype).max):g} it leaves float32")


__all__ = ["Descale", "check_reach", "descale"]
