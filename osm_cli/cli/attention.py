"""osm attention: the tiled forward on real Q/K/V traced tile by tile. The command imports the
layers it uses when it runs (see common.py: `osm --help` loads no numpy). Leaves out:
computing (reports/attention.py) and the tables (present/attention.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

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
    progress,
    qkv_inputs,
    save,
)
from .groups import (
    Descales,
    Inputs,
    Model,
    Mods,
    Scores,
    Shown,
    Traced,
    group,
    grouped,
    score_options,
)
from .options import (
    PLOT_LIMIT,
    AccumOpt,
    BlockQOpt,
    CsvOpt,
    InputDtypeOpt,
    JsonOpt,
    MaskedLse,
    NoReferenceOpt,
    PrecisionOpt,
    RandomOpt,
    SeedOpt,
    TileOrder,
    UpdateForm,
)


@group
class Tiles:
    """How attention walks the tiles: their sizes, the update form, the K/V tiles' order,
    split-KV, lazy rescale; and the LSE of a row that sees no key."""

    block_q: BlockQOpt = None
    block_k: Annotated[
        int | None, typer.Option("--block-k", min=1,
                                 help="Keys per tile (default 128 for d <= 64, else 64).")
    ] = None
    masked_lse: Annotated[
        MaskedLse | None, typer.Option("--masked-lse", help="LSE of fully masked rows "
                                       "(default: the kernel's own: fa2 pos-inf, fa4, "
                                       "fa4-sm100 and tiles neg-inf).")
    ] = None
    form: Annotated[
        UpdateForm, typer.Option("--form", help="Update form of the online step.")
    ] = UpdateForm.rescale
    splits: Annotated[
        int | None, typer.Option("--splits", min=1, help="Split-KV: cut K/V into S chunks, run "
                                 "each to (O, LSE), merge, compare with the unsplit run.")
    ] = None
    order: Annotated[
        TileOrder, typer.Option("--order", help="Order to visit the K/V tiles in.")
    ] = TileOrder.forward
    rescale_threshold: Annotated[
        float | None, typer.Option("--rescale-threshold", min=0.0, help="Lazy rescale (FA4): "
                                   "move m only when a tile's max exceeds it by more than τ "
                                   "(natural log; a kernel preset gets τ·log2(e), its log2 "
                                   "units; default 0, fa4-sm100's own 8 log2 units in 16 bit).")
    ] = None

    def tiling(self):
        """flash.options.Tiling of the sizes and the form."""
        from osm_cli.flash.options import Tiling

        return Tiling(block_q=self.block_q, block_k=self.block_k, form=self.form.value)

    def keywords(self) -> dict:
        """reports.attention.attention_report's keywords for the rest."""
        return {"splits": self.splits, "order": self.order.value,
                "rescale_threshold": self.rescale_threshold,
                "masked_lse": self.masked_lse and self.masked_lse.value}


