"""Writing outputs atomically: each file is written to a hidden temporary beside it and renamed
into place, so a failed run never leaves half a file. Leaves out: what is written (present/).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from osm_cli.errors import InputError


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name to write")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_npy(path: Path, arr: np.ndarray) -> None:
    """np.save, atomically."""
    _atomic_write(path, lambda fh: np.save(fh, np.ascontiguousarray(arr), allow_pickle=False))


def save_text(path: Path, text: str) -> None:
    """Write text (UTF-8), atomically."""
    _atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def save_bytes(path: Path, data: bytes) -> None:
    """Write bytes (a PNG, say), atomically."""
    _atomic_write(path, lambda fh: fh.write(data))
