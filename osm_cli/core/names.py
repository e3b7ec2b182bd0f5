"""The core's choices as plain tuples, importable without numpy, so that the command line can
declare its options at start-up (`osm --help` loads no numpy): the update forms of the online
step and the bases of a log-sum-exp.

Leaves out: what the choices do (state.py, merge.py).

Example: "merge" in FORMS
"""

from __future__ import annotations

FORMS = ("rescale", "merge")  # docs/numerics.md#update-forms
LSE_BASES = ("e", "2")  # natural log (FlashAttention, PyTorch) or log2 (FlashInfer)

__all__ = ["FORMS", "LSE_BASES"]
