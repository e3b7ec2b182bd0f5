"""Attention's choices as plain values, importable without numpy, so that the command line can
declare its options at start-up (`osm --help` loads no numpy): causal alignments, layouts,
paged caches' layouts and the LSE a fully masked row gets.

Leaves out: what the choices do (options.py, masks.py, forward.py).

Example: MASKED_LSE["pos-inf"] -> inf
"""

from __future__ import annotations

import math

# docs/numerics.md#masked-rows
MASKED_LSE = {"neg-inf": -math.inf, "pos-inf": math.inf, "zero": 0.0}
ALIGNS = ("bottom-right", "top-left")  # docs/numerics.md#causal-alignment
LAYOUTS = ("bhnd", "bnhd")  # docs/numerics.md#layouts
KV_LAYOUTS = ("nhd", "hnd")  # a paged KV cache's (docs/numerics.md#paged-kv)

__all__ = ["ALIGNS", "KV_LAYOUTS", "LAYOUTS", "MASKED_LSE"]
