"""Step mode (`--step`): a step table one block at a time, driven by keys, forward and back.

`frame` builds one frame (the headers, the table up to a step with that row highlighted, the
step's arithmetic, and a hint); `step_through` shows frames on a console it is given until the
user goes past the last or quits. Keys come from a `getkey` callable (click's getchar in a
terminal, a list in tests): Enter, space, n or → shows the next step; b, p or ← the one before;
g or Home the first, G or End the last; q, Esc, Ctrl-C or Ctrl-D stops. Any other key is ignored.
Enter on the last step ends step mode (the caller then prints the summary).
Leaves out: the tables themselves (trace.py, attention.py), the arithmetic (explain.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Group
from rich.text import Text

NEXT = ("\r", "\n", " ", "n", "right")
BACK = ("b", "p", "left")
FIRST = ("g", "home")
LAST = ("G", "end")
QUIT = ("q", "Q", "\x1b", "\x03", "\x04")
# a terminal's escape sequences for the arrow, Home and End keys, as the names above
SEQUENCES = {"\x1b[C": "right", "\x1bOC": "right", "\x1b[D": "left", "\x1bOD": "left",
             "\x1b[H": "home", "\x1bOH": "home", "\x1b[1~": "home", "\x1b[7~": "home",
             "\x1b[F": "end", "\x1bOF": "end", "\x1b[4~": "end", "\x1b[8~": "end"}


def interactive(stdin, stdout) -> bool:
    """Step mode needs a terminal on both sides: keys come in, frames go out."""
    return bool(stdin.isatty() and stdout.isatty())


def buffered(raw: Callable[[], str]) -> Callable[[], str]:
    """One key per call from a reader that may return several at once.

    A terminal read returns whatever was typed ahead ("x " from two quick presses), and an
    arrow key as one escape sequence ("\x1b[C"), which becomes its name ("right"; an escape
    sequence osm has no use for becomes "", ignored, rather than read as Esc). An empty read
    (end of input) quits.
    """
    pending: list[str] = []

    def get() -> str:
        if not pending:
            chunk = raw()
            if len(chunk) > 1 and chunk.startswith("\x1b"):
                return SEQUENCES.get(chunk, "")
            pending.extend(chunk or "q")
        return pending.pop(0)

    return get


def step_through(console, frame: Callable[[int], object], count: int,
                 getkey: Callable[[], str]) -> int:
    """Clear the screen and print frame(k), starting at k = 0 and moving as the keys say, until
    a forward key on the last frame (or a quit key there) or a quit key before it.

    Returns count when the user finished on the last frame, else the 1-based frame they quit on.
    """
    k = 0
    while True:
        console.clear()
        console.print(frame(k))
        while True:
            key = getkey()
            if key in QUIT:
                return count if k == count - 1 else k + 1
            if key in NEXT:
                if k == count - 1:
                    return count
                k += 1
            elif key in BACK and k > 0:
                k -= 1
            elif key in FIRST and k > 0:
                k = 0
            elif key in LAST and k < count - 1:
                k = count - 1
            else:
                continue
            break


__all__ = ["BACK", "FIRST", "LAST", "NEXT", "QUIT", "buffered", "interactive", "step_through"]


def frame(headers: Sequence, steps: Sequence, upto: int, unit: str,
           table: Callable[[Sequence], Group], explained=None, lines: int = 1) -> Group:
    """One step-mode frame: the headers, table(the steps up to `upto`) (a title, then the table,
    whose last `lines` rows, the step's, are highlighted), the step's arithmetic (`explained`)
    and the hint."""
    group = table(steps[: upto + 1])
    for row in group.renderables[1].rows[-lines:]:
        row.style = "reverse"
    extra = [] if explained is None else [Text(""), explained]
    return Group(*headers, *group.renderables, *extra, step_hint(upto, len(steps), unit))


def step_hint(upto: int, n: int, unit: str = "block") -> Text:
    """Where step mode is and which keys move it."""
    if upto + 1 < n:
        back = " · b or ←: back" if upto else ""
        hint = (f"{unit} {upto + 1} of {n} · Enter, space or →: next{back} · g/G: first/last "
                "· q: quit")
    else:
        back = " · b or ←: back · g: first" if n > 1 else ""
        hint = f"{unit} {n} of {n}, the last · Enter: the summary{back} · q: quit"
    return Text(hint, style="bold")