@guarded
@exports
@grouped
def attention(
    files: Annotated[
        list[str] | None, typer.Argument(help="Q K V as .npy/.safetensors/.txt/.csv files, or "
                                         "one .npz or .safetensors holding q, k, v.")
    ] = None,
    *,
    scores: Scores,
    tiles: Tiles,
    traced: Traced,
    out_path: Annotated[str | None, typer.Option("--out", help="Write O to this .npy.")] = None,
    lse_path: Annotated[
        str | None, typer.Option("--lse", help="Write LSE (natural log) to this .npy.")
    ] = None,
    no_reference: NoReferenceOpt = False,
    shown: Shown,
    seed: SeedOpt = 0,
    kernel: Model,
    descales: Descales,
    precision: PrecisionOpt = None,
    accum: AccumOpt = None,
    input_dtype: InputDtypeOpt = None,
    csv: CsvOpt = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", metavar="FILE.png", help="Also draw the traced head's probability matrix (the "
        f"first {PLOT_LIMIT}×{PLOT_LIMIT}), its tile grid and skipped tiles, to a PNG (needs "
        "matplotlib: pip install matplotlib, or '.[plot]' in a clone).")] = None,
    random: RandomOpt = None,
    as_json: JsonOpt = False,
    inputs: Inputs,
    mods: Mods,
):
    """Tiled FlashAttention forward on real Q/K/V tensors, traced tile by tile.

    Shapes (N, d), (H, N, d) or (B, H, N, d); Q's length may differ from K/V's; GQA when Q has a
    multiple of K/V's heads. Prints a summary against a float64 one-shot reference and the trace
    of one query row. bfloat16 or float8 inputs (from .safetensors, or --input-dtype) run as
    --dtype in their own dtype unless --dtype says otherwise.

    \b
    Examples:
      osm attention samples/q.npy samples/k.npy samples/v.npy
      osm attention samples/qkv.npz --causal --query 5 --block-k 4 --explain
      osm attention --random 1,2,16,4 --causal --block-q 4 --block-k 4
      osm attention samples/qkv.npz --out o.npy --lse lse.npy --no-reference
      osm attention samples/qkv.npz --dtype bf16 --block-k 2
      osm attention samples/qkv.npz --dtype bf16 --kernel fa4
    """
    from osm_cli.precision.dtypes import shared_narrow
    from osm_cli.precision.model import prepare
    from osm_cli.present import json as documents
    from osm_cli.reports.attention import attention_report
    from osm_cli.reports.rules import attention_views

    check_outputs(out=out_path, lse=lse_path, csv=csv, plot=plot)
    q, k, v, names = qkv_inputs(files, random, seed, input_dtype)
    opts = score_options(scores, q, inputs, mods)
    views = {"csv": csv is not None, "plot": plot is not None, "step": shown.step,
             "html": page_wanted()}
    attention_views(packed=opts.packing.active, **views)
    # bfloat16 or float8 inputs: that kernel's model
    lab, (q, k, v), notes = prepare(kernel.dtype or shared_narrow(q, k, v),
                                    precision and precision.value, accum and accum.value, q, k, v)
    attention_views(naive=lab is not None and lab.precision == "naive", **views)
    scales = descales.read()
    need_plot(plot)
    with progress() as tick:
        rep = attention_report(
            q, k, v, opts, tiles.tiling(), model=lab, notes=notes, seed=seed,
            with_reference=not no_reference, progress=tick, kernel=kernel.name,
            mma=kernel.mma_value, descale=scales, trace_at=traced.at(), **tiles.keywords())
    save((out_path, rep.stored_out, None), (lse_path, rep.result.lse, None),
         *attention_files(csv, plot, rep.result, q, k, opts, names))
    if as_json:
        return emit_json(documents.attention_doc(rep))
    show_attention(rep, q, k, opts, shown)


def show_attention(rep, q, k, opts, shown) -> None:
    """attention's screen: the summary, the traced row's tiles (and their arithmetic), or one
    tile at a time under --step; the interactive page offered for --html."""
    from osm_cli.present import attention as render
    from osm_cli.present import page as html_page

    res = rep.result
    offer_page(lambda screen: html_page.page(html_page.attention_doc(rep, q, k, opts), screen))
    heads = render.attention_heads(rep)
    # step mode keeps the summary (its errors give the end away) for after the last tile
    frame = functools.partial(render.attention_step_frame, [], res, width=out.width)
    tables = [render.attention_trace(res, out.width, shown.show_all)]
    if shown.explain:
        from osm_cli.present.explain import attention_explained

        tables.append(attention_explained(res, shown.show_all))
    if present(shown.step, heads, [(frame, len(res.trace.steps), "tile")], tables, after=heads):
        out.print(render.attention_results(rep, shown.show_all, out.width))


def attention_files(csv, plot, res, q, k, opts, files) -> list[tuple]:
    """attention --csv and --plot as save() items: the traced row's tile table and the traced
    head's picture (drawn here, before anything is written)."""
    from osm_cli.present import csv as export
    from osm_cli.present import plot as plots
    from osm_cli.studies import tilemap

    b, h, i = res.trace.at
    items = []
    if csv is not None:
        items.append((csv, export.tiles_csv(res), "tile table of the traced row"
                      + ("s" if len(res.trace.queries) > 1 else "") + ", CSV"))
    if plot is not None:
        hm = tilemap.head_probabilities(q, k, batch=b, head=h, rows=PLOT_LIMIT, cols=PLOT_LIMIT,
                                        block_q=res.tiles.block_q, block_k=res.tiles.block_k,
                                        opts=opts)
        png = plots.traced_head_png(hm, files[0] if len(files) == 1 else
                                    ", ".join(Path(f).name for f in files), i)
        items.append((plot, png, f"probability matrix of batch {b}, head {h} with its tiles, PNG"))
    return items
