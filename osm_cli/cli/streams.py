"""The standard streams as a command finds them: closed, a reader gone away, a full disk, an
encoding without α.

`watched` runs a command's body so that each of these ends in one clean line and the exit code
docs/inputs.md#exit-codes documents: stdout closed before the start, or a write to it failing
(a full disk, /dev/full), "Error: …" and 1; a broken pipe (`osm … | head -1`), nothing at all
and 141 (128 + SIGPIPE, what a shell reports for a program the pipe stopped). Closed standard
input is refused where it is read (io.load). Where stdout or stderr cannot encode what osm
prints (PYTHONIOENCODING=ascii, LC_ALL=C without UTF-8 mode), each character it cannot write is
spelled in ASCII (α as alpha, m⁽ᵏ⁾ as m(k), − as -) through the "osm-ascii" codec error handler,
and rich draws its tables with ASCII lines. Leaves out: the consoles themselves (present/).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import os
import sys

BROKEN_PIPE = 141  # 128 + SIGPIPE (13)
HANDLER = "osm-ascii"

# what osm prints, spelled in ASCII: letters by name, operators as a programmer writes them
SPELLING = {
    "α": "alpha", "Σ": "sum", "τ": "tau", "σ": "sigma", "Δ": "Delta", "Θ": "Theta",
    "·": "*", "−": "-", "–": "-", "—": "-", "…": "...", "×": "x", "≤": "<=", "≥": ">=",
    "‖": "||", "∘": "o", "→": "->", "←": "<-", "⊕": "(+)", "±": "+/-", "⋮": ":", "§": "S",
    "≈": "~", "√": "sqrt", "∞": "inf", "ᵀ": "^T", "⁽": "(", "⁾": ")", "ᵏ": "k", "ⁱ": "i",
    "²": "^2", "³": "^3", "¹": "^1", "⁰": "^0", "⁴": "^4", "⁵": "^5", "⁶": "^6", "⁷": "^7",
    "⁸": "^8", "⁹": "^9", "⁻": "-", "µ": "u", "°": "deg", "✓": "ok", "✗": "x",
}


def spell(exc: UnicodeEncodeError) -> tuple[str | bytes, int]:
    """The codec error handler: ASCII for each character the stream's encoding refused (a "?"
    for one osm does not print itself); the bytes of a file name Python could not decode
    (surrogateescape's lone surrogates) as they were."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start:exc.end]
    if all("\udc80" <= ch <= "\udcff" for ch in text):
        return bytes(ord(ch) - 0xDC00 for ch in text), exc.end
    return "".join(SPELLING.get(ch, "?") for ch in text), exc.end


codecs.register_error(HANDLER, spell)


def ascii_spelled(text: str, encoding: str | None) -> str:
    """text as a stream in `encoding` can carry it (the spellings above where it cannot)."""
    try:
        return text.encode(encoding or "utf-8", HANDLER).decode(encoding or "utf-8")
    except LookupError:  # an encoding Python does not know: ASCII is safe
        return text.encode("ascii", HANDLER).decode("ascii")


_PLAIN = ("strict", "surrogateescape", "backslashreplace")  # Python's own, replaced by spell


class StdoutClosed(Exception):
    """Standard output was closed before the command started."""


def prepare() -> None:
    """Before a command: each standard text stream spells what its encoding cannot carry."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors in _PLAIN:
            with contextlib.suppress(Exception):
                stream.reconfigure(errors=HANDLER)
    if sys.stdout is None:
        raise StdoutClosed


def _silence_stdout() -> None:
    """Point the stdout descriptor at /dev/null, so that Python's own flush at exit, of what is
    still buffered, neither fails again nor prints "Exception ignored"."""
    with contextlib.suppress(Exception):
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


def finish() -> None:
    """After a command: what it printed reaches stdout now, so a failure is seen here."""
    if sys.stdout is not None:
        sys.stdout.flush()


def stream_failure(exc: OSError) -> tuple[str | None, int] | None:
    """(the Error message or None for silence, exit code) for a failed write to a standard
    stream; None for another OSError (a bug, reported as one)."""
    if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
        _silence_stdout()
        return None, BROKEN_PIPE
    if exc.errno in (errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF,
                     errno.EROFS):
        _silence_stdout()
        return f"cannot write to standard output ({exc.strerror or exc})", 1
    return None


__all__ = ["BROKEN_PIPE", "HANDLER", "SPELLING", "StdoutClosed", "ascii_spelled", "finish",
           "prepare", "spell", "stream_failure"]
