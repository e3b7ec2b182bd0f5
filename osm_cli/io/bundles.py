"""Q, K, V (three files or one bundle), a kernel's tensors from one bundle (.npz or
.safetensors) by name, and osm backward's inputs: out, q, k, v, lse, do, dq, dk, dv; a paged
cache's k_cache and v_cache; the kernels' own inputs a bundle may hold (cu_seqlens, seqused_k,
page_table, sinks, ALiBi slopes). Leaves out: reading one array (load.py), computing anything.
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


def load_bundle(source: str | Path, raw_as: str | None = None,
                need: tuple[str, ...] = ("q", "k", "v")) -> dict[str, np.ndarray]:
    """A kernel's tensors from one .npz or .safetensors, by name: those of BUNDLE_NAMES it holds
    (out, q, k, v, lse, do, dq, dk, dv), each checked to be no raw bytes or records; `need`
    must be there. Example: load_bundle("samples/kernel_bf16.npz", need=("out", "q", "k", "v"))
    """
    path = Path(source)
    check_file(path)
    if not is_bundle(path):
        raise InputError(f"{path}: give Q K V as three .npy files, or one .npz with q, k, v "
                         "(.safetensors files too)")
    names = tensor_names(path)
    aliases = {n: a for n, a in ALIASES.items() if n not in names and a in names}
    present = [*names, *aliases]
    missing = [n for n in need if n not in present]
    if missing:
        raise InputError(f"{path}: has no array {missing[0]!r} (it has "
                         f"{', '.join(present) or 'none'}; a kernel's tensors are named "
                         f"{', '.join(BUNDLE_NAMES)})")
    bundle = {}
    for key in (n for n in BUNDLE_NAMES if n in present):
        arr = load_array(path, key=aliases.get(key, key), raw_as=raw_as)
        check_not_void(arr, f"{path}: {key}")
        bundle[key] = arr
    return bundle


ALIASES = {"k": "k_cache", "v": "v_cache"}  # a paged cache's K and V, as FA names them
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


# the names a bundle may give each tensor of the backward (the first is osm's own)
BACKWARD_NAMES = {"do": ("do", "dout", "grad_out"), "out": ("o", "out"), "lse": ("lse",)}


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
    got = {"q": q, "k": k, "v": v}
    for key, aliases in BACKWARD_NAMES.items():
        name = next((a for a in aliases if a in names), None)
        if name is None:
            continue
        arr = load_array(path, key=name, raw_as=raw_as)
        check_real(arr, f"{path}: {name}")
        got[key] = arr
    if "do" not in got:
        raise InputError(f"{path}: has no array 'do' (the upstream gradient dO); it has "
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
    for key in ("out", "lse", "do", "dq", "dk", "dv"):
        if key in t:
            check_real(t[key], where[key])
    return {**t, "name": name}
