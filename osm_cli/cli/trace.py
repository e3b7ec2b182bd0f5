"""osm trace and osm overflow-demo: a score vector folded block by block, and why naive softmax
overflows. Each command imports the layers it uses when it runs (see common.py: `osm --help`
loads no numpy). Leaves out: computing (reports/trace.py, studies/overflow.py) and the tables
(present/trace.py, present/tables.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from osm_cli.errors import OsmError

from .common import (
    check_outputs,
    emit_json,
    exports,
    guarded,
    need_plot,
    offer_page,
    out,
    page_wanted,
    present,
    save,
)
from .groups import Mods, grouped
from .options import (
    DTYPES_HELP,
    CsvOpt,
    DtypeOpt,
    ExplainOpt,
    Form,
    InputDtypeOpt,
    JsonOpt,
    PrecisionOpt,
    SeedOpt,
    SoftcapOpt,
    StepOpt,
    TileOrder,
    ValuesOpt,
    dtype_names,
)


@guarded
@exports
@grouped
def trace(
    scores: Annotated[
        str | None,
        typer.Argument(help="Scores: text, .csv, .npy/.npz/.safetensors file, or '-' for "
                       "standard input."),
    ] = None,
    values: ValuesOpt = None,
    block: Annotated[int, typer.Option("--block", "-b", min=1, help="Scores per block.")] = 2,
    form: Annotated[Form, typer.Option("--form", help="Update form to show.")] = Form.rescale,
    row: Annotated[int, typer.Option("--row", min=0, help="Row of a matrix to trace.")] = 0,
    show_all: Annotated[bool, typer.Option("--all", help="Show every block and element.")] = False,
    as_json: JsonOpt = False,
    order: Annotated[TileOrder | None, typer.Option(
        "--order", help="Fold the blocks forward, reverse or shuffled (--seed); also reports the "
        "max difference between forward, this order and a pairwise (tree) merge.")] = None,
    seed: SeedOpt = 0,
    rescale_threshold: Annotated[float, typer.Option(
        "--rescale-threshold", min=0.0, metavar="TAU",
        help="Lazy rescale (FA4): move m only when a block max exceeds it by more than TAU, in "
        "natural-log units (FA4's 8 in log2 is 5.545). Rescale form only.")] = 0.0,
    csv: CsvOpt = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", metavar="FILE.png",
        help="Also draw m, l (as l_old·α plus the block's sum) and α per block to a PNG (needs "
        "matplotlib: pip install matplotlib, or '.[plot]' in a clone)."),
    ] = None,
    step: StepOpt = False,
    explain: ExplainOpt = False,
    dtype: DtypeOpt = None,
    precision: PrecisionOpt = None,
    input_dtype: InputDtypeOpt = None,
    softcap: SoftcapOpt = None,
    sink: Annotated[float | None, typer.Option(
        "--sink", help="A sink logit: one more score, of value 0, in the denominator only "
        "(gpt-oss, FA4's learnable_sink).")] = None,
    *,
    mods: Mods,
):
    """Trace online softmax over a score vector, block by block.

    Shows the state (m, α, l) after each block, then every element's probability beside the
    one-shot stabilized and the naive result.

    \b
    Examples:
      osm trace samples/scores.txt --block 2
      osm trace --values "1,2,5,3" -b 2 --form merge
      osm trace --values "1,2,5,3" -b 2 --explain
      osm trace samples/matrix.txt --row 1 --json
      osm trace --values "1,2,5,3" --sink 4 --softcap 3
    """

    from osm_cli import io
    from osm_cli.present import csv as export
    from osm_cli.present import json as documents
    from osm_cli.present import plot as plots
    from osm_cli.present.format import HEAD
    from osm_cli.reports.rules import WHOLE, trace_blocks, trace_mods, trace_options
    from osm_cli.reports.trace import trace_report

    s, name = io.load_scores(scores, values, input_dtype)
    trace_mods(softcap, mods.score_mod)
    s = io.scores_with_mods(s, **mods.keywords())  # row r is q_idx r, position j kv_idx j
    trace_options(s, name, row, form.value, rescale_threshold, dtype, precision,
                  order or rescale_threshold or csv or plot or step)
    need_plot(plot)
    check_outputs(csv=csv, plot=plot)
    blocks = trace_blocks(s, block, page_wanted())
    # the table shows the first and last HEAD steps: a long trace keeps only those (the CSV,
    # JSON, plot, --all, --step and --html make or need every step); up to WHOLE blocks are
    # kept whole, so that the table can show every block where m moved
    whole = show_all or plot or step or page_wanted() or blocks <= WHOLE
    rep = trace_report(s, block, form.value, row=row, order=order and order.value, seed=seed,
                       threshold=rescale_threshold, dtype=dtype,
                       precision=precision and precision.value, keep=None if whole else HEAD,
                       softcap=softcap, sink=sink)
    save((csv, lambda: export.trace_csv_chunks(rep), "step table, CSV"),
         (plot, functools.partial(plots.trace_report_png, rep, name), "m, l and α per block, PNG"))
    if as_json:
        return emit_json(documents.trace_doc(rep))
    show_trace(rep, name, show_all, step, explain)


def show_trace(rep, name: str, show_all: bool, step: bool, explain: bool) -> None:
    """trace's screen: the state after each block (and its arithmetic), one block at a time
    under --step, then the probabilities; the interactive page offered for --html."""
    from osm_cli.present import explain as explained
    from osm_cli.present import page as html_page
    from osm_cli.present import trace as render

    offer_page(lambda screen: html_page.page(html_page.trace_doc(rep, name), screen))
    heads = render.trace_heads(rep, name)
    pages = [(functools.partial(render.step_frame, heads, t, width=out.width), len(t.steps),
              "block") for t in rep.traces]
    step_tables = [render.step_table(t, show_all, out.width) for t in rep.traces]
    if explain:  # each form's table, then its blocks' arithmetic
        step_tables = [x for t, table in zip(rep.traces, step_tables, strict=True)
                       for x in (table, explained.trace_explained(t, show_all))]
    if present(step, heads, pages, step_tables):
        out.print(render.trace_results(rep, show_all, out.width))


@guarded
def overflow_demo(
    values: Annotated[
        list[float] | None, typer.Argument(
            help="Scores to try (default 100 102 99); negative ones and -inf too.")
    ] = None,
    dtype: Annotated[list[str] | None, typer.Option(
        "--dtype", callback=dtype_names,
        help=f"Show only these dtypes (repeatable): {DTYPES_HELP}.")] = None,
):
    """Show why naive softmax overflows and how subtracting the max fixes it.

    For float16, bfloat16, float32 and float64: exp of each value, naive, stabilized and online
    softmax, the overflow threshold ln(max finite) of each, and a fully masked row.

    \b
    Examples:
      osm overflow-demo
      osm overflow-demo 10 11 12
      osm overflow-demo -inf -1 2 --dtype fp16
      osm overflow-demo --dtype e4m3 --dtype e5m2
    """
    import numpy as np

    from osm_cli.present import tables
    from osm_cli.studies.overflow import DEMO_DTYPES
    from osm_cli.studies.overflow import overflow_demo as demo

    xs = values or [100.0, 102.0, 99.0]
    if any(np.isnan(x) or x == np.inf for x in xs):
        raise OsmError("values must be numbers or -inf (a masked score): softmax is undefined "
                       "for NaN and for +inf (inf / inf)")
    dtypes = tuple(dict.fromkeys(dtype)) if dtype else DEMO_DTYPES  # repeated: shown once
    out.print(tables.overflow_report(demo(xs, dtypes), out.width))
