"""What the commands share: the consoles, attention's ScoreOptions from the shared options,
errors turned into "Error: …" and exit codes, output files, step mode and the progress bar.

Exit codes: 0 success; 1 bad input ("Error: …" on stderr); 2 bad option values (Typer).
Leaves out: the commands themselves.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import typer

from osm_cli import io
from osm_cli.attention.options import ScoreOptions
from osm_cli.errors import OsmError
from osm_cli.present import plot as plots
from osm_cli.present import stepmode
from osm_cli.present.attention import progress_bar
from osm_cli.present.console import consoles
from osm_cli.present.stream import write_json

out, err = consoles()


def score_options(causal: bool, causal_align, window: str | None, mask: str | None,
                  scale: float | None, layout) -> ScoreOptions:
    """attention's ScoreOptions from the shared options, built once per command; a scale of 0 or
    below is legal, and said to be unusual on stderr."""
    if scale is not None and scale <= 0:
        what = ("makes every score 0: each row averages V over the keys it sees" if scale == 0
                else "is negative: each row favours the keys least like its query")
        err.print(f"note: --scale {scale:g} {what}", markup=False, soft_wrap=True)
    win = None if window is None else io.parse_pair(window, "--window")
    return ScoreOptions(causal=causal, scale=scale, layout=layout.value,
                        causal_align=causal_align.value, window=win,
                        mask=None if mask is None else io.load_mask(mask))


def fail(message: str, code: int = 1):
    """Print one 'Error: …' line on stderr and exit."""
    err.print(f"Error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(fn):
    """Turn OsmError into 'Error: …' + exit 1; any other failure too, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OsmError as exc:
            fail(str(exc))
        except MemoryError:
            fail("out of memory; try smaller inputs or blocks")
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug in osm: still one line, the traceback on request
            if os.environ.get("OSM_DEBUG"):
                raise
            fail(f"internal error: {type(exc).__name__}: {exc} (set OSM_DEBUG=1 for a traceback)")

    return wrapper


def emit_json(obj) -> None:
    """A --json document on stdout, written as it is computed when it is long (as bytes, to
    the text stream's buffer where it has one, by a thread behind the one making it)."""
    sys.stdout.flush()
    binary = getattr(sys.stdout, "buffer", None)
    raw = binary.write if binary is not None else (lambda b: sys.stdout.write(bytes(b).decode()))
    behind = Behind(raw)
    try:
        write_json(obj, behind.write)
        behind.write(b"\n")
    except BaseException:
        behind.abandon()  # an error or Ctrl-C: do not wait for a reader that may never read
        raise
    behind.close()
    if binary is not None:
        binary.flush()


class Behind:
    """write(bytes) done by a thread behind the caller: the kernel's copy of a long document
    into a file overlaps the making of the next piece. Small writes are gathered into one, large
    ones made WRITE bytes at a time (on the machine benchmarks/bench_memory.py ran on, Linux
    6.18 and ext4, the kernel took 0.4-0.5 s to copy 1.6 GB into a file 64 or 128 KiB a write,
    1-3 s 1 MiB a write and 1.5-5 s 4 MiB a write); at most `depth` pieces wait; a failure to
    write is raised in the caller, at its next write or at close()."""

    SMALL = 1 << 16
    WRITE = 1 << 17

    def __init__(self, write, depth: int = 4):
        self._write, self._small = write, bytearray()
        self._queue: queue.Queue = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (piece := self._queue.get()) is not None:
            if self._error is None:
                try:
                    whole = memoryview(piece)
                    for at in range(0, len(whole), self.WRITE):
                        self._write(whole[at:at + self.WRITE])
                except BaseException as exc:  # raised again in the caller
                    self._error = exc

    def write(self, piece) -> None:
        if self._error is not None:
            raise self._error
        if len(piece) < self.SMALL:
            self._small += piece
            if len(self._small) < self.SMALL:
                return
            piece, self._small = bytes(self._small), bytearray()
        elif self._small:
            self._queue.put(bytes(self._small))
            self._small = bytearray()
        self._queue.put(piece)

    def abandon(self) -> None:
        """Stop without waiting: what is queued is dropped (the thread is a daemon)."""
        self._error = self._error or RuntimeError("abandoned")
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def close(self) -> None:
        if self._small:
            self._queue.put(bytes(self._small))
            self._small = bytearray()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def need_plot(plot) -> None:
    """--plot asks for matplotlib: say so before any work is done."""
    if plot is not None:
        plots.require_matplotlib()


def check_outputs(**paths: Path | str | None) -> None:
    """Before any work: every output option's file can be written, and no two are one file.
    Keywords are the options' names without dashes (out=…, lse=…); None is not asked for."""
    names = [f"--{name.replace('_', '-')}" for name in paths]
    io.check_destinations([None if p is None else Path(p) for p in paths.values()], names)


def save(*items: tuple[Path | str | None, object, str | None]) -> None:
    """Write a command's output files, all or none (io.write_all): each item is (path or None,
    data, what it holds), data text, bytes or an array for .npy, or a function that makes it
    (called only when the path is given). Then say so on stderr, one line a file whatever the
    width (scripts read the path back): "wrote o.npy (3, 2)" for an array, else the `what`; a
    what of None writes the file without a line."""
    items = tuple((Path(p), data() if callable(data) else data, what)
                  for p, data, what in items if p is not None)
    io.write_all([(path, data) for path, data, _ in items])
    for path, data, what in items:
        if what is not None:
            about = str(tuple(data.shape)) if isinstance(data, np.ndarray) else f"({what})"
            err.print(f"wrote {path} {about}", markup=False, soft_wrap=True)


def present(step: bool, heads: list, pages: list, tables: list) -> bool:
    """Print the headers, then the tables; or, under --step in a terminal, each page (frame,
    count, unit) one key press at a time. False when the user quit early: print nothing more."""
    if step_interactive(step) and all(count for _, count, _ in pages):
        getkey = step_keys()
        for frame, count, unit in pages:
            if not step_frames(frame, count, unit, getkey):
                return False
        return True
    for r in (*heads, *tables):
        out.print(r)
    return True


def step_interactive(step: bool) -> bool:
    """--step in a terminal; asked for elsewhere, say once that the whole table follows."""
    if step and stepmode.interactive(sys.stdin, sys.stdout):
        return True
    if step:
        which = "output" if not sys.stdout.isatty() else "input"
        err.print(f"--step: standard {which} is not a terminal; showing the whole table")
    return False


def step_keys():
    return stepmode.buffered(getkey)


def step_frames(frame, count: int, unit: str, getkey) -> bool:
    """Show frame(k) one key press at a time; False (and a note) when the user quit early."""
    shown = stepmode.step_through(out, frame, count, getkey)
    if shown < count:
        err.print(f"stopped at {unit} {shown} of {count}")
        return False
    return True


def getkey() -> str:
    try:
        return typer.getchar()
    except (KeyboardInterrupt, EOFError):
        return "q"


class progress:
    """A rich progress bar on stderr for runs over about a second, only on a terminal."""

    def __enter__(self):
        self.bar = None
        if not err.is_terminal:
            return None
        start = time.monotonic()

        def tick(done, total):
            if self.bar is None and time.monotonic() - start > 1.0 and done < total:
                self.bar = progress_bar(err)
                self.bar.start()
                self.task = self.bar.add_task("attention", total=total)
            if self.bar is not None:
                self.bar.update(self.task, completed=done)
            if self.bar is not None and done >= total:  # the run is over; its checks are not
                self.bar.stop()
                self.bar = None

        return tick

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
