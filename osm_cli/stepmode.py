"""Step mode (`--step`): show a step table one block at a time, waiting for a key between blocks.

Part of the command-line layer (it drives a console it is given); the frames themselves come from
render.py and the keys from a `getkey` callable (click's getchar in a terminal, a list in tests).
Enter, space or n shows the next block; q, Esc, Ctrl-C or Ctrl-D stops. Any other key is ignored.
"""

from __future__ import annotations

from collections.abc import Callable

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
