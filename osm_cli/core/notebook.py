"""The result records as tables in Jupyter: `Notebook`, a mixin that gives a record
`_repr_html_` and `_repr_markdown_` from the small `Table`s its `_tables()` returns, and the
tables of a `Trace` (what `online_softmax` returns).

Written as plain HTML and markdown strings here, at the bottom of the layers: the records live
in core/, flash/ and precision/, which may not import present/ or rich. Each layer describes its
own records (flash/notebook.py: Attention, Backward; precision/notebook.py: CheckReport) with
the same cells as osm's terminal tables: numbers to 8 significant digits (`num`), the state as
"before → after" (`arrow`), a long table's first and last rows around a ⋮ row.
Leaves out: styling (Jupyter's own table style applies), the terminal's tables (present/).

Example: online_softmax(np.array([1., 2., 5., 3.]), 2)._repr_markdown_() holds the row
"| 1 | 2:4 | 5 | 2 → 5 | 0.049787068 | 1.3678794 → 1.203438 |"
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

HEAD = 5  # a long table shows its first and last HEAD rows around a ⋮ row


def num(x, digits: int = 8) -> str:
    """A number as the tables print it: `digits` significant digits; inf, -inf, nan spelt out;
    None as an empty cell."""
    if x is None:
        return ""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def arrow(a, b, digits: int = 8) -> str:
    """'a → b', or 'b' when nothing changed."""
    if a == b or (math.isnan(float(a)) and math.isnan(float(b))):
        return num(b, digits)
    return f"{num(a, digits)} → {num(b, digits)}"


@dataclass(frozen=True)
class Table:
    """A titled table of text cells, numbers right-aligned and the columns in `left` (words)
    left-aligned; with no header, a two-column (label, value) summary, all left-aligned."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""
    left: tuple[int, ...] = ()

    def align(self, j: int) -> str:
        return "left" if not self.header or j in self.left else "right"


def elided(rows: Sequence, unit: str = "rows") -> tuple[list, str]:
    """The first and last HEAD rows around None (the ⋮ row), and a note of how many were left
    out; all of them when there are few."""
    if len(rows) <= 2 * HEAD + 2:
        return list(rows), ""
    return ([*rows[:HEAD], None, *rows[-HEAD:]],
            f"⋮ {len(rows) - 2 * HEAD} {unit} not shown")


def html_tables(tables: Sequence[Table]) -> str:
    """The tables as one HTML fragment, every cell escaped."""
    parts = ['<div class="osm-record">']
    for t in tables:
        parts.append(f"<p><strong>{html.escape(t.title)}</strong></p>")
        parts.append("<table>")
        if t.header:
            parts.append("<thead><tr>" + "".join(
                f'<th style="text-align:{t.align(j)}">{html.escape(h)}</th>'
                for j, h in enumerate(t.header)) + "</tr></thead>")
        parts.append("<tbody>")
        for row in t.rows:
            parts.append("<tr>" + "".join(f'<td style="text-align:{t.align(j)}">'
                                          f"{html.escape(cell)}</td>"
                                          for j, cell in enumerate(row)) + "</tr>")
        parts.append("</tbody></table>")
        if t.note:
            parts.append(f"<p><em>{html.escape(t.note)}</em></p>")
    parts.append("</div>")
    return "\n".join(parts)


def _md(cell: str) -> str:
    return cell.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ") or " "


def markdown_tables(tables: Sequence[Table]) -> str:
    """The tables as markdown (GitHub's pipe tables), cells' '|' escaped."""
    parts = []
    for t in tables:
        header = t.header or ("", "")
        parts.append(f"**{_md(t.title)}**\n")
        parts.append("| " + " | ".join(_md(h) for h in header) + " |")
        parts.append("|" + "|".join("---" if t.align(j) == "left" else "---:"
                                    for j in range(len(header))) + "|")
        parts += ["| " + " | ".join(_md(c) for c in row) + " |" for row in t.rows]
        parts.append(f"\n*{_md(t.note)}*\n" if t.note else "")
    return "\n".join(parts).rstrip("\n") + "\n"


class Notebook:
    """Gives a record `_repr_html_` and `_repr_markdown_` (Jupyter shows the HTML; the markdown
    serves where HTML is not shown) from its `_tables()`."""

    __slots__ = ()

    def _tables(self) -> list[Table]:  # pragma: no cover - each record has its own
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return html_tables(self._tables())

    def _repr_markdown_(self) -> str:
        return markdown_tables(self._tables())


def step_rows(steps: Sequence, digits: int = 8) -> list[tuple[str, ...]]:
    """(block, keys, block max, m, α, l) of each step, a ⋮ row for those left out."""
    shown, _ = elided(steps)
    return [("⋮",) * 6 if s is None else (
        str(s.block), f"{s.start}:{s.stop}", "skipped" if s.masked else num(s.block_max, digits),
        arrow(s.m_prev, s.m, digits), num(s.alpha, digits), arrow(s.l_prev, s.l, digits))
        for s in shown]


def trace_tables(t) -> list[Table]:
    """A `Trace`: its steps (the traced row's), then the row's final m, l and LSE."""
    import numpy as np

    def at(x):
        x = np.ravel(x)
        return x[t.row] if x.size > 1 else x[0]

    n = t.step_count
    steps = Table(f"online softmax, form {t.form}, blocks of {t.block}: row {t.row}, {n} "
                  f"step{'s' if n != 1 else ''}", ("block", "keys", "block max", "m", "α", "l"),
                  tuple(step_rows(t.steps)), elided(t.steps, "blocks")[1] if len(t.steps) == n
                  else f"{len(t.steps)} of {n} steps kept (the first and last)")
    final = Table("final", (), (("m", num(at(t.m), 10)), ("l", num(at(t.l), 10)),
                                ("LSE = m + ln l", num(at(t.lse), 10)),
                                ("rescales", f"{t.rescales} (row, block) steps moved a finite m")))
    return [steps, final]


__all__ = ["Notebook", "Table", "arrow", "elided", "html_tables", "markdown_tables", "num",
           "step_rows", "trace_tables"]
