"""Reading inputs, with errors a user can act on.

Scores come from text (numbers separated by spaces, commas or newlines; one row per line),
.csv, .npy / .npz / .safetensors (pickles refused, large files memory-mapped), standard input
("-") or an inline string; Q, K, V from three tensor files or one .npz / .safetensors holding
q, k, v (a kernel's bundle: also out, lse, do, dq, dk, dv); masks and split-KV partials from
tensor files. A tensor file is .npy, .npz or .safetensors (tensorfile.py) wherever one is read.
bfloat16 and float8 saved by ml_dtypes to .npy / .npz read back as raw 2- or 1-byte values
(numpy's void kind, |V2 / |V1): `raw_as` (the command line's --input-dtype) names their dtype.
Leaves out: any computation, writing (save.py).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import numpy as np

from osm_cli.errors import InputError, ShapeError

from . import tensorfile

TENSOR_SUFFIXES = (".npy", ".npz", tensorfile.SUFFIX)
BUNDLE_NAMES = ("out", "q", "k", "v", "lse", "do", "dq", "dk", "dv", "dsink")  # a kernel's tensors
_SEP = re.compile(r"[,;\s]+")


def parse_text(text: str, name: str) -> np.ndarray:
    """Numbers from text: one row per non-empty line, separated by spaces, commas or semicolons.

    One line, or lines of one number each, form a single vector (a column of numbers is a
    vector, not an N×1 matrix). '#' starts a comment. Errors name the line and column of a
    bad token.

    Example: parse_text("1, 2\\n3 4", "x") -> [[1, 2], [3, 4]]
    """
    rows: list[list[float]] = []
    lines: list[int] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        content = line.split("#", 1)[0]
        row = []
        for match in re.finditer(r"[^,;\s]+", content):
            token = match.group()
            try:
                row.append(float(token))
            except ValueError:
                raise InputError(
                    f"{name}: line {lineno}, column {match.start() + 1}: "
                    f"{token!r} is not a number"
                ) from None
        if row:
            rows.append(row)
            lines.append(lineno)
    if not rows:
        raise InputError(f"{name}: no numbers found (the input is empty)")
    if len(rows) == 1:
        return np.array(rows[0], dtype=np.float64)
    if all(len(r) == 1 for r in rows):
        return np.array([r[0] for r in rows], dtype=np.float64)
    width = len(rows[0])
    for row, lineno in zip(rows, lines, strict=True):
        if len(row) != width:
            raise InputError(
                f"{name}: line {lineno} has {len(row)} numbers but line {lines[0]} has {width}; "
                "every row of a matrix needs the same length"
            )
    return np.array(rows, dtype=np.float64)


def check_file(path: Path) -> None:
    """Raise InputError unless path is an existing, readable regular file."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a file")


def load_array(path: Path, *, key: str | None = None, mmap: bool = True,
               raw_as: str | None = None) -> np.ndarray:
    """An array from .npy, .npz or .safetensors, refusing pickles; .npy files are memory-mapped.

    An .npz or .safetensors must hold one array, or `key` names the one to take. Anything that
    cannot be read as an array (a garbled header, a member that is not .npy, a pickle) is an
    InputError. Raw 2- or 1-byte values (how ml_dtypes' bfloat16 and float8 save to .npy) are
    viewed as the dtype `raw_as` names ("bf16", "e4m3", …), when it is given.
    """
    check_file(path)
    if tensorfile.is_safetensors(path):
        return tensorfile.tensor(path, key)
    arr = _load_npy(path, key, mmap)
    return view_raw(native_order(arr), f"{path}" + (f": {key}" if key else ""), raw_as)


def native_order(arr: np.ndarray) -> np.ndarray:
    """arr in this machine's byte order, its precision kept (a big-endian float64 stays float64,
    docs/inputs.md#byte-order); an array already native (or of bytes) as it is."""
    if arr.dtype.isnative or arr.dtype.fields is not None:
        return arr
    return arr.astype(arr.dtype.newbyteorder("="))


