"""Writing outputs: all of a command's files or none of them.

`write_all` checks every destination first (a file name, not a folder; its folder exists and
can be written; no two outputs on one file), writes each to a hidden temporary beside it
(".NAME.osm-tmp-…"), and only when all are written renames them into place. A failure, Ctrl-C
or SIGTERM on the way removes the temporaries and leaves every destination as it was. A new
file gets the permissions the umask allows (as `open` would give it); a replaced file keeps its
own. Atomic replacement is for regular files (new ones, and symlinks to regular files, whose
link is replaced and target left alone): a character device, FIFO or socket (/dev/null,
/dev/full, a named pipe) and the standard streams (/dev/stdout, /dev/fd/N, /proc/self/fd/N)
are written in place, after every temporary is written and before any is renamed, so that
they are never replaced by a file (docs/inputs.md#output-files). Leaves out: what is written
(present/).

Example: write_all([(Path("o.npy"), out), (Path("lse.npy"), lse)])
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from osm_cli.errors import InputError

_NO_LINKS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", -1)}
TEMP_TAG = ".osm-tmp-"  # in every temporary's name, so a leftover (after SIGKILL) is recognisable


def check_destinations(paths: Sequence[Path | None], names: Sequence[str] | None = None) -> None:
    """InputError unless every path (None: not asked for) can be written as a new or replaced
    file (or, a device or standard stream, written in place), and no two name the same file.
    names, if given, are the options that gave each path ("--out", "--lse"), for the message
    about a file named twice."""
    seen: dict[Path, str] = {}
    for n, path in enumerate(paths):
        if path is None:
            continue
        path = Path(path)
        label = names[n] if names else str(path)
        if in_place(path):  # a device or stream: written where it is, twice if named twice
            _check_in_place(path)
            continue
        key = path.resolve()
        if key in seen:
            raise InputError(f"{seen[key]} and {label} are the same file ({path}); give each its "
                             "own name")
        seen[key] = label
        if path.is_dir():
            raise InputError(f"{path}: is a directory; give a file name to write")
        parent = _folder(path)
        if not parent.is_dir():
            raise InputError(f"{path}: folder {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(f"{path}: folder {parent} is not writable")


_STREAM = re.compile(r"/dev/(stdout|stderr|stdin|fd/\d+)|/proc/(self|thread-self|\d+)/fd/\d+")
_FDS = {"stdin": 0, "stdout": 1, "stderr": 2}


def in_place(path: Path) -> bool:
    """Whether path is written where it is rather than replaced: a standard stream's name, or
    (following links) anything that exists and is not a regular file or a folder."""
    if _stream_fd(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _stream_fd(path: Path) -> int | None:
    """The descriptor a standard stream's name stands for in this process, else None."""
    text = os.path.normpath(str(path))
    if not _STREAM.fullmatch(text):
        return None
    last = text.rsplit("/", 1)[1]
    if text.startswith("/proc/") and text.split("/")[2] not in ("self", "thread-self",
                                                                 str(os.getpid())):
        return None  # another process's descriptor: written through its name
    return _FDS.get(last, int(last) if last.isdigit() else None)


def _check_in_place(path: Path) -> None:
    fd = _stream_fd(path)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise InputError(f"{path}: that stream is closed") from None
    elif not os.access(path, os.W_OK):
        raise InputError(f"{path}: cannot be written (permission denied)")


WRITE = 1 << 17  # bytes a write: on Linux 6.18 (ext4) 128 KiB writes cost the kernel a third
# to a tenth of what 4 MiB ones do (behind.py's Behind has the measurement)


