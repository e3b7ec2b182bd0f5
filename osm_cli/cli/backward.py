"""osm backward: dQ, dK, dV of attention by FA2's tiled backward, traced tile by tile for one key
row and one query row. The command imports the layers it uses when it runs (see common.py:
`osm --help` loads no numpy). Leaves out: computing (reports/backward.py) and the tables
(present/backward.py).
"""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from .common import (
    check_outputs,
    emit_json,
    exports,
    guarded,
    offer_page,
    out,
    page_wanted,
    present,
    progress,
    save,
)
from .flags import as_flags
from .groups import Inputs, Model, Mods, Scores, Shown, Traced, grouped, score_options
from .options import (
    BlockQOpt,
    InputDtypeOpt,
    InputSeedOpt,
    JsonOpt,
    NoReferenceOpt,
    RandomOpt,
    csv_option,
)


def _write(name: str, what: str):
    return Annotated[str | None, typer.Option(name, help=f"Write {what} to this .npy.")]


@guarded
@exports
@grouped
def backward(
    files: Annotated[list[str] | None, typer.Argument(
        help="Q K V DO as four tensor files (.npy, .safetensors), or one .npz or .safetensors "
             "holding q, k, v, do (and optionally the forward's o and lse); without DO (three "
             "files, or a bundle with no do) a seeded one is used.")] = None,
    *,
    o_path: Annotated[str | None, typer.Option(
        "--o", help="The forward's saved O (.npy), e.g. a kernel's; give --lse with it.")] = None,
    lse_path: Annotated[str | None, typer.Option(
        "--lse", help="The forward's saved LSE (natural log, .npy); give --o with it.")] = None,
    dq_path: _write("--dq", "dQ") = None,
    dk_path: _write("--dk", "dK") = None,
    dv_path: _write("--dv", "dV") = None,
    scores: Scores,
    block_q: BlockQOpt = None,
    block_k: Annotated[int | None, typer.Option(
        "--block-k", min=1, help="Keys per tile (default as attention's; with --dtype FA2's "
        "backward tiles: 128×128 for d <= 64, 64×128 for d <= 128).")] = None,
    kernel: Model,
    traced: Traced,
    key: Annotated[int, typer.Option(
        "--key", min=0, help="Key row whose dK and dV to trace (in the traced head's kv head).")
    ] = 0,
    no_reference: NoReferenceOpt = False,
    shown: Shown,
    csv: csv_option("both traces") = None,
    input_dtype: InputDtypeOpt = None,
    random: RandomOpt = None,
    seed: InputSeedOpt = 0,
    as_json: JsonOpt = False,
    inputs: Inputs,
    mods: Mods,
):
    """The backward pass of attention: dQ, dK, dV by FA2's Algorithm 2, traced tile by tile.

    P is recomputed from the forward's LSE (osm's own forward, or a kernel's saved O and LSE
    with --o/--lse), D = rowsum(dO ∘ O) once per row, then for each K/V tile (outer) and each
    Q tile (inner): dV_j += Pᵀ·dO_i, dS = P ∘ (dO_i·V_jᵀ − D_i), dQ_i += scale·dS·K_j,
    dK_j += scale·dSᵀ·Q_i. Prints a summary against the float64 closed-form gradients and two
    traces: key row J's dK_j, dV_j over the Q tiles, query row I's dQ_i over the K/V tiles.

    \b
    Examples:
      osm backward samples/q.npy samples/k.npy samples/v.npy samples/do.npy
      osm backward samples/backward_tiny.npz --scale 1 --block-k 1
      osm backward samples/q.npy samples/k.npy samples/v.npy --causal --key 3 --query 5
      osm backward samples/causal.npz --causal --block-q 4 --block-k 2 --query 2 --explain
      osm backward --random 1,2,8,4 --seed 3 --block-k 2
      osm backward samples/backward_tiny.npz --dtype bf16 --kernel fa4
    """
    from osm_cli import io
    from osm_cli.flash.options import Tiling
    from osm_cli.precision.model import prepare_backward, storable
    from osm_cli.present import csv as export
    from osm_cli.present import json as documents
    from osm_cli.reports.backward import backward_report
    from osm_cli.reports.rules import backward_views, saved_forward

    check_outputs(dq=dq_path, dk=dk_path, dv=dv_path, csv=csv)
    saved_forward(o_path, lse_path)
    if random is None and not files:  # a usage error (exit 2), as a missing argument is
        raise typer.BadParameter("give Q K V DO as files (or Q K V, or one .npz), or --random "
                                 "B,H,N,d", param_hint="FILES")
    given, made_up = io.backward_source(files, random, seed, input_dtype, o_path, lse_path)
    opts = score_options(scores, given["q"], inputs, mods)
    backward_views(opts.packing.active, html=page_wanted())
    lab, (q, k, v, do), notes = prepare_backward(kernel.dtype, given)
    with progress() as tick:
        rep = backward_report(
            q, k, v, do, opts, Tiling(block_q=block_q, block_k=block_k), out=given.get("out"),
            lse=given.get("lse"), model=lab, notes=notes, with_reference=not no_reference,
            kernel=kernel.name, mma=kernel.mma_value, trace_at=traced.at(), trace_key=key,
            progress=tick)
    res = rep.result
    save(*((path, storable(lab, x), None) for path, x in
           ((dq_path, res.dq), (dk_path, res.dk), (dv_path, res.dv))),
         (csv, lambda: export.grad_trace_csv(res), "both traces, CSV"))
    if as_json:
        return emit_json(documents.backward_doc(rep))
    for line in made_up:
        out.print(as_flags(line))
    show_backward(rep, q, k, opts, shown)


def show_backward(rep, q, k, opts, shown) -> None:
    """backward's screen: the summary, the key's and the query's traces (and their
    arithmetic), or one step at a time under --step; the page offered for --html."""
    from osm_cli.present import backward as render
    from osm_cli.present import page as html_page

    res = rep.result
    offer_page(lambda screen: html_page.page(html_page.backward_doc(rep, q, k, opts), screen))
    heads = render.backward_heads(rep)
    tables = [render.key_trace(rep, out.width, shown.show_all)]
    if shown.explain:
        from osm_cli.present.explain import backward_key_explained, backward_query_explained

        tables.append(backward_key_explained(res, shown.show_all))
    tables.append(render.query_trace(rep, out.width, shown.show_all))
    if shown.explain:
        tables.append(backward_query_explained(res, shown.show_all))
    # step mode keeps the summary (its errors give the end away) for after the last tile
    frame = functools.partial(render.backward_step_frame, [], rep, width=out.width)
    pages = [(frame, len(res.trace.key_steps) + len(res.trace.steps), "step")]
    if present(shown.step, heads, pages, tables, after=heads):
        out.print(render.backward_results(rep, shown.show_all, out.width))