def view_raw(arr: np.ndarray, name: str, raw_as: str | None) -> np.ndarray:
    """arr as the dtype raw_as names, when arr holds raw bytes of that dtype's size (|V2 as
    bfloat16, say); anything else as it is. Example: view_raw(np.load("q.npy"), "q.npy", "bf16")
    """
    if raw_as is None or arr.dtype.kind != "V" or arr.dtype.fields is not None:
        return arr
    from osm_cli.precision.dtypes import resolve_dtype

    name_of, dt = resolve_dtype(raw_as)
    if dt.itemsize != arr.dtype.itemsize:
        raise InputError(f"{name}: holds raw {arr.dtype.itemsize}-byte values "
                         f"({arr.dtype.str}); `input_dtype` {raw_as} is {dt.itemsize}-byte "
                         f"{name_of}")
    return arr.view(dt)


def _load_npy(path: Path, key: str | None, mmap: bool) -> np.ndarray:
    try:
        if zipfile.is_zipfile(path):
            with np.load(path, allow_pickle=False) as npz:
                names = list(npz.files)
                if key is None and len(names) != 1:
                    raise InputError(
                        f"{path}: holds {len(names)} arrays ({', '.join(names) or 'none'}); "
                        "expected exactly one"
                    )
                chosen = key if key is not None else names[0]
                if chosen not in names:
                    raise InputError(f"{path}: has no array {chosen!r} (it has {', '.join(names)})")
                arr = npz[chosen]
                where = f"{path}: member {chosen!r}"
        else:
            with open(path, "rb") as fh:
                head = fh.read(6)
            if head.startswith(b"PK"):  # a zip without its directory: a copy cut short
                raise InputError(f"{path}: not a valid .npz file (a zip archive without its "
                                 "directory: truncated?)")
            if head != b"\x93NUMPY":  # np.load would take anything else for a pickle
                raise InputError(f"{path}: not a valid .npy/.npz file (it has no NPY header)")
            arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
            where = str(path)
    except (InputError, MemoryError):
        raise
    except ValueError as exc:
        if (raw := _one_byte_npy(path)) is not None:  # float8_e5m2 as ml_dtypes saves it
            return raw
        # mmap refuses object arrays before np.load can say "pickle": both mean the same thing
        if "pickle" in str(exc).lower() or "python objects" in str(exc).lower():
            raise InputError(
                f"{path}: holds Python objects (a pickle); osm only reads plain numeric arrays"
            ) from None
        raise InputError(f"{path}: not a valid .npy/.npz file ({exc})") from None
    except Exception as exc:  # a garbled header (tokenize errors), a bad zip, an unreadable file
        raise InputError(f"{path}: not a valid .npy/.npz file ({type(exc).__name__}: "
                         f"{_short(exc)})") from None
    if not isinstance(arr, np.ndarray):  # np.load returns a member that is not .npy as bytes
        raise InputError(f"{where}: is not an .npy array (an .npz holds .npy files)")
    return arr


def _one_byte_npy(path: Path) -> np.ndarray | None:
    """A .npy whose header says 'f1', a 1-byte float numpy has no type for (ml_dtypes saves
    float8_e5m2 so, and float8_e4m3fn as 'V1'), as raw 1-byte values (|V1), memory-mapped;
    None for any other file."""
    import ast

    try:
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            size = int.from_bytes(fh.read(2 if major == 1 else 4), "little")
            header = ast.literal_eval(fh.read(size).decode("latin1"))
            offset = fh.tell()
        if not (isinstance(header, dict) and str(header.get("descr", ""))[1:] == "f1"):
            return None
        return np.memmap(path, dtype="V1", mode="r", offset=offset, shape=tuple(header["shape"]),
                         order="F" if header.get("fortran_order") else "C")
    except Exception:
        return None


def tensor_names(path: Path) -> list[str]:
    """The arrays an .npz or .safetensors file holds (an .npy holds one, unnamed: [])."""
    check_file(path)
    if tensorfile.is_safetensors(path):
        return tensorfile.names(path)
    if not zipfile.is_zipfile(path):
        return []
    try:
        with np.load(path, allow_pickle=False) as z:
            return list(z.files)
    except Exception as exc:
        raise InputError(f"{path}: not a valid .npz file ({type(exc).__name__}: "
                         f"{_short(exc)})") from None