def write_all(items: Sequence[tuple[Path, str | bytes | np.ndarray | Iterable]]) -> None:
    """Write each (path, data): text as UTF-8 (or an iterable of pieces of text or bytes,
    written as they come), bytes as they are, an array as .npy; all or none.

    Each file is written to a temporary beside it; each file it replaces is first kept under a
    second hard link (which also fails, before anything changed, on a file that cannot be
    replaced); then all are renamed into place, and if one rename fails the ones before it are
    put back.
    """
    check_destinations([path for path, _ in items])
    temps: list[tuple[Path, str]] = []
    kept: dict[Path, str] = {}
    done: list[Path] = []
    with _signals_raise():
        try:
            for path, data in items:
                if not in_place(Path(path)):
                    temps.append((Path(path), _write_temp(Path(path), data)))
            for path, data in items:
                if in_place(Path(path)):
                    _write_in_place(Path(path), data)
            for path, _ in temps:
                if path.exists() and (link := _keep(path)) is not None:
                    kept[path] = link
            for path, tmp in temps:
                try:
                    os.replace(tmp, path)
                except OSError as exc:
                    raise InputError(f"{path}: cannot be replaced ({exc.strerror})") from None
                done.append(path)
        except BaseException:
            for path in reversed(done):  # put back what this call replaced or created
                with contextlib.suppress(OSError):
                    if path in kept:
                        os.replace(kept.pop(path), path)
                    else:
                        os.unlink(path)
            raise
        finally:
            for tmp in [tmp for _, tmp in temps] + list(kept.values()):
                with contextlib.suppress(OSError):
                    os.unlink(tmp)  # renamed ones are gone already


def _keep(path: Path) -> str | None:
    """A second hard link to an existing file about to be replaced, so it can be put back."""
    link = os.path.join(_folder(path), f".{path.name}{TEMP_TAG}old-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    try:
        os.link(path, link)
    except OSError as exc:
        if exc.errno in _NO_LINKS:  # a file system without hard links: replace without a backup
            return None
        raise InputError(f"{path}: cannot be replaced ({exc.strerror})") from None
    return link


def save_npy(path: Path, arr: np.ndarray) -> None:
    """np.save, atomically."""
    write_all([(path, arr)])


def save_text(path: Path, text: str) -> None:
    """Write text (UTF-8), atomically."""
    write_all([(path, text)])


def save_bytes(path: Path, data: bytes) -> None:
    """Write bytes (a PNG, say), atomically."""
    write_all([(path, data)])


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _write_temp(path: Path, data) -> str:
    """data written to a new hidden file beside path, with the mode path will have; its name."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_TAG}", dir=_folder(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot write in {_folder(path)} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _mode_for(path))
            _write_data(fh, data)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(f"{path}: cannot write ({exc.strerror})") from None
        raise
    return tmp


def _write_data(fh, data) -> None:
    if isinstance(data, np.ndarray):
        np.save(fh, np.ascontiguousarray(data), allow_pickle=False)
    elif isinstance(data, (str, bytes)):
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    else:  # text (or bytes) made piece by piece (a long trace's CSV)
        for piece in data:
            whole = memoryview(piece.encode("utf-8") if isinstance(piece, str) else piece)
            for at in range(0, len(whole), WRITE):
                fh.write(whole[at:at + WRITE])


def _write_in_place(path: Path, data) -> None:
    """data written into a device, FIFO or standard stream as it is (never truncated, never
    replaced): /dev/full gives "no space left on device"."""
    import sys

    fd = _stream_fd(path)
    try:
        if fd is not None:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()  # what was printed before comes first
            fh = os.fdopen(os.dup(fd), "wb")
        else:
            fh = open(os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0)), "wb")
        with fh:
            _write_data(fh, data)
    except OSError as exc:
        if exc.errno == errno.EPIPE:  # the reader went away, as for a pipe on stdout
            raise BrokenPipeError(exc.errno, exc.strerror) from None
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _mode_for(path: Path) -> int:
    """An existing file's own permissions; for a new file, 0666 less the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextlib.contextmanager
def _signals_raise():
    """While writing, SIGTERM (and SIGHUP) raise SystemExit, so the temporaries are removed as
    for Ctrl-C; the handlers are put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    wanted = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    old = {sig: signal.signal(sig, stop) for sig in wanted}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


__all__ = ["TEMP_TAG", "check_destinations", "in_place", "save_bytes", "save_npy", "save_text",
           "write_all"]
