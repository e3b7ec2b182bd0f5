"""What the commands share: the consoles, errors turned into "Error: …" and exit codes, notes,
Q/K/V from files or --random, output files, step mode and the progress bar.

Nothing heavy is imported here at start-up (numpy, rich, the layers below): `osm --help` builds
every command's options from this module and options.py alone, so each helper, and each command
in its body, imports what it needs when it runs.
Exit codes: 0 success; 1 bad input ("Error: …" on stderr); 2 bad option values (Typer).
Leaves out: the commands themselves.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import typer

from osm_cli.errors import OsmError

from .flags import as_flags


class Screen:
    """The stdout (or stderr) console of the command running now, made when it first prints, so
    that it sees that run's terminal, COLUMNS and streams (a test's runner swaps them); every
    command starts with a fresh one (`guarded`). Attribute access goes to the rich Console."""

    def __init__(self, stderr: bool = False):
        self.stderr = stderr
        self.record = False
        self._console = None

    def reset(self, record: bool = False) -> None:
        self._console, self.record = None, record

    def get(self):
        """The rich Console itself (for what checks its type, such as a progress bar)."""
        if self._console is None:
            from osm_cli.present.console import console

            self._console = console(stderr=self.stderr, record=self.record)
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.get(), name)


out, err = Screen(), Screen(stderr=True)


def note(text: str | None) -> None:
    """A library's note (in parameter words) as one "note: …" line on stderr; None: nothing."""
    if text is not None:
        err.print(f"note: {as_flags(text)}", markup=False, soft_wrap=True)


def qkv_inputs(files, random: str | None, seed: int, raw_as: str | None):
    """(q, k, v, names) from Q K V files or --random (io.qkv_source); neither is a usage error
    (exit 2), as a missing argument is."""
    from osm_cli import io

    if random is None and not files:
        raise typer.BadParameter("give Q K V as files (or one .npz), or --random B,H,N,d",
                                 param_hint="FILES")
    q, k, v, names = io.qkv_source(files, random, seed, raw_as)
    return q, k, v, names if random is None else [as_flags(n) for n in names]


def fail(message: str, code: int = 1):
    """Print one 'Error: …' line on stderr and exit."""
    err.print(f"Error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(fn):
    """Turn OsmError into 'Error: …' + exit 1; any other failure too, without a traceback; a
    closed, full or broken standard output into one line or, a broken pipe, silence (streams)."""
    from . import streams

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out.reset()
        err.reset()
        try:
            streams.prepare()
            result = fn(*args, **kwargs)
            streams.finish()
            return result
        except streams.StdoutClosed:
            fail("standard output is closed; osm prints its results there (redirect it to a "
                 "file or /dev/null instead)")
        except OsmError as exc:
            fail(as_flags(str(exc)))  # the library's `parameter` names as flags
        except MemoryError:
            fail("out of memory; try smaller inputs or blocks")
        except (typer.Exit, typer.Abort, typer.BadParameter, KeyboardInterrupt):
            raise  # a usage error (typer.BadParameter) is typer's to report: exit 2
        except Exception as exc:  # a bug in osm: still one line, the traceback on request
            said = streams.stream_failure(exc) if isinstance(exc, OSError) else None
            if said is not None and said[0] is None:
                raise typer.Exit(said[1]) from None  # a broken pipe: nobody is reading
            if said is not None:
                fail(*said)
            if os.environ.get("OSM_DEBUG"):
                raise
            fail(f"internal error: {type(exc).__name__}: {exc} (set OSM_DEBUG=1 for a traceback)")

    return wrapper


def emit_json(obj) -> None:
    """A --json document on stdout, written as it is computed when it is long (as bytes, to
    the text stream's buffer where it has one, by a thread behind the one making it)."""
    from osm_cli.present.stream import write_json

    sys.stdout.flush()
    binary = getattr(sys.stdout, "buffer", None)
    raw = binary.write if binary is not None else (lambda b: sys.stdout.write(bytes(b).decode()))
    from osm_cli.io.behind import Behind

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


def need_plot(plot) -> None:
    """--plot asks for matplotlib: say so before any work is done."""
    if plot is not None:
        from osm_cli.present import plot as plots

        plots.require_matplotlib()


def check_outputs(**paths: Path | str | None) -> None:
    """Before any work: every output option's file can be written, and no two are one file.
    Keywords are the options' names without dashes (out=…, lse=…); None is not asked for."""
    from osm_cli import io

    names = [f"--{name.replace('_', '-')}" for name in paths]
    io.check_destinations([None if p is None else Path(p) for p in paths.values()], names)


_held: list | None = None  # while a command's screen is recorded (exports): its files, unwritten
_page: list | None = None  # while --html is asked for: the page the command offers (offer_page)
# what was printed, as the interactive page's foot holds it (rich's export_html, styles inline)
SCREEN = ('<pre class="screen" style="color:{foreground};background-color:{background}">'
          "<code>{code}</code></pre>")


def save(*items: tuple[Path | str | None, object, str | None]) -> None:
    """Write a command's output files, all or none (io.write_all): each item is (path or None,
    data, what it holds), data text, bytes or an array for .npy, or a function that makes it
    (called only when the path is given). Then say so on stderr, one line a file whatever the
    width (scripts read the path back): "wrote o.npy (3, 2)" for an array, else the `what`; a
    what of None writes the file without a line. While the screen is recorded for --svg or
    --html (`exports`), the files wait to be written with the pictures, all together."""
    import numpy as np

    from osm_cli import io

    items = tuple((Path(p), data() if callable(data) else data, what)
                  for p, data, what in items if p is not None)
    if _held is not None:
        _held.extend(items)
        return
    io.write_all([(path, data) for path, data, _ in items])
    for path, data, what in items:
        if what is not None:
            about = str(tuple(data.shape)) if isinstance(data, np.ndarray) else f"({what})"
            err.print(f"wrote {path} {about}", markup=False, soft_wrap=True)


def page_wanted() -> bool:
    """--html was asked for: the command makes every step that its page shows."""
    return _page is not None


def offer_page(make) -> None:
    """A command's interactive page for --html (present/page.py): make(screen) gives the page's
    text, screen being what was printed as an HTML fragment. Nothing without --html."""
    if _page is not None:
        _page.append(make)


def exports(fn):
    """Give a command --svg FILE and --html FILE: what it prints, exported through rich's
    recording console (export_svg / export_html), for slides and notes; a command that offers
    a page (offer_page: trace, attention, backward) gets its interactive page as the HTML,
    with what was printed at its foot. A command takes them with this one line above its
    definition (under @guarded).

    The screen is recorded and held back; when the command has printed, the pictures and the
    command's other output files (its save() calls) are written together, all or none, and
    then the screen is shown. A command's `as_json` and `step`, where it has them, refuse the
    export: JSON is no screen, and step mode shows one page at a time.
    """
    import inspect

    from .options import HtmlOpt, SvgOpt

    sig = inspect.signature(fn, eval_str=True)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=a)
             for name, a in (("svg", SvgOpt), ("html", HtmlOpt))]

    @functools.wraps(fn)
    def wrapper(*args, svg: Path | None = None, html: Path | None = None, **kwargs):
        global _held, _page
        if svg is None and html is None:
            return fn(*args, **kwargs)
        for flag, name in (("--json", "as_json"), ("--step", "step")):
            if kwargs.get(name):
                raise OsmError(f"--svg and --html export the printed screen; {flag} does not "
                               "combine with them")
        check_outputs(svg=svg, html=html)
        out.reset(record=True)
        _held, _page = [], None if html is None else []
        try:
            result = fn(*args, **kwargs)
            (files, _held), (offered, _page) = (_held, None), (_page, None)
            title = f"osm {fn.__name__.replace('_', '-')}"

            def as_html() -> str:
                if not offered:
                    return out.export_html(clear=False)
                return offered[-1](out.export_html(clear=False, inline_styles=True,
                                                   code_format=SCREEN))

            # HTML first: export_svg clears the recording
            save(*files, (html, as_html, "interactive page, HTML" if offered else
                          "the screen, HTML"),
                 (svg, lambda: out.export_svg(title=title), "the screen, SVG"))
        finally:
            _held = _page = None
        out.file.release()
        return result

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
    wrapper.__annotations__ = {**fn.__annotations__, "svg": SvgOpt, "html": HtmlOpt}
    return wrapper


