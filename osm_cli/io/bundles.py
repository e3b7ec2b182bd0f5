"""Q, K, V (three files or one bundle), a kernel's tensors from one bundle (.npz or
.safetensors) by name, and osm backward's inputs: out, q, k, v, lse, do, dq, dk, dv, each also
under FlashAttention's and PyTorch's names (TENSOR_NAMES: softmax_lse, dout, o, query, a paged
cache's k_cache and v_cache, …); the kernels' own inputs a bundle may hold (cu_seqlens,
seqused_k, page_table, sinks, ALiBi slopes); and the arrays a bundle holds that osm does not
use (`unused_names`), which a command lists or refuses, never drops silently.
Leaves out: reading one array (load.py), computing anything.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from osm_cli.errors import InputError

from .load import (
    BUNDLE_NAMES,
    check_file,
    check_not_void,
    check_real,
    is_bundle,
    load_array,
    tensor_names,
)

# osm's name -> the names a bundle may give that tensor (osm's own first, then FlashAttention's
# and PyTorch's): flash_attn_func returns (out, softmax_lse, S_dmask); SDPA's autograd says
# grad_out; a paged cache is k_cache and v_cache.
TENSOR_NAMES = {
    "out": ("out", "o", "output", "attn_out"), "q": ("q", "query"), "k": ("k", "key", "k_cache"),
    "v": ("v", "value", "v_cache"), "lse": ("lse", "softmax_lse", "logsumexp"),
    "do": ("do", "dout", "grad_out", "d_out"), "dq": ("dq", "grad_q"), "dk": ("dk", "grad_k"),
    "dv": ("dv", "grad_v"), "dsink": ("dsink", "dlearnable_sink", "grad_sink"),
}


META = "meta"  # a capture's description (capture_kernels.py: a JSON string), not a tensor


def bundle_keys(path: Path, names: list[str] | None = None) -> dict[str, str]:
    """osm's name -> the array that holds it in the bundle at path, for each of TENSOR_NAMES it
    holds; an InputError when two names of one tensor are both there (lse and softmax_lse)."""
    names = tensor_names(path) if names is None else names
    found = {}
    for key, aliases in TENSOR_NAMES.items():
        held = [a for a in aliases if a in names]
        if len(held) > 1:
            raise InputError(f"{path}: holds both {held[0]!r} and {held[1]!r}, two names of "
                             f"{key}; keep one")
        if held:
            found[key] = held[0]
    return found


def unused_names(path: str | Path, used: tuple[str, ...] = BUNDLE_NAMES,
                 inputs: bool = True) -> list[str]:
    """The arrays of a bundle that are none of `used` (osm's names, under any of their
    TENSOR_NAMES) nor, where `inputs`, a kernel input osm reads (INPUT_NAMES); [] for a file
    that is no bundle. Example: unused_names("flash_out.npz") -> ["S_dmask"]"""
    path = Path(path)
    if not is_bundle(path):
        return []
    names = tensor_names(path)
    taken = {a for n in used for a in TENSOR_NAMES.get(n, (n,))}
    if inputs:
        taken |= {a for aliases in INPUT_NAMES.values() for a in aliases}
    taken.add(META)
    return [n for n in names if n not in taken]


def load_bundle(source: str | Path, raw_as: str | None = None,
                need: tuple[str, ...] = ("q", "k", "v")) -> dict[str, np.ndarray]:
    """A kernel's tensors from one .npz or .safetensors, under osm's names: those of
    BUNDLE_NAMES it holds (out, q, k, v, lse, do, dq, dk, dv) under any of their TENSOR_NAMES,
    each checked to be no raw bytes or records; `need` must be there.
    Example: load_bundle("samples/kernel_bf16.npz", need=("out", "q", "k", "v"))
    """
    path = Path(source)
    check_file(path)
    if not is_bundle(path):
        raise InputError(f"{path}: give Q K V as three .npy files, or one .npz with q, k, v "
                         "(.safetensors files too)")
    names = tensor_names(path)
    keys = bundle_keys(path, names)
    missing = [n for n in need if n not in keys]
    if missing:
        also = TENSOR_NAMES[missing[0]][1:]
        raise InputError(f"{path}: has no array {missing[0]!r} (it has "
                         f"{', '.join(names) or 'none'}; a kernel's tensors are named "
                         f"{', '.join(BUNDLE_NAMES)}"
                         + (f"; {missing[0]} may also be {', '.join(also)}" if also else "")
                         + ")")
    bundle = {}
    for key in (n for n in BUNDLE_NAMES if n in keys):
        arr = load_array(path, key=keys[key], raw_as=raw_as)
        check_not_void(arr, f"{path}: {keys[key]}")
        bundle[key] = arr
    return bundle


# a bundle's arrays that are the kernels' own inputs (osm's keyword: the names it reads)
INPUT_NAMES = {"cu_seqlens_q": ("cu_seqlens_q",), "cu_seqlens_k": ("cu_seqlens_k",),
               "seqused_k": ("seqused_k", "cache_seqlens"), "page_table": ("page_table",
                                                                           "block_table"),
               "sinks": ("sinks", "learnable_sink"), "alibi_slopes": ("alibi_slopes",)}


def bundle_inputs(source: str | Path) -> dict[str, np.ndarray]:
    """The kernels' inputs a bundle holds (varlen, paged, sinks, ALiBi), under osm's keyword
    names; {} for a file that is no bundle. Example: bundle_inputs("fa4_varlen_bf16.npz")"""
    path = Path(source)
    if not is_bundle(path):
        return {}
    names = tensor_names(path)
    got = {}
    for key, aliases in INPUT_NAMES.items():
        name = next((a for a in aliases if a in names), None)
        if name is not None:
            arr = load_array(path, key=name, mmap=False)
            check_real(arr, f"{path}: {name}")
            got[key] = arr
    return got


BACKWARD_NAMES = ("do", "out", "lse")  # what osm backward reads of a bundle beyond q, k, v


def load_backward(paths: list[str], raw_as: str | None = None) -> dict[str, np.ndarray]:
    """osm backward's inputs: Q K V DO as four tensor files, or one .npz or .safetensors holding
    q, k, v, do and optionally the forward's o (or out) and lse; a dict with keys q, k, v, do
    (, out, lse). raw_as: the dtype of raw-byte .npy values (load_array)."""
    if len(paths) == 4:
        q, k, v = load_qkv(paths[:3], raw_as)
        do = load_array(Path(paths[3]), raw_as=raw_as)
        check_real(do, paths[3])
        return {"q": q, "k": k, "v": v, "do": do}
    if len(paths) != 1:
        raise InputError(f"expected Q K V DO (four .npy files) or one .npz holding q, k, v, do; "
                         f"got {len(paths)} files")
    q, k, v = load_qkv(paths, raw_as)
    path = Path(paths[0])
    names = set(tensor_names(path))
    keys = bundle_keys(path, sorted(names))
    got = {"q": q, "k": k, "v": v}
    for key in BACKWARD_NAMES:
        name = keys.get(key)
        if name is None:
            continue
        arr = load_array(path, key=name, raw_as=raw_as)
        check_real(arr, f"{path}: {name}")
        got[key] = arr
    if "do" not in got:
        raise InputError(f"{path}: has no array 'do' nor 'dout' (the upstream gradient dO); it has "
                         f"{', '.join(sorted(names))}")
    return got


def load_qkv(paths: list[str], raw_as: str | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V from three tensor files, or from one .npz or .safetensors holding arrays q, k
    and v (records refused here, raw bytes too unless raw_as names their dtype; attention
    checks the dtypes it takes)."""
    if len(paths) == 1:
        bundle = load_bundle(paths[0], raw_as)
        return bundle["q"], bundle["k"], bundle["v"]
    if len(paths) != 3:
        raise InputError(f"expected Q K V (three tensor files) or one .npz / .safetensors with "
                         f"q, k, v; got {len(paths)} files")
    named = [(load_array(Path(p), raw_as=raw_as), p) for p in paths]
    for arr, name in named:
        check_not_void(arr, name)
    return tuple(arr for arr, _ in named)


