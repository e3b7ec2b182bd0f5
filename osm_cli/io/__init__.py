"""Files in and out: loading and validating inputs (load.py; .safetensors in tensorfile.py;
bundles of a kernel's tensors in bundles.py; files or seeded tensors in sources.py; option
values naming files in options.py), all-or-nothing writes (save.py), a writer thread for a
long document (behind.py)."""

from .bundles import (
    TENSOR_NAMES,
    bundle_inputs,
    load_backward,
    load_bundle,
    load_kernel_tensors,
    load_qkv,
    unused_names,
)
from .load import (
    BUNDLE_NAMES,
    TENSOR_SUFFIXES,
    check_file,
    check_mask,
    check_not_void,
    check_real,
    check_scores,
    is_bundle,
    is_qkv,
    load_array,
    load_function,
    load_mask,
    load_named,
    load_partials,
    load_scores,
    parse_pair,
    parse_text,
    tensor_names,
    view_raw,
)
from .options import (
    heads_of,
    kernel_inputs,
    read_array,
    read_descales,
    read_mods,
    score_options,
    scores_with_mods,
    with_bundle_inputs,
)
from .save import check_destinations, save_bytes, save_npy, save_text, write_all
from .sources import backward_source, qkv_source

__all__ = [
    "BUNDLE_NAMES", "TENSOR_NAMES", "TENSOR_SUFFIXES", "backward_source", "bundle_inputs",
    "check_destinations", "check_file", "check_mask", "check_not_void", "check_real",
    "check_scores", "heads_of", "is_bundle", "is_qkv", "kernel_inputs", "load_array",
    "load_backward", "load_bundle", "load_function", "load_kernel_tensors", "load_mask",
    "load_named", "load_partials", "load_qkv", "load_scores", "parse_pair", "parse_text",
    "qkv_source", "read_array", "read_descales", "read_mods", "save_bytes", "save_npy",
    "save_text", "score_options", "scores_with_mods", "tensor_names", "unused_names", "view_raw",
    "with_bundle_inputs", "write_all",
]
