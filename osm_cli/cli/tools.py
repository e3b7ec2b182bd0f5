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

from .common import check_outputs, emit_json, guarded, need_plot, out, save
from .groups import Model, Mods, Scores, grouped, score_options
from .options import (
    AccumDtype,
    BlockQOpt,
    InputDtypeOpt,
    InputSeedOpt,
    JsonOpt,
    LseBase,
    RandomOpt,
    SweepCsvOpt,
    ValuesOpt,
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
@grouped
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
    *,
    scores: Scores,
    plot: Annotated[Path | None, typer.Option(
        "--plot", metavar="FILE.png", help="Also draw error, rescales and traffic vs block size.")
    ] = None,
    csv: SweepCsvOpt = None,
    kernel: Model,
    input_dtype: InputDtypeOpt = None,
    as_json: JsonOpt = False,
    mods: Mods,
    random: RandomOpt = None,
    seed: InputSeedOpt = 0,
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
      osm sweep --random 1,2,256,16 --blocks 16,64,256 --causal
    """
    from osm_cli import io
    from osm_cli.present import csv as export
    from osm_cli.present import json as documents
    from osm_cli.present import plot as plots
    from osm_cli.present import tables as render
    from osm_cli.reports.rules import sweep_options
    from osm_cli.studies.sweep import sweep_scores

    files = files or []
    if random is not None and (files or values is not None):
        raise OsmError("give scores, Q K V files or --random B,H,N,d, one of them")
    need_plot(plot)
    check_outputs(plot=plot, csv=csv)
    qkv = random is not None or io.is_qkv(files)
    sweep_options(files, qkv, values, head_dim, scores.given, kernel != Model())
    if qkv:
        if random is not None:
            from osm_cli.studies.inputs import parse_shape, random_qkv

            given = random_qkv(parse_shape(random), seed)
            files = [f"--random {random} --seed {seed}"]
        res, name, about, doc = _sweep_qkv(files, blocks, sram, block_q, dtype_bytes,
                                           accum.value, scores, kernel, input_dtype, mods,
                                           given if random is not None else None)
    else:
        s, name = io.load_scores(files[0] if files else None, values, input_dtype)
        s = io.scores_with_mods(s, **mods.keywords())  # row r is q_idx r, position j kv_idx j
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


def _sweep_qkv(files, blocks, sram, block_q, dtype_bytes, accum: str, scores, kernel, raw_as,
               mods, given=None):
    """sweep over Q/K/V (given: the tensors of --random, else loaded from files): (result,
    name, the about line, the JSON document)."""
    from osm_cli import io
    from osm_cli.precision.dtypes import shared_narrow
    from osm_cli.present import json as documents
    from osm_cli.present import tables as render
    from osm_cli.studies.sweep import sweep_attention

    opts = score_options(scores)
    q, k, v = given if given is not None else io.load_qkv(files, raw_as)
    if mods.score_mod is not None or mods.mask_mod:
        from dataclasses import replace

        opts = replace(opts, **io.read_mods(**mods.keywords(),
                                            heads=io.heads_of(q, opts.layout, False)))
    dtype = kernel.dtype
    if kernel.name not in (None, "tiles"):
        dtype = dtype or shared_narrow(q, k, v)  # bf16 or FP8 inputs: their model
    res = sweep_attention(blocks, q, k, v, accum=accum, block_q=block_q, dtype_bytes=dtype_bytes,
                          sram_bytes=sram, opts=opts, dtype=dtype, kernel=kernel.name,
                          mma=kernel.mma_value)
    name = files[0] if len(files) == 1 else " ".join(files)
    shapes = (q.shape, k.shape, v.shape)
    return (res, name, render.attention_sweep_about(res, shapes, opts, accum),
            documents.attention_sweep_doc(res, name, accum, shapes, opts))
