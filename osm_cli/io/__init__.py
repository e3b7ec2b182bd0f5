"""Files in and out: loading and validating inputs (load.py), all-or-nothing writes (save.py)."""

from .load import (
    check_file,
    check_mask,
    check_not_void,
    check_real,
    check_scores,
    is_qkv,
    load_array,
    load_backward,
    load_mask,
    load_partials,
    load_qkv,
    load_scores,
    parse_pair,
    parse_text,
)
from .save import check_destinations, save_bytes, save_npy, save_text, write_all

__all__ = [
    "check_destinations", "check_file", "check_mask", "check_not_void", "check_real",
    "check_scores", "is_qkv", "load_array", "load_backward", "load_mask", "load_partials",
    "load_qkv", "load_scores", "parse_pair", "parse_text", "save_bytes", "save_npy", "save_text",
    "write_all",
]
