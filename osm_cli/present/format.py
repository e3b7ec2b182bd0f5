"""Number formatting and the table helpers every presenter shares.

Numbers are formatted so the digits that differ are visible and so inf and nan stand out (bold
red; -inf, a mask, in cyan). Long tables show their first and last rows around a ⋮ row. A table
too wide for the terminal gets fewer digits, fewer or narrower columns, or is cut into several
tables (`fit` tries a table's variants in order), never a cut number: every table is this
module's `Table`, whose cells fold rather than end in '…' even where nothing fits.
Leaves out: any particular table (trace.py, attention.py, verdicts.py, tables.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from rich import box
from rich import table as rich_table
from rich.console import Console, Group
from rich.measure import Measurement
from rich.text import Text

VALUES_UP_TO = 8  # step tables list a block's first values only for blocks this small
HEAD = 5  # long tables show the first and last HEAD rows around an ellipsis row


def num(x, digits: int = 8) -> Text:
    """A number as text: `digits` significant digits, inf/nan in bold red, -inf (a mask) dim."""
    if x is None:
        return Text("")
    x = float(x)
    if math.isnan(x):
        return Text("nan", style="bold red")
    if math.isinf(x):
        return Text("inf", style="bold red") if x > 0 else Text("-inf", style="cyan")
    return Text(f"{x:.{digits}g}")


def arrow(a, b, digits: int = 8) -> Text:
    """'a → b', or just 'b' when nothing changed."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return num(b, digits)
    return Text.assemble(num(a, digits), " → ", num(b, digits))


class Table(rich_table.Table):
    """rich's Table, whose columns fold a cell too wide for them onto the next line instead of
    cutting it with '…' (rich's default): the tables choose digits and columns to fit (`fit`),
    and where even the narrowest does not, a number breaks across lines but keeps its digits."""

    def add_column(self, *args, **kwargs) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


def values(xs: np.ndarray, digits: int = 4, most: int = 3, width: int | None = None) -> Text:
    """A short list of values: the first `most` (and, given a width, no more than fit in it;
    at least one), then '…' for the rest. Example: values([1, 2, 3, 4, 5]) -> [1, 2, 3, …]"""
    xs = np.asarray(xs)
    shown = [num(x, digits) for x in xs[:most]]
    while width is not None and len(shown) > 1 and (
            sum(t.cell_len + 2 for t in shown) + (3 if len(xs) > len(shown) else 0) > width):
        shown.pop()
    parts: list = []
    for i, t in enumerate(shown):
        parts += ([", "] if i else []) + [t]
    if len(xs) > len(shown):
        parts.append(", …")
    return Text.assemble("[", *parts, "]")


def elided(n: int, show_all: bool, keep: Iterable[int] = ()) -> list[int | None]:
    """Row indices to show: all, or the first and last HEAD and those in `keep` (rows that must
    not be hidden, such as the steps where m moved), with None for each run left out."""
    if show_all or n <= 2 * HEAD + 2:
        return list(range(n))
    shown = sorted({*range(HEAD), *range(n - HEAD, n), *(i for i in keep if 0 <= i < n)})
    out: list[int | None] = []
    for i in shown:
        if out and out[-1] is not None and i > out[-1] + 1:
            out.append(None)
        out.append(i)
    return out


def fill(table: Table, n: int, row: Callable[[int], Sequence], show_all: bool,
         keep: Iterable[int] | None = None, unit: str = "rows") -> Table:
    """The rows elided(n, show_all, keep) names, a dim '⋮' row for each run left out, and a
    caption that says how many were left out (and, given `keep`, that nothing kept moved)."""
    shown = elided(n, show_all, keep or ())
    for i in shown:
        if i is None:
            table.add_row(*(["⋮"] * len(table.columns)), style="dim")
        else:
            table.add_row(*row(i))
    hidden = n - sum(i is not None for i in shown)
    if hidden:
        why = ", where m did not move" if keep is not None else ""
        table.caption = f"⋮ {hidden} {unit} not shown{why} (--all shows every row)"
        table.caption_justify = "left"
        table.caption_style = "dim"
    return table


def fit(make: Callable, width: int, variants: Sequence = (8, 7, 6, 5),
        part: int | None = 1) -> Group:
    """make(v) for the first of the variants (most digits and columns first) whose table fits
    `width` without wrapping a cell; else the last, the narrowest. The table is the group's
    `part`th renderable, or with part None every table in the group (a table cut into several).

    Only the unwrapped width counts: to fit a table rich narrows its wrappable columns, without
    regard to the longest word in them, and then every column, so a table that is too wide has
    cells folded (this module's Table) where rich's own would cut them with '…'.
    """
    probe = Console(width=10_000)
    for v in variants:
        group = make(v)
        tables = ([group.renderables[part]] if part is not None else
                  [r for r in group.renderables if isinstance(r, rich_table.Table)])
        if all(Measurement.get(probe, probe.options, t).maximum <= width for t in tables):
            break
    return group


def kv_table(rows) -> Table:
    """(label, value) rows, the labels in bold, without a header: summaries and verdicts."""
    t = Table(box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def agreement(label: str, diff: float) -> Text:
    """'label: max |difference| = d': d green when (nearly) 0, yellow when not; inf and nan as
    num shows them."""
    shown = num(diff, 3)
    if math.isfinite(diff):
        shown.style = "green" if diff == 0 or diff < 1e-12 else "yellow"
    return Text.assemble(f"{label}: max |difference| = ", shown)


def pass_fail(passed: bool) -> Text:
    return Text("PASS", style="bold green") if passed else Text("FAIL", style="bold red")


def bytes_text(n: int, binary: bool = False) -> str:
    """A byte count for people: 1.64 GB (1000-based) or, binary, 97 KiB (1024-based)."""
    step, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB")) if binary else (
        1000, ("B", "kB", "MB", "GB", "TB"))
    x = float(n)
    for unit in units:
        if abs(x) < step or unit == units[-1]:
            return f"{int(x)} B" if unit == "B" else f"{x:.3g} {unit}"
        x /= step
    return f"{n} B"  # pragma: no cover
