"""osm attention and osm check: the tiled forward on real Q/K/V traced tile by tile, and a
kernel's output judged by FlashAttention's test rule. Each command imports the layers it uses
when it runs (see common.py: `osm --help` loads no numpy). Leaves out: computing
(reports/attention.py, precision/check.py) and the tables (present/attention.py,
present/verdicts.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    check_outputs,
    emit_json,
    err,
    exports,
    guarded,
    need_plot,
    note,
    offer_page,
    out,
    page_wanted,
    present,
    progress,
    qkv_inputs,
    save,
)
from .groups import Descales, Inputs, Model, Mods, Scores, Shown, Traced, grouped, score_options
from .options import (
    PLOT_LIMIT,
    AccumOpt,
    BlockQOpt,
    CheckRule,
    CsvOpt,
    GradRule,
    InputDtypeOpt,
    JsonOpt,
    LseBase,
    MaskedLse,
    NoReferenceOpt,
    PrecisionOpt,
    RandomOpt,
    SeedOpt,
    TileOrder,
    UpdateForm,
)


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
    block_q: BlockQOpt = None,
    block_k: Annotated[
        int | None, typer.Option("--block-k", min=1,
                                 help="Keys per tile (default 128 for d <= 64, else 64).")
    ] = None,
    masked_lse: Annotated[
        MaskedLse | None, typer.Option("--masked-lse", help="LSE of fully masked rows "
                                       "(default: the kernel's own: fa2 pos-inf, fa4, "
                                       "fa4-sm100 and tiles neg-inf).")
    ] = None,
    form: Annotated[
        UpdateForm, typer.Option("--form", help="Update form of the online step.")
    ] = UpdateForm.rescale,
    traced: Traced,
    out_path: Annotated[str | None, typer.Option("--out", help="Write O to this .npy.")] = None,
    lse_path: Annotated[
        str | None, typer.Option("--lse", help="Write LSE (natural log) to this .npy.")
    ] = None,
    no_reference: NoReferenceOpt = False,
    shown: Shown,
    splits: Annotated[
        int | None, typer.Option("--splits", min=1, help="Split-KV: cut K/V into S chunks, run "
                                 "each to (O, LSE), merge, compare with the unsplit run.")
    ] = None,
    order: Annotated[
        TileOrder, typer.Option("--order", help="Order to visit the K/V tiles in.")
    ] = TileOrder.forward,
    seed: SeedOpt = 0,
    rescale_threshold: Annotated[
        float | None, typer.Option("--rescale-threshold", min=0.0, help="Lazy rescale (FA4): "
                                   "move m only when a tile's max exceeds it by more than τ "
                                   "(natural log; a kernel preset gets τ·log2(e), its log2 "
                                   "units; default 0, fa4-sm100's own 8 log2 units in 16 bit).")
    ] = None,
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
    from osm_cli.flash.options import Tiling
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
            q, k, v, opts, Tiling(block_q=block_q, block_k=block_k, form=form.value), model=lab,
            notes=notes, splits=splits, order=order.value, seed=seed,
            with_reference=not no_reference, progress=tick,
            masked_lse=masked_lse and masked_lse.value, kernel=kernel.name,
            mma=kernel.mma.value, descale=scales, rescale_threshold=rescale_threshold,
            trace_at=traced.at())
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
    if present(shown.step, heads, [(frame, len(res.trace), "tile")], tables, after=heads):
        out.print(render.attention_results(rep, shown.show_all, out.width))


def JudgedOpt(flag: str, what: str):  # noqa: N802 (a type, as the other options)
    return Annotated[str | None, typer.Option(flag, help=f"The kernel's {what} (.npy), to judge.")]


@guarded
@grouped
def check(
    files: Annotated[list[str], typer.Argument(
        help="BUNDLE: one .npz or .safetensors holding out, q, k, v (and any of lse, do, dq, dk, "
        "dv); or OUT Q K V (OUT shaped like Q with V's head dim); or OUT and one file holding "
        "q, k, v. Tensor files are .npy, .npz or .safetensors.",
        metavar="BUNDLE | OUT Q K V | OUT QKV", show_default=False)],
    *,
    lse: Annotated[str | None, typer.Option(
        "--lse", help="The kernel's LSE (natural log) as a tensor file, to judge too (a BUNDLE "
        "holds its own).")] = None,
    scores: Scores,
    do: Annotated[str | None, typer.Option(
        "--do", "--dout", help="The upstream gradient dO (.npy) the kernel's gradients were "
        "computed for.")] = None,
    dq: JudgedOpt("--dq", "dQ") = None,
    dk: JudgedOpt("--dk", "dK") = None,
    dv: JudgedOpt("--dv", "dV") = None,
    grad_rule: Annotated[GradRule, typer.Option(
        "--grad-rule", help="The gradients' rule: fa3 (FA3/FA4's tests: 2·plain error + "
        "2·rounding) or fa2 (FA2's tests: 3·plain error).")] = GradRule.fa3,
    rule: Annotated[CheckRule, typer.Option(
        "--rule", help="The rule that decides each tensor's verdict: fa (FlashAttention's "
        "tests, the default) or model (error ≤ 1.25× osm's model of --kernel, and no head "
        "biased). A row that sees no key must be exactly 0 under both.")] = CheckRule.fa,
    lse_base: Annotated[LseBase, typer.Option(
        "--lse-base", help="Base of the kernel's LSE: e (FlashAttention, PyTorch) or 2 "
        "(FlashInfer, Triton's tutorial).")] = LseBase.e,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Refuse a BUNDLE holding arrays osm check does not use (without it "
        "they are listed on one 'ignored:' line).")] = False,
    rules_table: Annotated[bool, typer.Option(
        "--rules-table", help="Also say what torch.testing.assert_close's defaults, atol 1e-2 "
        "(Triton's tutorial), KernelBench's allclose and flashinfer-bench's matched ratio "
        "would on the same tensors.")] = False,
    no_probe: Annotated[bool, typer.Option(
        "--no-probe", help="On a failure, skip trying the other conventions and locating the "
        "failing tiles.")] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Worst rows and heads to list.")] = 5,
    no_model: Annotated[bool, typer.Option(
        "--no-model", help="Skip running osm's flash model on the same inputs.")] = False,
    kernel: Model,
    descales: Descales,
    input_dtype: InputDtypeOpt = None,
    as_json: JsonOpt = False,
    block_mask: Annotated[str | None, typer.Option(
        "--block-mask", metavar="FILE.npz", help="The kernel's block-sparse metadata "
        "(FlexAttention's kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, or "
        "FA4's mask_block_cnt, …; block_size (2,), default 128,128), judged against "
        "--mask-mod: a tile claimed full that is partial, or left out with a visible key, "
        "is named and fails the check.")] = None,
    inputs: Inputs,
    mods: Mods,
    seq: Annotated[int | None, typer.Option("--seq", min=0, hidden=True)] = None,  # taken as
    # before the option groups (check traces no row); hidden, as it does nothing here
):
    """Judge a kernel's output (and LSE) the way FlashAttention's own tests do.

    ref = the float64 reference of the dtype-rounded inputs, cast to the dtype; pt = plain
    attention in the dtype. Pass when max|out − ref| ≤ 2·max|pt − ref| + 2·max|(ref + 0.3 − 0.3)
    − ref|. Exit 0: pass. Exit 1: fail ("FAIL: …" on stderr) or bad input ("Error: …").
    --dtype defaults to OUT's own dtype. With --do and any of --dq, --dk, --dv, each gradient
    is judged too, against the float64 gradients, by FlashAttention's backward rule. A BUNDLE
    may name its tensors as FlashAttention and PyTorch do (softmax_lse, dout, o, query, …).
    On a failure osm says where the failing rows are (heads, sequences, tiles) and which other
    convention the kernel fits (LSE base 2, causal alignment, scale, GQA map, layout, …).
    A kernel's own files: osm check out.npy q.npy k.npy v.npy
    --lse lse.npy --causal, or a bundle: osm check flashinfer_out.npz --lse-base 2.

    \b
    Examples:
      osm check samples/kernel_fp16.npz --causal
      osm check samples/kernel_bf16.safetensors --causal
      osm check samples/kernel_fp16.npz --causal --top 3 --json
    """
    from osm_cli import io
    from osm_cli.precision.check import check as judge
    from osm_cli.precision.presets import judged_as
    from osm_cli.present import json as documents
    from osm_cli.present.verdicts import check_report, fail_line

    from .flags import flag

    ignored(files, strict)
    t = io.load_kernel_tensors(files, lse, input_dtype,
                               {"do": do, "dq": dq, "dk": dk, "dv": dv})
    o, name = t.pop("out"), t.pop("name")
    dt, said = judged_as(kernel.dtype, kernel.name, o, name, t["q"], t["k"], t["v"])
    opts = score_options(scores, t["q"], inputs, mods)
    if len(files) == 1:  # a bundle's own varlen, paged, sink and ALiBi arrays, unless given
        opts = io.with_bundle_inputs(opts, files[0])
    note(said)
    scales = descales.read()
    blocks_ok = block_mask is None or judge_block_mask(block_mask, opts, t["q"], t["k"])
    rep = judge(o, t.pop("q"), t.pop("k"), t.pop("v"), dt, top=top, with_model=not no_model,
                opts=opts, grad_rule=grad_rule.value, kernel=kernel.name,
                mma=kernel.mma.value, descale=scales, rule=rule.value,
                lse_base=lse_base.value, probe=not no_probe, rules_table=rules_table, **t)
    if as_json:
        emit_json(documents.check_doc(rep, flag))
    else:
        out.print(check_report(rep, name, top, flag))
    if not rep.passed:
        err.print(f"FAIL: {fail_line(rep, flag)}", markup=False, soft_wrap=True)
    if not rep.passed or not blocks_ok:
        raise typer.Exit(1)


def ignored(files: list[str], strict: bool) -> None:
    """A BUNDLE's arrays check does not use: refused under --strict, else listed on stderr."""
    from osm_cli import io
    from osm_cli.reports.rules import bundle_unused

    if len(files) != 1:
        return
    unused = io.unused_names(files[0])
    bundle_unused(files[0], unused, strict)
    if unused:
        err.print(f"ignored: {', '.join(unused)} ({files[0]}: osm check does not use "
                  f"{'it' if len(unused) == 1 else 'them'})", markup=False, soft_wrap=True)


