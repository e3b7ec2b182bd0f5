"""osm merge, osm sweep and osm cost: split-KV partials merged, block sizes swept against the
FA1 cost model, and the cost model for one shape. Each command imports the layers it uses when
it runs (see common.py: `osm --help` loads no numpy). Leaves out: computing (reports/merge.py,
studies/sweep.py, studies/costmodel.py) and the tables (present/tables.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from osm_cli.errors import OsmError

from .common import (
    KernelInputs,
    check_outputs,
    emit_json,
    guarded,
    need_plot,
    out,
    save,
    score_options,
)
from .options import (
    AccumDtype,
    Align,
    BlockQOpt,
    CausalAlignOpt,
    CausalOpt,
    DtypeOpt,
    InputDtypeOpt,
    JsonOpt,
    KernelOpt,
    Layout,
    LayoutOpt,
    LseBase,
    MaskModOpt,
    MaskOpt,
    Mma,
    MmaOpt,
    ScaleOpt,
    ScoreModOpt,
    SweepCsvOpt,
    ValuesOpt,
    WindowOpt,
    block_list,
    size,
)


@guarded
def merge(
    files: Annotated[list[Path], typer.Argument(
        help="Pairs O_0 LSE_0 O_1 LSE_1 …: normalised partial outputs (…, dv) and their LSEs "
        "(…), as .npy, or one-array .npz or .safetensors files.", show_default=False,
        metavar="O_0 LSE_0 O_1 LSE_1 ...")],
    out_path: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE.npy", help="Write the merged O here.")] = None,
    lse_path: Annotated[Path | None, typer.Option(
        "--lse", metavar="FILE.npy", help="Write the merged LSE here (in the input's base).")
    ] = None,
    lse_base: Annotated[LseBase, typer.Option(
        "--lse-base", help="Base of the LSE files: e (FlashAttention, PyTorch) or 2 (FlashInfer).")
    ] = LseBase.e,
    row: Annotated[int, typer.Option(
        "--row", min=0, help="Row to show in detail (flat index over O's leading axes).")] = 0,
    input_dtype: InputDtypeOpt = None,
    as_json: JsonOpt = False,
):
    """Merge split-KV partial results (O_s, LSE_s) into one, as Flash-Decoding does.

    L = logsumexp over s of LSE_s and O = Σ exp(LSE_s − L)·O_s. A split with LSE -inf (or +inf,
    FA2's marker for a split without keys) has weight 0; a row empty in every split gets O = 0 and
    LSE = -inf, never NaN. Outputs keep the inputs' float dtype.

    \b
    Examples:
      osm merge samples/partials/o0.npy samples/partials/lse0.npy samples/partials/o1.npy samples/partials/lse1.npy
      osm merge samples/partials/o0.npy samples/partials/lse0.npy samples/partials/o1.npy samples/partials/lse1.npy --out o.npy --lse lse.npy
    """  # noqa: E501 (examples run as written, one a line)
    from osm_cli import io
    from osm_cli.present import json as documents
    from osm_cli.present import tables as render
    from osm_cli.reports.merge import merge_report

    check_outputs(out=out_path, lse=lse_path)
    outs, lses, (out_dtype, lse_dtype) = io.load_partials(files, input_dtype)
    rep = merge_report(outs, lses, lse_base.value, row)
    save((out_path, rep.merged.out.astype(out_dtype), ""),
         (lse_path, rep.merged.lse.astype(lse_dtype), ""))
    if as_json:
        return emit_json(documents.merge_doc(files, rep))
    names = [(str(o), str(lse)) for o, lse in zip(files[0::2], files[1::2], strict=True)]
    out.print(render.merge_table(names, rep, out.width))


@guarded
def sweep(
    files: Annotated[list[str] | None, typer.Argument(
        help="Scores (text, .csv, .npy/.npz/.safetensors file, or '-' for standard input), or Q "
        "K V as three tensor files or one .npz or .safetensors holding q, k, v.",
        metavar="SCORES | Q K V")] = None,
    values: ValuesOpt = None,
    blocks: Annotated[str, typer.Option(
        "--blocks", callback=block_list, help="Block sizes (keys per block; block_k for Q/K/V), "
        "comma separated.")
    ] = "16,32,64,128,256",
    sram: Annotated[str, typer.Option(
        "--sram", callback=size, help="SRAM for the model: 192KiB (A100), 228KiB (H100); "
        "KiB/MiB 1024-based, KB/MB 1000-based.")] = "192KiB",
    head_dim: Annotated[int | None, typer.Option(
        "--head-dim", "-d", min=1, help="Head dim d for the model of scores (default 64; Q/K/V "
        "carry their own).")] = None,
    block_q: BlockQOpt = None,
    dtype_bytes: Annotated[int, typer.Option(
        "--dtype-bytes", min=1, help="Bytes per element in HBM and SRAM (2: fp16/bf16).")] = 2,
    accum: Annotated[AccumDtype, typer.Option(
        "--accum", help="Hold the scores (Q/K/V) and the state in this dtype; the reference is "
        "float64.")] = AccumDtype.float64,
    causal: CausalOpt = False,
    causal_align: CausalAlignOpt = Align.bottom_right,
    window: WindowOpt = None,
    mask: MaskOpt = None,
    scale: ScaleOpt = None,
    layout: LayoutOpt = Layout.bhnd,
    plot: Annotated[Path | None, typer.Option(
        "--plot", metavar="FILE.png", help="Also draw error, rescales and traffic vs block size.")
    ] = None,
    csv: SweepCsvOpt = None,
    dtype: DtypeOpt = None,
    kernel: KernelOpt = None,
    mma: MmaOpt = Mma.blas,
    input_dtype: InputDtypeOpt = None,
    as_json: JsonOpt = False,
    score_mod: ScoreModOpt = None,
    mask_mod: MaskModOpt = None,
):
    """Sweep block sizes: error, rescales and tiles measured; working set and HBM traffic modelled.

    Per block size: online softmax over every row (or, for Q/K/V, the tiled attention forward
    with that block_k), its max error against the one-shot float64 reference and its rescale
    count, beside the FA1 cost model (Theorem 2): the bytes one tile holds on chip and the HBM
    traffic of tiled vs standard attention for this many rows and keys.

    \b
    Examples:
      osm sweep samples/matrix.txt --blocks 1,2,4
      osm sweep samples/scores.txt --blocks 1,2,4 --accum float32
      osm sweep samples/long.npz --blocks 16,32,64,128,256 --sram 192KiB --causal
      osm sweep samples/long.npz --blocks 32,64,128 --dtype bf16 --kernel fa4
    """
    from osm_cli import io
    from osm_cli.present import csv as export
    from osm_cli.present import json as documents
    from osm_cli.present import plot as plots
    from osm_cli.present import tables as render
    from osm_cli.studies.sweep import sweep_attention, sweep_scores

    files = files or []
    need_plot(plot)
    check_outputs(plot=plot, csv=csv)
    qkv = io.is_qkv(files)
    sweep_checks(files, qkv, values, head_dim, causal or (window, mask, scale) != (None,) * 3
                  or layout is not Layout.bhnd or causal_align is not Align.bottom_right)
    if not qkv and (dtype is not None or kernel is not None or mma is not Mma.blas):
        raise OsmError("--dtype, --kernel and --mma model a kernel on Q/K/V; scores run the "
                       "online softmax alone")
    if qkv:
        from osm_cli.precision.dtypes import shared_narrow

        opts = score_options(causal, causal_align, window, mask, scale, layout)
        q, k, v = io.load_qkv(files, input_dtype)
        if score_mod is not None or mask_mod:
            from dataclasses import replace

            got = KernelInputs(score_mod=score_mod, mask_mod=tuple(mask_mod or ()) or None)
            opts = replace(opts, **{n: x for n, x in got.resolve(q, layout.value).items()
                                    if n in ("score_mod", "mask_mod")})
        name = kernel and kernel.value
        if name not in (None, "tiles"):
            dtype = dtype or shared_narrow(q, k, v)  # bf16 or FP8 inputs: their model
        res = sweep_attention(blocks, q, k, v, accum=accum.value, block_q=block_q,
                              dtype_bytes=dtype_bytes, sram_bytes=sram, opts=opts, dtype=dtype,
                              kernel=name, mma=mma.value)
        name = files[0] if len(files) == 1 else " ".join(files)
        shapes = (q.shape, k.shape, v.shape)
        about = render.attention_sweep_about(res, shapes, opts, accum.value)
        doc = documents.attention_sweep_doc(res, name, accum.value, shapes, opts)
    else:
        s, name = io.load_scores(files[0] if files else None, values, input_dtype)
        if score_mod is not None or mask_mod:  # row r is q_idx r, position j is kv_idx j
            from osm_cli.flash.mods import modded_scores

            got = KernelInputs(score_mod=score_mod, mask_mod=tuple(mask_mod or ()) or None)
            got = got.resolve(s, "bhnd")
            s = modded_scores(s, got.get("score_mod"), got.get("mask_mod"))
        res = sweep_scores(blocks, s, accum=accum.value, block_q=block_q, head_dim=head_dim,
                           dtype_bytes=dtype_bytes, sram_bytes=sram)
        about, doc = None, documents.sweep_doc(res, name, accum.value)
    save((plot, functools.partial(plots.sweep_titled_png, res, name, accum.value, qkv),
          "error, rescales and HBM traffic vs block size, PNG"),
         (csv, functools.partial(export.sweep_csv, res), "the sweep table, CSV"))
    if as_json:
        return emit_json(doc)
    out.print(render.sweep_table(res, name, about, out.width))


@guarded
def cost(
    seq_len: Annotated[int, typer.Option("--seq-len", "-n", min=1, help="Sequence length N.")
                       ] = 1024,
    head_dim: Annotated[int, typer.Option("--head-dim", "-d", min=1, help="Head dim d.")] = 64,
    heads: Annotated[int, typer.Option("--heads", min=1, help="Attention heads.")] = 1,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Batch size.")] = 1,
    dtype_bytes: Annotated[int, typer.Option(
        "--dtype-bytes", min=1, help="Bytes per element (2: fp16/bf16).")] = 2,
    sram: Annotated[str, typer.Option(
        "--sram", callback=size, help="SRAM size M: 192KiB (A100), 228KiB (H100).")] = "192KiB",
    as_json: JsonOpt = False,
):
    """FA1's I/O cost model: HBM bytes of standard vs tiled attention for one shape (a model).

    \b
    Example (GPT-2 medium, FA1 Fig. 2):
      osm cost -n 1024 -d 64 --heads 16 --batch 64
    """
    from osm_cli.present import json as documents
    from osm_cli.present import tables as render
    from osm_cli.studies import costmodel

    c = costmodel.cost(seq_len, head_dim, heads, batch, dtype_bytes, sram)
    if as_json:
        return emit_json(documents.cost_doc(c))
    out.print(render.cost_table(c))


def sweep_checks(files, qkv: bool, values, head_dim, mask_given: bool) -> None:
    """sweep's option checks: --values and --head-dim are for scores, the mask options for
    Q/K/V, and scores come from one file at most."""
    if qkv and (values is not None or head_dim is not None):
        raise OsmError("--values and --head-dim are for scores; Q/K/V carry their own keys and "
                       "head dim")
    if not qkv and len(files) > 1:
        raise OsmError(f"sweep takes SCORES, or Q K V (three .npy files or one .npz with q, k, "
                       f"v); got {len(files)} files")
    if not qkv and mask_given:
        raise OsmError("--causal, --causal-align, --window, --mask, --scale and --layout are for "
                       "Q/K/V; scores carry their mask as -inf")
