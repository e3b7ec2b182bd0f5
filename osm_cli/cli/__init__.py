"""The `osm` command line: typer options in, one call into the layers below, renderables out.

options.py declares the choices and shared options once; common.py holds what every command
shares (consoles, "Error: …" lines and exit codes, output files, step mode, the progress bar),
groups.py the option groups several commands take; trace.py, attention.py, backward.py,
check.py, tools.py and battery.py hold the commands. They are registered here in the order
`osm --help` lists them. A command module imports at its top only typer, the standard library
and the modules beside it; numpy, rich and the layers below are
imported in the command's body, so that `osm --help` starts in a tenth of a second
(tests/api/test_api.py checks it loads neither numpy nor rich; benchmarks/bench_startup.py times
it). Exit codes: 0 success; 1 bad input ("Error: …" on stderr); 2 bad option values (Typer).
"""

from __future__ import annotations

import typer

from . import attention as _attention
from . import backward as _backward
from . import battery as _battery
from . import check as _check
from . import tools as _tools
from . import tour as _tour
from . import trace as _trace
from .options import PLOT_LIMIT, VersionOpt
from .panels import NumbersCommand, PanelledCommand

app = typer.Typer(
    name="osm",
    help="Explore the online softmax at the heart of FlashAttention, step by step.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _osm(version: VersionOpt = False) -> None:
    """Explore the online softmax at the heart of FlashAttention, step by step."""


command = app.command(cls=PanelledCommand)  # options in panels (panels.py)
command(_trace.trace)
command(_attention.attention)
command(_backward.backward)
# Negative scores are arguments here, not options: `osm overflow-demo -inf -1 2` (and an
# unknown option still "No such option": NumbersCommand).
app.command("overflow-demo", cls=NumbersCommand)(_trace.overflow_demo)
command(_tools.merge)
command(_tools.sweep)
command(_tools.cost)
command(_check.check)
command(_battery.battery)
command(_tour.tour)

__all__ = ["PLOT_LIMIT", "app"]
