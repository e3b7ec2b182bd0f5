"""The two consoles the command line prints to: tables on stdout, messages on stderr.

Piped output gets 100 columns (not rich's 80), the width the tables are laid out for.
Leaves out: what is printed.
"""

from __future__ import annotations

import sys

from rich.console import Console


def console(*, stderr: bool = False, record: bool = False) -> Console:
    """The stdout console (or, stderr=True, the stderr one) for one command's run."""
    if stderr:
        return Console(stderr=True, highlight=False)
    return Console(highlight=False, width=None if sys.stdout.isatty() else 100, record=record)


def consoles() -> tuple[Console, Console]:
    """(stdout console, stderr console)."""
    return console(), console(stderr=True)


__all__ = ["console", "consoles"]