def is_bundle(path: Path) -> bool:
    """One .npz or .safetensors holding several named tensors (q, k, v, …)."""
    return (zipfile.is_zipfile(path) if Path(path).suffix.lower() != tensorfile.SUFFIX
            else True)


def _short(exc: Exception, most: int = 80) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= most else text[: most - 1] + "…"


def check_real(arr: np.ndarray, name: str) -> None:
    """Refuse arrays that are not real floating point or integer numbers."""
    kind = arr.dtype.kind
    if kind == "O":
        raise InputError(f"{name}: holds Python objects; osm needs a numeric array")
    if kind == "b":
        raise InputError(f"{name}: is a boolean array; osm needs numbers")
    if kind == "c":
        raise InputError(f"{name}: holds complex numbers; osm needs real numbers")
    check_not_void(arr, name)
    if kind not in "fiu" and arr.dtype.name not in ("bfloat16",) and "float8" not in arr.dtype.name:
        raise InputError(f"{name}: has dtype {arr.dtype}; osm needs a numeric array")


def check_not_void(arr: np.ndarray, name: str) -> None:
    """Refuse raw bytes and records (numpy's void kind), which no numeric check can read: a
    bfloat16 or float8 array that ml_dtypes saved reads back as raw 2- or 1-byte values."""
    dt = arr.dtype
    if dt.kind != "V" or dt.name.startswith(("bfloat16", "float8")):
        return
    if dt.fields is None and dt.itemsize == 2:
        raise InputError(
            f"{name}: holds raw 2-byte values ({dt.str}), as ml_dtypes writes bfloat16 to .npy "
            "without its type; pass `input_dtype` bf16 (or fp16) to read them as that, or save "
            "the file as .safetensors or float32"
        )
    if dt.fields is None and dt.itemsize == 1:
        raise InputError(
            f"{name}: holds raw 1-byte values ({dt.str}), as ml_dtypes writes float8 to .npy "
            "without its type; pass `input_dtype` e4m3 (or e5m2) to read them as that, or save "
            "the file as .safetensors or float32"
        )
    raise InputError(f"{name}: has dtype {dt}; osm needs a numeric array")


def _first(bad: np.ndarray) -> str | None:
    """Where the first True of `bad` is, as an error shows it ("3" or "(1, 2)"); None if none."""
    if not bad.any():
        return None
    idx = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    return str(int(idx[0])) if bad.ndim == 1 else "(" + ", ".join(str(int(i)) for i in idx) + ")"


def check_scores(scores: np.ndarray, name: str) -> np.ndarray:
    """Validate a score vector or matrix and return it as float64.

    NaN is refused (softmax of nan is nan, whatever the algorithm); so is +inf, for which
    softmax is undefined (inf / inf). -inf, a masked score, is allowed.
    """
    check_real(scores, name)
    if scores.ndim == 0:
        raise InputError(f"{name}: is a single number (0-d); expected a vector or a matrix")
    if scores.ndim > 2:
        raise InputError(
            f"{name}: has {scores.ndim} dimensions {tuple(scores.shape)}; "
            "expected a vector or a matrix (one row per line)"
        )
    if scores.size == 0:
        raise InputError(f"{name}: is empty {tuple(scores.shape)}; there are no scores")
    out = np.asarray(scores, dtype=np.float64)
    if not _all_below_inf(out):  # else there is no NaN and no +inf: the common case, one pass
        if (at := _first(np.isnan(out))) is not None:
            raise InputError(f"{name}: NaN at index {at}; softmax of NaN is undefined")
        if (at := _first(np.isposinf(out))) is not None:
            raise InputError(
                f"{name}: +inf at index {at}; softmax is undefined for +inf (inf / inf). "
                "Mask a score with -inf"
            )
    return out


CHECK_CHUNK = 1 << 20  # scores checked at once: a huge memory-mapped file needs no huge mask


