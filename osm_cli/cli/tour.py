"""osm tour: a guided walk through online softmax in the order of the teaching notes, one
screen at a time in a terminal (Enter for the next, q to stop), all of it when piped.

Each screen is a few sentences and one osm command, run here through the same app as typed
(nothing on a screen is written by hand but the prose). Leaves out: the commands themselves.
"""

from __future__ import annotations

import sys

import typer

from .common import guarded, out

# (heading, what to look at, the osm command that shows it)
SCREENS = (
    ("1. Why softmax needs the max",
     "exp(102) does not fit in float32, so naive softmax of [100, 102, 99] is inf / inf = NaN. "
     "Subtracting the max m first keeps every exponent ≤ 0 and changes nothing else.",
     "overflow-demo --dtype fp32"),
    ("2. The running pair (m, l): blocks [2, 4] then [1, 3]",
     "Online softmax keeps the max m and the sum l = Σ exp(s − m) of the scores so far. The "
     "second block's max 3 is below m = 4, so the scale factor α = exp(m_old − m_new) is 1 "
     "and l just grows.",
     "trace --values 2,4,1,3 -b 2 --explain"),
    ("3. When the max moves: blocks [1, 2] then [5, 3]",
     "5 > 2: what was summed against m = 2 is rescaled by α = exp(2 − 5) before the new terms "
     "are added against m = 5. The result equals the one-shot softmax.",
     "trace --values 1,2,5,3 -b 2 --explain"),
    ("4. A row with every score masked, and the guard",
     "All −inf: m stays −inf and l = 0. The textbook stabilized form would compute "
     "(−inf) − (−inf) = NaN; the online form's guard subtracts 0 instead and gives 0, as "
     "FlashAttention kernels do.",
     "trace --values=-inf,-inf,-inf -b 2 --explain"),
    ("5. Attention: the third state O, with t ≠ s",
     "One query (t = 1) against two keys (s = 2), one key per tile. Beside m and l the kernel "
     "carries O = Σ exp(s − m)·V, rescaled by the same α; the output is O / l at the end.",
     "attention samples/backward_tiny.npz --scale 1 --block-k 1 --explain"),
    ("6. A causal mask: skipped tiles",
     "Query 2 sees keys 0–2 only. Tiles whose keys are all in the future are skipped, not "
     "computed: m, l and O stay as they were.",
     "attention samples/causal.npz --causal --head 1 --query 2 --block-q 4 --block-k 2 "
     "--explain"),
    ("7. bf16: the same steps, rounded",
     "A kernel holds scores in bf16 and m, α, l in float32, and rounds p to bf16. The error "
     "is counted in ulps: units in the last place of bf16 at that value.",
     "trace --values 2,4,1,3 -b 2 --dtype bf16"),
    ("8. One backward step",
     "The backward recomputes P = exp(S − LSE), then per K/V tile dS = P∘(dP − D) with "
     "D = rowsum(dO∘O), and accumulates dQ, dK, dV; they match the one-shot gradients.",
     "backward samples/backward_tiny.npz --scale 1 --block-k 1"),
)


@guarded
def tour(
    screen: int = typer.Option(1, "--screen", min=1, max=len(SCREENS),
                               help="Start at this screen."),
):
    """A guided walk through online softmax, one screen at a time.

    In a terminal: Enter (or space) for the next screen, q to stop. Piped, every screen is
    printed one after the other. Each screen runs one osm command; run it yourself to explore.

    \b
    Examples:
      osm tour
      osm tour --screen 5
      osm tour --screen 8
    """
    import shlex

    from osm_cli.present.explain import screen_heading, screen_prompt

    from .common import getkey

    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    command = typer.main.get_command(_app())
    for n, (heading, prose, line) in enumerate(SCREENS[screen - 1:], start=screen):
        if interactive:
            out.clear()
        out.print(screen_heading(heading, n, len(SCREENS), prose, line))
        command.main(args=shlex.split(line), prog_name="osm", standalone_mode=False)
        if interactive and n < len(SCREENS):
            out.print(screen_prompt())
            while (key := getkey()) not in ("\r", "\n", " ", "q", "Q", "\x1b"):
                pass
            if key not in ("\r", "\n", " "):
                return
        elif n < len(SCREENS):
            out.print()


def _app():
    from . import app

    return app


__all__ = ["SCREENS", "tour"]
