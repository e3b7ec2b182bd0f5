"""What the commands share: the consoles, errors turned into "Error: …" and exit codes, output
files, step mode and the progress bar.

Exit codes: 0 success; 1 bad input ("Error: …" on stderr); 2 bad option values (Typer).
Leaves out: the commands themselves.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import numpy as np
import typer

from osm_cli import io
from osm_cli.errors import OsmError
from osm_cli.present import plot as plots
from osm_cli.present import stepmode
from osm_cli.present.attention import progress_bar
from osm_cli.present.console import consoles
from osm_cli.present.json import dumps

out, err = consoles()


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
    sys.stdout.write(dumps(obj) + "\n")


def need_plot(plot) -> None:
    """--plot asks for matplotlib: say so before any work is done."""
    if plot is not None:
        plots.require_matplotlib()


def save(path: Path, data: str | bytes | np.ndarray, what: str = "") -> None:
    """Write an output file (atomically): text, bytes, or an array as .npy; then say so on
    stderr, on one line whatever the width (scripts read the path back). The line names `what`
    the file holds; for an array, its shape ("wrote o.npy (3, 2)")."""
    if isinstance(data, np.ndarray):
        io.save_npy(path, data)
        about = str(tuple(data.shape))
    else:
        (io.save_text if isinstance(data, str) else io.save_bytes)(path, data)
        about = f"({what})"
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