def present(step: bool, heads: list, pages: list, tables: list, after: Sequence = ()) -> bool:
    """Print the headers, then the tables; or, under --step in a terminal, each page (frame,
    count, unit) one key press at a time, then `after` (a summary the steps would give away).
    False when the user quit early: print nothing more."""
    if step_interactive(step) and all(count for _, count, _ in pages):
        getkey = step_keys()
        for frame, count, unit in pages:
            if not step_frames(frame, count, unit, getkey):
                return False
        for r in after:
            out.print(r)
        return True
    for r in (*heads, *tables):
        out.print(r)
    return True


def step_interactive(step: bool) -> bool:
    """--step in a terminal; asked for elsewhere, say once that the whole table follows."""
    from osm_cli.present import stepmode

    if step and stepmode.interactive(sys.stdin, sys.stdout):
        return True
    if step:
        which = "output" if not sys.stdout.isatty() else "input"
        err.print(f"--step: standard {which} is not a terminal; showing the whole table")
    return False


def step_keys():
    from osm_cli.present import stepmode

    return stepmode.buffered(getkey)


def step_frames(frame, count: int, unit: str, getkey) -> bool:
    """Show frame(k) one key press at a time; False (and a note) when the user quit early."""
    from osm_cli.present import stepmode

    shown = stepmode.step_through(out, frame, count, getkey)
    if shown < count:
        err.print(f"stopped at {unit} {shown} of {count}")
        return False
    return True


def getkey() -> str:
    """One read of the keys pressed, in raw mode. click's getchar enters raw mode with
    TCSAFLUSH, which throws away keys typed while a frame was drawn; TCSANOW keeps them (the
    step loop reads them one at a time, stepmode.buffered)."""
    try:
        import termios
        import tty
    except ImportError:  # no termios (Windows): click's own
        termios = None
    try:
        if termios is None or not sys.stdin.isatty():
            return typer.getchar()
        fd = sys.stdin.fileno()
        old = termios.tcgetattr(fd)
        try:
            tty.setraw(fd, termios.TCSANOW)
            return os.read(fd, 32).decode(sys.stdin.encoding or "utf-8", "replace")
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, old)
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
                from osm_cli.present.attention import progress_bar

                self.bar = progress_bar(err.get())
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
