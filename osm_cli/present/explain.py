"""`--explain` and step mode's arithmetic: under each step, the lines of reports/explain.py
with the step's own numbers, indented under a one-line heading ("block 1, keys 2:4").

Leaves out: the lines themselves (reports/explain.py), the tables they sit under.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from osm_cli.reports.explain import (
    ATTENTION_NOTE,
    BACKWARD_NOTE,
    attention_heading,
    attention_step_lines,
    backward_key_lines,
    backward_query_lines,
    trace_heading,
    trace_lines,
)

from .format import elided


def step_block(heading: str, lines: Sequence[str]) -> Group:
    """A heading in bold, then each line indented by three spaces (a long line wraps there)."""
    return Group(Text(heading, style="bold"), *(Padding(Text(line), (0, 0, 0, 3))
                                                for line in lines))


def trace_step(trace, k: int) -> Group:
    """Block k of an `osm trace` (k indexes trace.steps)."""
    s = trace.steps[k]
    return step_block(trace_heading(s), trace_lines(s, trace.form))


def trace_explained(trace, show_all: bool = False) -> Group:
    """Every block's arithmetic (the first and last few of a long trace, as the table)."""
    parts: list = [Text("each block's arithmetic", style="bold underline")]
    return Group(*parts, *_each(trace.steps, show_all, "blocks",
                                lambda k: trace_step(trace, k)), Text(""))


def _each(steps, show_all: bool, unit: str, one, moved=None,
          why: str = "where m did not move") -> list:
    """one(k) for each step shown: every step where m moved (given: those in `moved`), the
    first and last few, and a dim line saying how many were left out between them (and why)."""
    if moved is None:
        moved = [k for k, s in enumerate(steps) if s.m != s.m_prev]
    shown = elided(len(steps), show_all, moved)
    parts = []
    for n, k in enumerate(shown):
        if k is None:
            gap = shown[n + 1] - shown[n - 1] - 1
            parts.append(Text(f"⋮ {gap} {unit} {why} (--all shows them)".replace("  ", " "),
                              style="dim"))
        else:
            parts.append(one(k))
    return parts


def attention_step(res, k: int) -> Group:
    """K/V tile k of attention's traced row; of several rows (--query 0:4), each row's lines
    under its query (one line when the tile is skipped for all of them)."""
    if len(res.trace.rows) <= 1:
        steps = res.trace.steps
        return step_block(attention_heading(steps[k]), attention_step_lines(steps, k))
    head = attention_heading(res.trace.rows[0][k])
    if all(tr[k].masked for tr in res.trace.rows):
        return step_block(head, ["skipped for every traced row: the mask hides these keys; m, "
                                 "l, O unchanged"])
    parts: list = [Text(head, style="bold")]
    for qi, tr in zip(res.trace.queries, res.trace.rows, strict=True):
        parts.append(Padding(Text(f"query {qi}", style="bold"), (0, 0, 0, 3)))
        parts += [Padding(Text(line), (0, 0, 0, 5)) for line in attention_step_lines(tr, k)]
    return Group(*parts)


def attention_explained(res, show_all: bool = False) -> Group:
    """Every tile's arithmetic for the traced row (or rows)."""
    parts: list = [Text("each tile's arithmetic", style="bold underline"), Text(ATTENTION_NOTE)]
    traces = res.trace.rows if len(res.trace.rows) > 1 else (res.trace.steps,)
    n = min(map(len, traces))
    moved = [k for k in range(n) if any(tr[k].m != tr[k].m_prev for tr in traces)]
    return Group(*parts, *_each(traces[0][:n], show_all, "tiles",
                                lambda k: attention_step(res, k), moved), Text(""))


def backward_key_step(res, k: int) -> Group:
    """Q tile k of backward's traced key (res: a Backward record)."""
    s = res.trace.key_steps[k]
    return step_block(f"Q tile {s.block}, rows {s.start}:{s.stop}",
                      backward_key_lines(s, res.options.softmax_scale, res.trace.key))


def backward_query_step(res, k: int) -> Group:
    """K/V tile k of backward's traced query row; of several rows, each row's lines under its
    query (one line when the tile is skipped for all)."""
    traces = res.trace.rows if len(res.trace.rows) > 1 else (res.trace.steps,)
    s = traces[0][k]
    head = f"K/V tile {s.block}, keys {s.start}:{s.stop}"
    if len(traces) == 1:
        return step_block(head, backward_query_lines(s, res.options.softmax_scale))
    if all(tr[k].masked for tr in traces):
        return step_block(head, ["skipped for every traced row: the mask hides these keys; dQ_i "
                                 "unchanged"])
    parts: list = [Text(head, style="bold")]
    for qi, tr in zip(res.trace.queries, traces, strict=True):
        parts.append(Padding(Text(f"query {qi}", style="bold"), (0, 0, 0, 3)))
        parts += [Padding(Text(line), (0, 0, 0, 5))
                  for line in backward_query_lines(tr[k], res.options.softmax_scale)]
    return Group(*parts)


def backward_key_explained(res, show_all: bool = False) -> Group:
    """Every Q tile's arithmetic for backward's traced key."""
    return Group(Text(f"each Q tile's arithmetic for key {res.trace.key}", style="bold underline"),
                 Text(BACKWARD_NOTE), *_each(res.trace.key_steps, show_all, "Q tiles",
                        lambda k: backward_key_step(res, k), (), ""), Text(""))


def backward_query_explained(res, show_all: bool = False) -> Group:
    """Every K/V tile's arithmetic for backward's traced query row (or rows)."""
    n = len(res.trace.steps)
    return Group(Text("each K/V tile's arithmetic for the traced query row"
                      + ("s" if len(res.trace.rows) > 1 else ""), style="bold underline"),
                 Text(BACKWARD_NOTE), *_each(res.trace.steps[:n], show_all, "K/V tiles",
                        lambda k: backward_query_step(res, k), (), ""), Text(""))


def screen_heading(heading: str, n: int, total: int, prose: str, line: str) -> Group:
    """A tour screen's top: a rule with the heading, the prose, the command about to run."""
    from rich.rule import Rule

    return Group(Rule(Text(f"{heading}  ({n} of {total})", style="bold"), align="left"),
                 Text(prose), Text(f"\n$ osm {line}", style="bold cyan"))


def screen_prompt() -> Text:
    return Text("Enter: next screen · q: stop", style="bold")


__all__ = ["attention_explained", "attention_step", "backward_key_explained",
           "backward_key_step", "backward_query_explained", "backward_query_step",
           "screen_heading", "screen_prompt",
           "step_block", "trace_explained", "trace_step"]