def _all_below_inf(s: np.ndarray) -> bool:
    """Every score is below +inf (so none is NaN or +inf), checked about CHECK_CHUNK at a time
    (whole rows, or pieces of a longer row), in whatever memory order s has."""
    s2 = s.reshape(1, -1) if s.ndim == 1 else s
    rows, n = s2.shape
    per, width = max(1, CHECK_CHUNK // max(n, 1)), min(n, CHECK_CHUNK)
    return all(bool((s2[r:r + per, a:a + width] < np.inf).all())
               for r in range(0, rows, per) for a in range(0, n, width))


def read_stdin() -> str:
    """Standard input as text (UTF-8, a BOM dropped); InputError when it is closed, unreadable
    or not text."""
    stream = sys.stdin
    if stream is None:
        raise InputError("standard input is closed; give a file or `values` instead of '-'")
    try:
        data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
    except OSError as exc:
        raise InputError(f"standard input cannot be read ({exc.strerror or exc})") from None
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError("standard input is not UTF-8 text") from None


def load_scores(source: str | None, values: str | None = None,
                raw_as: str | None = None) -> tuple[np.ndarray, str]:
    """Scores from a file path, "-" (standard input) or an inline string; (array, display name).
    raw_as: the dtype of raw-byte .npy values (load_array)."""
    if values is not None:
        if source is not None:
            raise InputError("give either a SCORES file or `values`, not both")
        return check_scores(parse_text(values, "--values"), "--values"), "--values"
    if source is None:
        raise InputError("no scores given: pass a file, '-' for standard input, or `values`")
    if source == "-":
        return check_scores(parse_text(read_stdin(), "<stdin>"), "<stdin>"), "<stdin>"
    path = Path(source)
    check_file(path)
    if path.suffix.lower() in TENSOR_SUFFIXES:
        return check_scores(load_array(path, raw_as=raw_as), str(path)), str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # spreadsheets start CSV with a BOM
    except UnicodeDecodeError:
        raise InputError(f"{path}: is not a text file (and not .npy/.npz/.safetensors)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    return check_scores(parse_text(text, str(path)), str(path)), str(path)


def is_qkv(paths: list[str]) -> bool:
    """Three files, or one .npz or .safetensors holding q, k and v: Q/K/V (else, for osm
    sweep, scores)."""
    if len(paths) == 3:
        return True
    if len(paths) != 1 or not Path(paths[0]).is_file():
        return False
    if not paths[0].lower().endswith((".npz", tensorfile.SUFFIX)):
        return False
    try:
        return {"q", "k", "v"} <= set(tensor_names(Path(paths[0])))
    except Exception:  # not a readable file: loading it as scores reports why
        return False


def _float_dtype(dtypes) -> np.dtype:
    """The dtype to write results of inputs of these dtypes in: their common numpy float, else
    float64."""
    kinds = set(dtypes)
    common = np.result_type(*kinds) if all(k.kind == "f" for k in kinds) else np.float64
    return np.dtype(common if common in (np.float16, np.float32, np.float64) else np.float64)


def parse_pair(text: str, name: str) -> tuple[int, int]:
    """'LEFT,RIGHT' as two integers (attention.masks.make_band checks their range)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        pair = int(parts[0]), int(parts[1])
    except ValueError:
        raise InputError(
            f"{name} must be two integers LEFT,RIGHT (e.g. 128,0); got {text!r}"
        ) from None
    return pair


def check_mask(mask: np.ndarray, name: str) -> None:
    """A mask must be boolean (True = attend) or real floats without NaN."""
    if mask.dtype.kind == "b":
        return
    check_real(mask, name)
    if mask.dtype.kind != "f":
        raise InputError(
            f"{name}: has dtype {mask.dtype}; a mask is boolean (True = attend) or float (added)"
        )
    if np.isnan(mask).any():
        raise InputError(f"{name}: holds NaN; a float mask is added to the scores")
    if np.isposinf(mask).any():
        raise InputError(f"{name}: holds +inf; a float mask is added to the scores "
                         "(use -inf to hide a key)")


def load_named(path: str) -> dict:
    """Every array of an .npz file by name (a kernel's block mask, say): an InputError for a
    missing file or one that is not an .npz."""
    file = Path(path)
    check_file(file)
    try:
        with np.load(file, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise InputError(f"{path}: an .npz of named arrays is needed here")
            return {n: z[n] for n in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a readable .npz ({_short(exc)})") from None


def load_function(path: str, name: str):
    """The function `name` of the Python file at `path` (a user's score_mod or mask_mod, run
    as the user's own code): an InputError when the file or the function is not there. A
    `NAME_grad` function beside it, or a `grad` attribute, is its derivative in the score."""
    import importlib.util

    file = Path(path)
    check_file(file)
    spec = importlib.util.spec_from_file_location(f"osm_user_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error is theirs, said in one line
        raise InputError(f"{path}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(n for n, x in vars(module).items() if callable(x) and not n.startswith("_"))
        raise InputError(f"{path} has no function {name!r}"
                         + (f" (it has {', '.join(found)})" if found else ""))
    grad = getattr(module, f"{name}_grad", None)
    if callable(grad) and getattr(fn, "grad", None) is None:
        fn.grad = grad
    return fn


def load_mask(path: str) -> np.ndarray:
    """A --mask file: boolean (True = attend) or float (added to the scores), read into memory."""
    mask = load_array(Path(path), mmap=False)
    check_mask(mask, path)
    return mask


def load_partials(paths: list[Path], raw_as: str | None = None
                  ) -> tuple[list[np.ndarray], list[np.ndarray], tuple]:
    """Split-KV partial results from pairs of files O_0 LSE_0 O_1 LSE_1 …, checked and as float64,
    and the dtypes to write the merged O and LSE in (the files' common float, else float64).

    Each O is a normalised output (…, dv), each LSE has O's shape without the last axis; every
    pair has the same shapes. NaN anywhere and ±inf in an O are refused; an LSE of ±inf marks a
    split with no visible key and is fine.
    """
    if not paths or len(paths) % 2:
        raise InputError(
            f"merge needs pairs of files, O_0 LSE_0 O_1 LSE_1 …; got {len(paths)} file(s)"
        )
    outs, lses, o_dtypes, l_dtypes = [], [], [], []
    for o_path, l_path in zip(paths[0::2], paths[1::2], strict=True):
        o, lse = load_array(Path(o_path), raw_as=raw_as), load_array(Path(l_path), raw_as=raw_as)
        for arr, p in ((o, o_path), (lse, l_path)):
            check_real(arr, str(p))
        o_dtypes.append(o.dtype)
        l_dtypes.append(lse.dtype)
        o = np.asarray(o, dtype=np.float64)
        lse = np.asarray(lse, dtype=np.float64)
        if o.ndim < 1 or o.size == 0:
            raise InputError(f"{o_path}: an output needs a last axis dv of at least 1, {o.shape}")
        for arr, p, what in ((o, o_path, "output"), (lse, l_path, "LSE")):
            if (at := _first(np.isnan(arr))) is not None:
                raise InputError(f"{p}: NaN at index {at}; a partial {what} must not be NaN")
        if (at := _first(np.isinf(o))) is not None:
            raise InputError(f"{o_path}: inf at index {at}; a normalised output is finite")
        if lse.shape != o.shape[:-1]:
            hint = (
                " (the same axes in another order: FlashAttention writes O as (B, N, H, d) but "
                "its LSE as (B, H, N); transpose one)"
                if sorted(lse.shape) == sorted(o.shape[:-1]) else ""
            )
            raise ShapeError(
                f"{l_path}: shape {tuple(lse.shape)} does not fit {o_path} {tuple(o.shape)}; an "
                f"LSE has its output's shape without the last axis, {tuple(o.shape[:-1])}{hint}"
            )
        if outs and o.shape != outs[0].shape:
            raise ShapeError(
                f"{o_path}: shape {tuple(o.shape)} differs from {paths[0]} {tuple(outs[0].shape)};"
                " every split has the same rows and dv"
            )
        outs.append(o)
        lses.append(lse)
    return outs, lses, (_float_dtype(o_dtypes), _float_dtype(l_dtypes))
