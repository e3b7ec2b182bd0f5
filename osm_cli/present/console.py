"""The consoles the command line prints to: tables on stdout, messages on stderr.

Width: COLUMNS when it is set to a sane width (MIN_WIDTH to MAX_WIDTH; anything else is as if
unset), else the terminal's; piped output without COLUMNS gets 100
columns (not rich's 80), the width the tables are laid out for. Output that is not a terminal
carries no trailing whitespace: rich pads each line of a table to the table's width, and a file
or a pipe keeps those spaces. A recording console (record=True, for --svg and --html) keeps
what it printed for `export_svg` / `export_html` and holds the text back until released.
Leaves out: what is printed.
"""

from __future__ import annotations

import errno
import os
import sys

from rich.console import Console

PIPED_WIDTH = 100  # the width tables are laid out for when nothing says otherwise
# COLUMNS outside these is no width (COLUMNS=0 printed every Error line as nothing): unset
MIN_WIDTH, MAX_WIDTH = 20, 1000


def width_from_env(is_terminal: bool) -> int | None:
    """COLUMNS when it is a whole number from MIN_WIDTH to MAX_WIDTH; else None (rich asks the
    terminal) in a terminal, PIPED_WIDTH elsewhere."""
    cols = os.environ.get("COLUMNS", "").strip()
    if cols.isdigit() and MIN_WIDTH <= int(cols) <= MAX_WIDTH:
        return int(cols)
    return None if is_terminal else PIPED_WIDTH


class TrimmedStdout:
    """sys.stdout (as it is at each write: a test's runner swaps it), less the whitespace at the
    end of each line. Spaces at the end of what was written so far are held back until the next
    write shows whether more of the line follows (they are written) or the line ends (dropped)."""

    def __init__(self):
        self._held = ""

    def write(self, text: str) -> int:
        lines = (self._held + text).split("\n")
        last = lines.pop()
        body = last.rstrip(" \t")
        self._held = last[len(body):]
        out = "".join(line.rstrip(" \t") + "\n" for line in lines) + body
        if out:
            sys.stdout.write(out)
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


class Held:
    """A stream that keeps what is written to it until `release` passes it on (to the stream it
    holds for, as that is at release), so that a recorded run's screen can be exported and its
    files written before anything is shown; a failure on the way shows nothing. It answers
    isatty as that stream does, so rich colours and sizes the output as it would there."""

    def __init__(self, target=None):
        self._target = target
        self._pieces: list[str] = []

    def _stream(self):
        return self._target if self._target is not None else sys.stdout

    def write(self, text: str) -> int:
        self._pieces.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self._stream().isatty()

    @property
    def encoding(self) -> str:
        return getattr(self._stream(), "encoding", None) or "utf-8"

    def release(self) -> None:
        stream = self._stream()
        stream.write("".join(self._pieces))
        stream.flush()
        self._pieces = []


class _Console(Console):
    """rich's Console, less its own answer to a broken pipe (SystemExit(1) from deep inside a
    print): the error goes up to the command, which ends silently (cli/streams.py)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def _environ() -> dict[str, str]:
    """The environment rich sizes a console from, less a COLUMNS (or LINES) that is no width."""
    env = dict(os.environ)
    for name in ("COLUMNS", "LINES"):
        value = env.get(name, "").strip()
        if name in env and not (value.isdigit() and MIN_WIDTH <= int(value) <= MAX_WIDTH):
            del env[name]
    return env


def console(*, stderr: bool = False, record: bool = False) -> Console:
    """The stdout console (or, stderr=True, the stderr one) for one command's run. A recording
    console (record=True) keeps what it prints for export_svg / export_html, and holds it back
    until its file's release() (Held)."""
    if stderr:
        tty = sys.stderr is not None and sys.stderr.isatty()
        return _Console(stderr=True, highlight=False, width=width_from_env(tty),
                        _environ=_environ())
    tty = sys.stdout.isatty()
    file = None if tty else TrimmedStdout()
    if record:
        file = Held(file)
    return _Console(highlight=False, width=width_from_env(tty), record=record, file=file,
                    force_terminal=tty if record else None, _environ=_environ())


def as_text(renderable, width: int = PIPED_WIDTH) -> str:
    """What a renderable prints, as plain text (no colour, no trailing whitespace), laid out at
    `width` columns: a report inside an exception's message, say."""
    import io

    c = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False,
                highlight=False, legacy_windows=False)
    c.print(renderable)
    return "\n".join(line.rstrip() for line in c.file.getvalue().splitlines()).strip("\n")


def consoles() -> tuple[Console, Console]:
    """(stdout console, stderr console)."""
    return console(), console(stderr=True)


__all__ = ["PIPED_WIDTH", "Held", "TrimmedStdout", "as_text", "console", "consoles",
           "width_from_env"]
