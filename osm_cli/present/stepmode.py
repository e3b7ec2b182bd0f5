"""Step mode (`--step`): show a step table one block at a time, waiting for a key between blocks.

`frame` builds one frame (the headers, the table up to a step with that row highlighted, and a
hint); `step_through` shows frames on a console it is given until the table ends or the user
quits. Keys come from a `getkey` callable (click's getchar in a terminal, a list in tests): Enter,
space or n shows the next block; q, Esc, Ctrl-C or Ctrl-D stops. Any other key is ignored.
Leaves out: the tables themselves (trace.py, attention.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Group
from rich.text import Text

NEXT = ("\r", "\n", " ", "n")
QUIT = ("q", "Q", "\x1b", "\x03", "\x04")


def interactive(stdin, stdout) -> bool:
    """Step mode needs a terminal on both sides: keys come in, frames go out."""
    return bool(stdin.isatty() and stdout.isatty())


def buffered(raw: Callable[[], str]) -> Callable[[], str]:
    """One key per call from a reader that may return several at once.

    A terminal read returns whatever was typed ahead ("x " from two quick presses), and an
    arrow key as one escape sequence ("\x1b[A"), which is ignored rather than read as Esc.
    An empty read (end of input) quits.
    """
    pending: list[str] = []

    def get() -> str:
        if not pending:
            chunk = raw()
            if len(chunk) > 1 and chunk.startswith("\x1b"):
                return ""
            pending.extend(chunk or "q")
        return pending.pop(0)

    return get


def step_through(console, frame: Callable[[int], object], count: int,
                 getkey: Callable[[], str]) -> int:
    """Clear the screen and print frame(k) for k = 0, 1, … until the last or a quit key.

    Returns how many frames were shown before a quit (count when every block was shown).
    """
    for k in range(count):
        console.clear()
        console.print(frame(k))
        if k == count - 1:
            return count
        while True:
            key = getkey()
            if key in QUIT:
                return k + 1
            if key in NEXT:
                break
    return count


__all__ = ["NEXT", "QUIT", "buffered", "interactive", "step_through"]


def frame(headers: Sequence, steps: Sequence, upto: int, unit: str,
           table: Callable[[Sequence], Group]) -> Group:
    """One step-mode frame: the headers, table(the steps up to `upto`) (a title, then the table,
    whose last row is highlighted) and the hint."""
    group = table(steps[: upto + 1])
    group.renderables[1].rows[-1].style = "reverse"
    return Group(*headers, *group.renderables, step_hint(upto, len(steps), unit))


def step_hint(upto: int, n: int, unit: str = "block") -> Text:
    """Where step mode is and which keys move it on."""
    hint = (
        f"{unit} {upto + 1} of {n} · Enter or space: next {unit} · q: quit"
        if upto + 1 < n else f"{unit} {n} of {n}: done"
    )
    return Text(hint, style="bold")
