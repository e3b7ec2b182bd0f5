"""The library's parameter names as the command line's flags: the library words its errors in
parameter names, each in backquotes ("`kernel` fa4 models a 16-bit or FP8 kernel; give
`dtype`"), and the CLI prints them as flags ("--kernel fa4 … give --dtype") through
`as_flags`, one table for every command.

A parameter is its flag with dashes (block_q -> --block-q) unless FLAGS says otherwise; a
parameter given a value the command line spells as a flag of its own (`with_model` False:
--no-model) is in PHRASES.
Leaves out: the options themselves (options.py).

Example: as_flags("`window_size` must be a pair") -> "--window must be a pair"
"""

from __future__ import annotations

import re

# parameter -> flag, where the flag is not the parameter's own name with dashes
FLAGS = {
    "softmax_scale": "--scale",
    "window_size": "--window",
    "learnable_sink": "--sinks",
    "alibi_slopes": "--alibi",
    "attn_mask": "--mask",
    "dout": "--do",
}
# "`parameter` value" -> the flag that sets it so
PHRASES = {
    "`with_model` False": "--no-model",
}
_NAME = re.compile(r"`([a-z][a-z0-9_]*)`")


def flag(name: str) -> str:
    """The flag of a library parameter."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def as_flags(message: str) -> str:
    """A library message with each `parameter` written as the command line's flag."""
    for phrase, spelt in PHRASES.items():
        message = message.replace(phrase, spelt)
    return _NAME.sub(lambda m: flag(m.group(1)), message)


__all__ = ["FLAGS", "PHRASES", "as_flags", "flag"]
