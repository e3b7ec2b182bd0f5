"""FlashAttention's algorithm on Q, K, V tensors, in numpy: options (options.py), shapes and
the GQA map (shapes.py), masks and the one place scores are made (masks.py), the tiled forward
(forward.py), the records it returns (records.py), the one-shot reference (reference.py) and
split-KV (split.py). Builds on core/
only. (Named flash/ so that no subpackage shadows the function `osm_cli.attention`.)

`attention` (forward.py's) is loaded on first use, so that names.py, the choices the command
line declares at start-up, can be imported without numpy.
"""


def __getattr__(name: str):
    if name == "attention":
        from .forward import attention

        return attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["attention"]
