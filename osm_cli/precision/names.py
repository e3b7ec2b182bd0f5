"""The names the precision layer answers to, without importing ml_dtypes (about 0.8 s), so the
command line can declare and check its options at start-up: dtype names and aliases, the
precision models and the accumulation dtypes.

Example: canonical("bf16") -> "bfloat16"
"""

from __future__ import annotations

from osm_cli.errors import OsmError

DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
ALIASES = {
    "fp64": "float64", "double": "float64", "f64": "float64",
    "fp32": "float32", "single": "float32", "f32": "float32",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
}
PRECISIONS = ("flash", "naive")  # docs/numerics.md#precision-model
ACCUMS = ("float32", "float64")
KERNELS = ("fa2", "fa4", "fa4-sm100", "tiles")  # presets.py (docs/numerics.md#kernel-presets)
MMAS = ("tensor-core", "blas")  # how a preset's matmuls round (gpu_ops.matmul)
PRESET_MMA = "tensor-core"  # a preset's matmuls unless told (presets.mma_for): bit for bit
TILES_MMA = "blas"  # osm's own tiles' matmuls: numpy's, the only ones they take
GRAD_RULES = ("fa3", "fa2")  # gradcheck.py's rules for gradients (docs/numerics.md#grad-rule)
CHECK_RULES = ("fa", "model")  # check's verdict: FlashAttention's rule, or 1.25× osm's model


def canonical(name: str) -> str:
    """The canonical name of a dtype name or alias; OsmError for one osm does not know."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DTYPE_NAMES:
        raise OsmError(f"unknown dtype {name!r}; known: {', '.join([*DTYPE_NAMES, *ALIASES])}")
    return key


__all__ = ["ACCUMS", "ALIASES", "CHECK_RULES", "DTYPE_NAMES", "GRAD_RULES", "KERNELS", "MMAS",
           "PRECISIONS", "PRESET_MMA", "TILES_MMA", "canonical"]
