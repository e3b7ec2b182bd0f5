"""osm backward: dQ, dK, dV of attention by FA2's tiled backward, traced tile by tile for one key
row and one query row. The command imports the layers it uses when it runs (see common.py:
`osm --help` loads no numpy). Leaves out: computing (reports/backward.py) and the tables
(present/backward.py).
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
    kernel_inputs,
    offer_page,
    out,
    page_wanted,
    present,
    progress,
    save,
    score_options,
)
from .options import (
    Align,
    BatchOpt,
    BlockQOpt,
    CausalAlignOpt,
    CausalOpt,
    DtypeOpt,
    ExplainOpt,
    HeadOpt,
    InputDtypeOpt,
    InputSeedOpt,
    JsonOpt,
    KernelOpt,
    Layout,
    LayoutOpt,
    MaskOpt,
    Mma,
    MmaOpt,
    NoReferenceOpt,
    QueryOpt,
    RandomOpt,
    ScaleOpt,
    ShowAllOpt,
    StepOpt,
    WindowOpt,
    csv_option,
)


def _write(name: str, what: str):
    return Annotated[str | None, typer.Option(name, help=f"Write {what} to this .npy.")]


@guarded
@exports
@kernel_inputs
def backward(
    files: Annotated[list[str] | None, typer.Argument(
        help="Q K V DO as four tensor files (.npy, .safetensors), or one .npz or .safetensors "
             "holding q, k, v, do (and optionally the forward's o and lse); without DO (three "
             "files, or a bundle with no do) a seeded one is used.")] = None,
    o_path: Annotated[str | None, typer.Option(
        "--o", help="The forward's saved O (.npy), e.g. a kernel's; give --lse with it.")] = None,
    lse_path: Annotated[str | None, typer.Option(
        "--lse", help="The forward's saved LSE (natural log, .npy); give --o with it.")] = None,
    dq_path: _write("--dq", "dQ") = None,
    dk_path: _write("--dk", "dK") = None,
    dv_path: _write("--dv", "dV") = None,
    causal: CausalOpt = False,
    causal_align: CausalAlignOpt = Align.bottom_right,
    window: WindowOpt = None,
    mask: MaskOpt = None,
    scale: ScaleOpt = None,
    layout: LayoutOpt = Layout.bhnd,
    block_q: BlockQOpt = None,
    block_k: Annotated[int | None, typer.Option(
        "--block-k", min=1, help="Keys per tile (default as attention's; with --dtype FA2's "
        "backward tiles: 128×128 for d <= 64, 64×128 for d <= 128).")] = None,
    dtype: DtypeOpt = None,
    kernel: KernelOpt = None,
    mma: MmaOpt = Mma.blas,
    batch: BatchOpt = 0,
    head: HeadOpt = 0,
    key: Annotated[int, typer.Option(
        "--key", min=0, help="Key row whose dK and dV to trace (in the traced head's kv head).")
    ] = 0,
    query: QueryOpt = None,
    no_reference: NoReferenceOpt = False,
    show_all: ShowAllOpt = False,
    csv: csv_option("both traces") = None,
    input_dtype: InputDtypeOpt = None,
    random: RandomOpt = None,
    seed: InputSeedOpt = 0,
    step: StepOpt = False,
    explain: ExplainOpt = False,
    as_json: JsonOpt = False,
    inputs=None,
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
    from osm_cli.precision.dtypes import round_inputs, shared_narrow
    from osm_cli.precision.model import prepare, storable
    from osm_cli.present import backward as render
    from osm_cli.present import csv as export
    from osm_cli.present import json as documents
    from osm_cli.present import page as html_page
    from osm_cli.reports.backward import backward_report

    check_outputs(dq=dq_path, dk=dk_path, dv=dv_path, csv=csv)
    if (o_path is None) != (lse_path is None):
        raise OsmError("give --o and --lse together (the forward's saved O and LSE), or "
                       "neither (osm runs its own forward)")
    given, made_up = backward_inputs(files, input_dtype, random, seed)
    for name, path in (("out", o_path), ("lse", lse_path)):
        if path is not None:
            given[name] = io.load_array(Path(path), raw_as=input_dtype)
            io.check_real(given[name], path)
    opts = score_options(causal, causal_align, window, mask, scale, layout, inputs, given["q"])
    if opts.packing.active and page_wanted():
        raise OsmError("--html draws one dense head; a varlen or paged batch runs its "
                       "sequences one by one (its traces are in the tables, --csv, --json)")
    # bfloat16 or float8 inputs can only come from a kernel in that dtype: its model
    dtype = dtype or shared_narrow(given["q"], given["k"], given["v"])
    lab, (q, k, v), notes = prepare(dtype, None, None, given["q"], given["k"], given["v"])
    do = given["do"]
    if lab is not None:
        (do,), more = round_inputs({"dO": do}, lab.dtype)
        notes = (*notes, *more)
    with progress() as tick:
        rep = backward_report(
            q, k, v, do, opts, Tiling(block_q=block_q, block_k=block_k), out=given.get("out"),
            lse=given.get("lse"), model=lab, notes=notes, with_reference=not no_reference,
            kernel=kernel and kernel.value, mma=mma.value,
            trace_at=inputs.traced(batch, head, query), trace_key=key, progress=tick)
    res = rep.result

    def stored(x):
        return x if lab is None else storable(lab, x)

    save((dq_path, stored(res.dq), None), (dk_path, stored(res.dk), None),
         (dv_path, stored(res.dv), None),
         (csv, lambda: export.grad_trace_csv(res), "both traces, CSV"))
    if as_json:
        return emit_json(documents.backward_doc(rep))
    offer_page(lambda screen: html_page.page(html_page.backward_doc(rep, q, k, opts), screen))
    for line in made_up:
        out.print(line)
    heads = render.backward_heads(rep)
    tables = [render.key_trace(rep, out.width, show_all)]
    if explain:
        from osm_cli.present.explain import backward_key_explained, backward_query_explained

        tables.append(backward_key_explained(res, show_all))
    tables.append(render.query_trace(rep, out.width, show_all))
    if explain:
        tables.append(backward_query_explained(res, show_all))
    # step mode keeps the summary (its errors give the end away) for after the last tile
    frame = functools.partial(render.backward_step_frame, [], rep, width=out.width)
    pages = [(frame, len(res.key_trace) + len(res.query_trace), "step")]
    if present(step, heads, pages, tables, after=heads):
        out.print(render.backward_results(rep, show_all, out.width))


def backward_inputs(files, raw_as, random, seed):
    """(q, k, v, do and the rest as io.load_backward gives them, lines saying what was made
    up): the files, or --random's Q, K, V; without a dO, a seeded one."""
    from osm_cli import io
    from osm_cli.errors import InputError
    from osm_cli.studies.inputs import parse_shape, random_qkv, seeded_do

    if random is not None and files:
        raise OsmError("give Q K V (DO) files or --random B,H,N,d, not both")
    made: list[str] = []
    if random is not None:
        q, k, v = random_qkv(parse_shape(random), seed)
        given = {"q": q, "k": k, "v": v}
        made.append(f"Q, K, V: standard normal, shape {q.shape}, seed {seed} (--random)")
    elif not files:
        raise typer.BadParameter("give Q K V DO as files (or Q K V, or one .npz), or --random "
                                 "B,H,N,d", param_hint="FILES")
    elif len(files) == 3:
        given = dict(zip("qkv", io.load_qkv(files, raw_as), strict=True))
    else:
        try:
            given = io.load_backward(files, raw_as)
        except InputError as e:
            if len(files) != 1 or "has no array 'do'" not in str(e):
                raise
            given = dict(zip("qkv", io.load_qkv(files, raw_as), strict=True))
    if "do" not in given:
        given["do"] = seeded_do(given["q"], given["v"], seed)
        made.append(f"dO: none given, so a seeded standard-normal one (seed {seed}; --seed "
                    "picks another, or give DO as a file)")
    return given, made
