"""Attention on Q, K, V tensors: options (options.py), shapes and the GQA map (shapes.py),
masks and the one place scores are made (masks.py), the tiled forward (forward.py), the
one-shot reference (reference.py) and split-KV (split.py). Builds on core/ only."""

from .forward import attention

__all__ = ["attention"]