def judge_block_mask(path: str, opts, q, k) -> bool:
    """check --block-mask: the kernel's block mask judged against the mask_mod, its verdict
    and wrong tiles printed; False when it fails."""
    from osm_cli import io
    from osm_cli.flash.blockmask import judge_against
    from osm_cli.present.verdicts import block_mask_lines

    rep = judge_against(opts, q, k, lambda: io.load_named(path))
    for line in block_mask_lines(rep, opts.mask_mod.name):
        out.print(line, markup=False, soft_wrap=True)
    if not rep.passed:
        err.print(f"FAIL: block mask: {rep.wrong[0]}", markup=False, soft_wrap=True)
    return rep.passed


def attention_files(csv, plot, res, q, k, opts, files) -> list[tuple]:
    """attention --csv and --plot as save() items: the traced row's tile table and the traced
    head's picture (drawn here, before anything is written)."""
    from osm_cli.present import csv as export
    from osm_cli.present import plot as plots
    from osm_cli.studies import tilemap

    b, h, i = res.traced
    items = []
    if csv is not None:
        items.append((csv, export.tiles_csv(res), "tile table of the traced row"
                      + ("s" if len(res.queries) > 1 else "") + ", CSV"))
    if plot is not None:
        hm = tilemap.head_probabilities(q, k, batch=b, head=h, rows=PLOT_LIMIT, cols=PLOT_LIMIT,
                                        block_q=res.block_q, block_k=res.block_k, opts=opts)
        png = plots.traced_head_png(hm, files[0] if len(files) == 1 else
                                    ", ".join(Path(f).name for f in files), i)
        items.append((plot, png, f"probability matrix of batch {b}, head {h} with its tiles, PNG"))
    return items
