"""The two consoles the command line prints to: tables on stdout, messages on stderr.

Piped output gets 100 columns (not rich's 80), the width the tables are laid out for.
Leaves out: what is printed.
"""

from __future__ import annotations

import sys

from rich.console import Console


def consoles() -> tuple[Console, Console]:
    """(stdout console, stderr console)."""
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 100)
    return out, Console(stderr=True, highlight=False)


__all__ = ["consoles"]