def load_kernel_tensors(files: list[str], lse: str | None, input_dtype: str | None,
                   grad_files: dict[str, str | None]) -> dict:
    """check's tensors by name (out, q, k, v, and lse, do, dq, dk, dv where given) from BUNDLE,
    OUT Q K V or OUT QKV and the lse, do, dq, dk, dv files, each checked to be real
    numbers; "name" is what the report calls OUT."""
    if len(files) == 1:
        if not is_bundle(Path(files[0])) and Path(files[0]).is_file():
            load_array(Path(files[0]))  # a file cut short or no array file: the loader says so
            raise InputError(f"{files[0]}: one array; check takes BUNDLE (one .npz or "
                             ".safetensors holding out, q, k, v), OUT Q K V or OUT QKV")
        t = dict(load_bundle(files[0], input_dtype, need=("out", "q", "k", "v")))
        name = f"{files[0]}: out"
    elif len(files) in (2, 4):
        o = load_array(Path(files[0]), mmap=False, raw_as=input_dtype)
        t, name = {"out": o}, files[0]
        t["q"], t["k"], t["v"] = load_qkv(files[1:], input_dtype)
    else:
        raise InputError(f"check takes BUNDLE, OUT Q K V or OUT QKV; got {len(files)} files")
    where = {"out": name, **{k: f"{files[0]}: {k}" for k in t if k != "out"}}
    for key, path in {"lse": lse, **grad_files}.items():
        if path is None:
            continue
        if key in t:
            raise InputError(f"{files[0]} holds its own {key}; `{key}` gives another: give one")
        t[key] = load_array(Path(path), mmap=False, raw_as=input_dtype)
        where[key] = path
    for key in ("out", "lse", "do", "dq", "dk", "dv", "dsink"):
        if key in t:
            check_real(t[key], where[key])
    return {**t, "name": name}
