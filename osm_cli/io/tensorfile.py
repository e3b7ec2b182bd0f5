"""Reading .safetensors files, the tensor format kernels' tests and checkpoints are saved in.

A .safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype ("BF16", "F8_E4M3", …), shape and byte range, then the raw bytes
(huggingface/safetensors, its README's format section). Tensors are read through the
safetensors package (`safe_open(..., framework="np")`); the float8 formats, which its numpy
path does not map (it looks for numpy.float8_e4m3fn), are read from the header and the bytes
here, memory-mapped, as ml_dtypes' float8_e4m3fn / float8_e5m2. bfloat16 comes back as
ml_dtypes.bfloat16 either way. Every header is first validated by the package's own parser
(`safe_open` checks each entry's dtype, shape and byte range, their overlaps and the file's
length, for every dtype, before a byte of data is read), so a malformed header is one
InputError whatever the tensor's dtype (docs/inputs.md#tensor-files).
Leaves out: checking what the values are (load.py), writing .safetensors.

Example: tensor(Path("kernel.safetensors"), "q").dtype -> bfloat16
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from osm_cli.errors import InputError

SUFFIX = ".safetensors"
# the format's dtype names osm reads through ml_dtypes where the package's numpy path cannot
_RAW = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "BF16": "bfloat16"}


def is_safetensors(path: Path) -> bool:
    return Path(path).suffix.lower() == SUFFIX


def names(path: Path) -> list[str]:
    """The tensors a .safetensors file holds, in its header's order."""
    return list(_header(path)[0])


def tensor(path: Path, key: str | None = None) -> np.ndarray:
    """One tensor: `key`, or the only one the file holds (an InputError names them otherwise)."""
    header, _ = _header(path)
    keys = list(header)
    if key is None and len(keys) != 1:
        raise InputError(f"{path}: holds {len(keys)} tensors ({', '.join(keys) or 'none'}); "
                         "expected exactly one")
    key = keys[0] if key is None else key
    if key not in header:
        raise InputError(f"{path}: has no tensor {key!r} (it has {', '.join(keys) or 'none'})")
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return f.get_tensor(key)
    except Exception as exc:  # a dtype its numpy path does not map (float8), or bad bytes
        if header[key].get("dtype") in _RAW:
            return _raw(path, key)
        raise InputError(f"{path}: tensor {key!r} cannot be read ({type(exc).__name__}: "
                         f"{exc})") from None


def _validate(path: Path) -> None:
    """The safetensors package's own check of the whole header: an InputError for anything it
    refuses (bad JSON, nesting, entries that are no tensor, missing or overlapping offsets,
    shapes whose byte count overflows, a file shorter than its header says)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except SafetensorError as exc:
        why = str(exc).removeprefix("Error while deserializing header: ")
        raise InputError(f"{path}: not a valid .safetensors file ({why[:200]})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except Exception as exc:  # anything else the parser raises is still a bad file
        raise InputError(f"{path}: not a valid .safetensors file ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None


def _header(path: Path) -> tuple[dict, int]:
    """(the header's tensors, without __metadata__; where the data starts), once the package's
    parser has accepted the file."""
    _validate(path)
    try:
        with open(path, "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            if size > 100_000_000:  # the format's own limit on a header
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(fh.read(size))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a valid .safetensors file ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a valid .safetensors file (its header is no table)")
    header.pop("__metadata__", None)
    return header, 8 + size


def _raw(path: Path, key: str) -> np.ndarray:
    """A tensor read from the header and the bytes, memory-mapped, in its ml_dtypes type."""
    from osm_cli.precision.dtypes import DTYPES

    header, start = _header(path)
    entry = header[key]
    dtype = DTYPES[_RAW[entry["dtype"]]]
    shape = tuple(int(n) for n in entry["shape"])
    begin, end = (int(x) for x in entry["data_offsets"])
    if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise InputError(f"{path}: tensor {key!r} has {end - begin} bytes for shape {shape} of "
                         f"{entry['dtype']}")
    if end == begin:
        return np.zeros(shape, dtype=dtype)
    if shape == ():  # np.memmap would give shape (1,)
        with open(path, "rb") as fh:
            fh.seek(start + begin)
            return np.frombuffer(fh.read(dtype.itemsize), dtype=dtype).reshape(())
    try:
        return np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
    except (ValueError, OSError) as exc:  # a byte range past the end of the file
        raise InputError(f"{path}: tensor {key!r} cannot be read ({exc})") from None


__all__ = ["SUFFIX", "is_safetensors", "names", "tensor"]
