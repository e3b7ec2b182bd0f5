"""The `osm` command line: parse options, call io -> core -> render, map errors to exit codes.

Each command loads its inputs (io.py), makes one call into the core (report.py, sweep.py,
merge.py, precision.py, costmodel.py), then prints renderables (render.py), emits a JSON document
(documents.py) or writes files (export.py, plot.py). The choices and shared options come first,
then the commands in the order `osm --help` lists them, then the plumbing they share.

Exit codes: 0 success; 1 bad input ("Error: …" on stderr); 2 bad option values (Typer).
Nothing else lives here.
"""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

from . import costmodel, documents, export, io, render, report, stepmode, tilemap
from . import plot as plots
from .errors import OsmError
from .merge import merge_report
from .sweep import sweep_attention, sweep_scores

app = typer.Typer(
    name="osm",
    help="Explore the online softmax at the heart of FlashAttention, step by step.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Piped output gets 100 columns (not rich's 80), the width the tables are laid out for.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 100)
err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 1):
    """Print one 'Error: …' line on stderr and exit."""
    err.print(f"Error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(fn):
    """Turn OsmError into 'Error: …' + exit 1; any other failure too, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OsmError as exc:
            fail(str(exc))
        except MemoryError:
            fail("out of memory; try smaller inputs or blocks")
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug in osm: still one line, the traceback on request
            if os.environ.get("OSM_DEBUG"):
                raise
            fail(f"internal error: {type(exc).__name__}: {exc} (set OSM_DEBUG=1 for a traceback)")

    return wrapper


def emit_json(obj) -> None:
    sys.stdout.write(io.dumps(obj) + "\n")


# ---------------------------------------------------------------------------------------------
# Choices, option values, and the options several commands share: one definition each


class Form(str, Enum):
    rescale = "rescale"
    merge = "merge"
    both = "both"


class Align(str, Enum):
    bottom_right = "bottom-right"
    top_left = "top-left"


class Layout(str, Enum):
    bhnd = "bhnd"
    bnhd = "bnhd"


class MaskedLse(str, Enum):
    neg_inf = "neg-inf"
    pos_inf = "pos-inf"
    zero = "zero"


class TileOrder(str, Enum):
    forward = "forward"
    reverse = "reverse"
    shuffle = "shuffle"


class UpdateForm(str, Enum):
    rescale = "rescale"
    merge = "merge"


class PrecisionModel(str, Enum):
    flash = "flash"
    naive = "naive"


class AccumDtype(str, Enum):
    float32 = "float32"
    float64 = "float64"


class LseBase(str, Enum):
    e = "e"
    two = "2"


def _dtype_name(value):
    """--dtype: a dtype name or alias, as its canonical name (a bad one exits 2)."""
    if value is None:
        return None
    from .precision import resolve_dtype

    try:
        return resolve_dtype(value)[0]
    except OsmError as exc:
        raise typer.BadParameter(str(exc)) from None


def _dtype_names(values):
    return None if not values else [_dtype_name(v) for v in values]


def _block_list(text: str) -> list[int]:
    try:
        blocks = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give whole numbers separated by commas") from None
    if not blocks or min(blocks) < 1:
        raise typer.BadParameter(f"{text!r}: block sizes must be at least 1")
    return blocks


def _size(text: str) -> int:
    try:
        return costmodel.parse_size(text)
    except OsmError as exc:
        raise typer.BadParameter(str(exc)) from None


_DTYPES_HELP = ("float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 "
                "(or fp64, fp32, fp16, bf16, e4m3, e5m2)")


def _csv_option(table: str):
    """--csv FILE, writing `table` (its help names the command's table)."""
    return Annotated[Path | None, typer.Option(
        "--csv", metavar="FILE", help=f"Also write {table} to FILE as CSV.")]


# Every command but overflow-demo.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print strict JSON instead.")]
# Options that attention, check, sweep and trace share.
CausalOpt = Annotated[bool, typer.Option("--causal", help="Causal mask.")]
CausalAlignOpt = Annotated[
    Align, typer.Option("--causal-align", help="bottom-right (FlashAttention) or top-left "
                        "(PyTorch is_causal) when Q and K lengths differ.")
]
WindowOpt = Annotated[
    str | None, typer.Option("--window", help="Sliding window LEFT,RIGHT (-1 = unbounded).")
]
MaskOpt = Annotated[
    str | None, typer.Option("--mask", help=".npy mask broadcastable to (B, H, t, s): "
                             "bool (True = attend) or float (added to the scores).")
]
ScaleOpt = Annotated[float | None, typer.Option("--scale", help="Score scale (default 1/sqrt(d)).")]
LayoutOpt = Annotated[
    Layout, typer.Option("--layout", help="bhnd (PyTorch) or bnhd (FlashAttention).")
]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", callback=_dtype_name, help=f"Round inputs to this dtype: {_DTYPES_HELP}.")]
PrecisionOpt = Annotated[PrecisionModel | None, typer.Option(
    "--precision", help="With --dtype: flash (a FlashAttention kernel: fp32 state, P rounded "
    "before P·V; the default) or naive (everything in the dtype).")]
AccumOpt = Annotated[AccumDtype | None, typer.Option(
    "--accum", help="With --dtype: the state's dtype (default float32; float64 for float64).")]
# Options shared by trace and attention (sweep's --csv is the same option, naming its table).
CsvOpt = _csv_option("the step table")
SweepCsvOpt = _csv_option("the sweep table")
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --order shuffle.")]
StepOpt = Annotated[bool, typer.Option(
    "--step", help="In a terminal, show one block (attention: K/V tile) at a time (Enter or "
    "space: next, q: quit).")]
PLOT_LIMIT = 512  # attention --plot draws at most this many queries and keys of the head
# attention's tile size options, shared with sweep (where --block-k is the swept size).
BlockQOpt = Annotated[
    int | None, typer.Option("--block-q", min=1, help="Query rows per tile (default 128).")
]
# Options shared by trace and sweep.
ValuesOpt = Annotated[
    str | None, typer.Option("--values", help='Scores inline, e.g. "1,2,5,3".')
]


# ---------------------------------------------------------------------------------------------
# The commands, in the order `osm --help` lists them


@app.command()
@guarded
def trace(
    scores: Annotated[
        str | None,
        typer.Argument(help="Scores: text, .csv, .npy/.npz file, or '-' for standard input."),
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
        help="Also draw m, l and α per block to a PNG (needs: pip install 'osm-cli[plot]')."),
    ] = None,
    step: StepOpt = False,
    dtype: DtypeOpt = None,
    precision: PrecisionOpt = None,
):
    """Trace online softmax over a score vector, block by block.

    Shows the state (m, α, l) after each block, then every element's probability beside the
    one-shot stabilized and the naive result.

    \b
    Examples:
      osm trace samples/scores.txt --block 2
      osm trace --values "1,2,5,3" -b 2 --form merge
      osm trace samples/matrix.txt --row 1 --json
    """
    s, name = io.load_scores(scores, values)
    _trace_checks(s, name, row, form, rescale_threshold, dtype, precision,
                  order or rescale_threshold or csv or plot or step)
    _need_plot(plot)
    rep = report.trace_report(s, block, form.value, row=row, order=order and order.value,
                              seed=seed, threshold=rescale_threshold, dtype=dtype,
                              precision=precision and precision.value)
    if csv is not None:
        _save(csv, export.steps_csv(rep.traces), "step table, CSV")
    if plot is not None:
        _save(plot, plots.trace_report_png(rep, name), "m, l and α per block, PNG")
    if as_json:
        return emit_json(documents.trace_doc(rep))
    heads = render.trace_heads(rep, name)
    pages = [(functools.partial(render.step_frame, heads, t, width=out.width), len(t.steps),
              "block") for t in rep.traces]
    tables = [render.step_table(t, show_all, out.width) for t in rep.traces]
    if _present(step, heads, pages, tables):
        out.print(render.trace_results(rep, show_all, out.width))


@app.command()
@guarded
def attention(
    files: Annotated[
        list[str], typer.Argument(help="Q K V as .npy files, or one .npz holding q, k, v.")
    ],
    causal: CausalOpt = False,
    causal_align: CausalAlignOpt = Align.bottom_right,
    window: WindowOpt = None,
    mask: MaskOpt = None,
    scale: ScaleOpt = None,
    block_q: BlockQOpt = None,
    block_k: Annotated[
        int | None, typer.Option("--block-k", min=1,
                                 help="Keys per tile (default 128 for d <= 64, else 64).")
    ] = None,
    layout: LayoutOpt = Layout.bhnd,
    masked_lse: Annotated[
        MaskedLse, typer.Option("--masked-lse", help="LSE of fully masked rows.")
    ] = MaskedLse.neg_inf,
    form: Annotated[
        UpdateForm, typer.Option("--form", help="Update form of the online step.")
    ] = UpdateForm.rescale,
    batch: Annotated[int, typer.Option("--batch", min=0, help="Batch of the traced row.")] = 0,
    head: Annotated[int, typer.Option("--head", min=0, help="Query head of the traced row.")] = 0,
    query: Annotated[int, typer.Option("--query", min=0, help="Query index to trace.")] = 0,
    out_path: Annotated[str | None, typer.Option("--out", help="Write O to this .npy.")] = None,
    lse_path: Annotated[
        str | None, typer.Option("--lse", help="Write LSE (natural log) to this .npy.")
    ] = None,
    no_reference: Annotated[
        bool, typer.Option("--no-reference", help="Skip the float64 reference check.")
    ] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Show every tile and component.")] = False,
    splits: Annotated[
        int | None, typer.Option("--splits", min=1, help="Split-KV: cut K/V into S chunks, run "
                                 "each to (O, LSE), merge, compare with the unsplit run.")
    ] = None,
    order: Annotated[
        TileOrder, typer.Option("--order", help="Order to visit the K/V tiles in.")
    ] = TileOrder.forward,
    seed: SeedOpt = 0,
    rescale_threshold: Annotated[
        float, typer.Option("--rescale-threshold", min=0.0, help="Lazy rescale (FA4): move m "
                            "only when a tile's max exceeds it by more than τ (natural log).")
    ] = 0.0,
    dtype: DtypeOpt = None,
    precision: PrecisionOpt = None,
    accum: AccumOpt = None,
    csv: CsvOpt = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", metavar="FILE.png", help="Also draw the traced head's probability matrix (the "
        f"first {PLOT_LIMIT}×{PLOT_LIMIT}), its tile grid and skipped tiles, to a PNG (needs: "
        "pip install 'osm-cli[plot]').")] = None,
    step: StepOpt = False,
    as_json: JsonOpt = False,
):
    """Tiled FlashAttention forward on real Q/K/V tensors, traced tile by tile.

    Shapes (N, d), (H, N, d) or (B, H, N, d); Q's length may differ from K/V's; GQA when Q has a
    multiple of K/V's heads. Prints a summary against a float64 one-shot reference and the trace
    of one query row.

    \b
    Examples:
      osm attention samples/q.npy samples/k.npy samples/v.npy
      osm attention samples/qkv.npz --causal --head 1 --query 5 --block-k 4
      osm attention q.npy k.npy v.npy --out o.npy --lse lse.npy --no-reference
      osm attention q.npy k.npy v.npy --dtype bf16
    """
    from . import precision as prec

    q, k, v = io.load_qkv(files)
    kwargs = _mask_kwargs(causal, causal_align, window, mask, scale, layout)
    lab, (q, k, v), notes = prec.prepare(dtype, precision and precision.value,
                                         accum and accum.value, q, k, v)
    if lab is not None and lab.precision == "naive" and (csv or plot or step):
        raise OsmError("--csv, --plot and --step show the tiles of the tiled run; --precision "
                       "naive is one-shot attention")
    _need_plot(plot)
    with _progress() as progress:
        rep = report.attention_report(
            q, k, v, kwargs, model=lab, notes=notes, splits=splits, order=order.value, seed=seed,
            with_reference=not no_reference, progress=progress, block_q=block_q,
            block_k=block_k, masked_lse=masked_lse.value, form=form.value,
            trace_at=(batch, head, query), threshold=rescale_threshold)
    res = rep.result
    if out_path:
        io.save_npy(Path(out_path), rep.stored_out)
    if lse_path:
        io.save_npy(Path(lse_path), res.lse)
    _attention_files(csv, plot, res, q, k, kwargs, files)
    if as_json:
        return emit_json(documents.attention_doc(rep))
    heads = render.attention_heads(rep)
    frame = functools.partial(render.attention_step_frame, heads, res, width=out.width)
    if _present(step, heads, [(frame, len(res.trace), "tile")],
                [render.attention_trace(res, out.width, show_all)]):
        out.print(render.attention_results(rep, show_all))


@app.command("overflow-demo")
@guarded
def overflow_demo(
    values: Annotated[
        list[float] | None, typer.Argument(help="Scores to try (default 100 102 99).")
    ] = None,
    dtype: Annotated[list[str] | None, typer.Option(
        "--dtype", callback=_dtype_names,
        help=f"Show only these dtypes (repeatable): {_DTYPES_HELP}.")] = None,
):
    """Show why naive softmax overflows and how subtracting the max fixes it.

    For float16, bfloat16, float32 and float64: exp of each value, naive, stabilized and online
    softmax, the overflow threshold ln(max finite) of each, and a fully masked row.

    \b
    Examples:
      osm overflow-demo
      osm overflow-demo 10 11 12
      osm overflow-demo --dtype e4m3 --dtype e5m2
    """
    from .precision import DEMO_DTYPES
    from .precision import overflow_demo as demo

    xs = values or [100.0, 102.0, 99.0]
    if any(np.isnan(x) for x in xs):
        raise OsmError("values must not be NaN")
    dtypes = tuple(dict.fromkeys(dtype)) if dtype else DEMO_DTYPES  # repeated: shown once
    out.print(render.overflow_report(demo(xs, dtypes)))


@app.command()
@guarded
def merge(
    files: Annotated[list[Path], typer.Argument(
        help="Pairs O_0 LSE_0 O_1 LSE_1 …: normalised partial outputs (…, dv) and their LSEs "
        "(…), as .npy or one-array .npz files.", show_default=False,
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
    as_json: JsonOpt = False,
):
    """Merge split-KV partial results (O_s, LSE_s) into one, as Flash-Decoding does.

    L = logsumexp over s of LSE_s and O = Σ exp(LSE_s − L)·O_s. A split with LSE -inf (or +inf,
    FA2's marker for a split without keys) has weight 0; a row empty in every split gets O = 0 and
    LSE = -inf, never NaN. Outputs keep the inputs' float dtype.

    \b
    Examples:
      osm merge o0.npy lse0.npy o1.npy lse1.npy --out o.npy --lse lse.npy
      osm merge o0.npy lse0.npy o1.npy lse1.npy --lse-base 2 --row 5
    """
    if out_path is not None and lse_path is not None and out_path.resolve() == lse_path.resolve():
        raise OsmError(f"--out and --lse are the same file ({out_path}); give two names")
    outs, lses, (out_dtype, lse_dtype) = io.load_partials(files)
    rep = merge_report(outs, lses, lse_base.value, row)
    for path, arr, dtype in ((out_path, rep.merged.out, out_dtype),
                             (lse_path, rep.merged.lse, lse_dtype)):
        if path is not None:
            _save(path, arr.astype(dtype))
    if as_json:
        return emit_json(documents.merge_doc(files, rep))
    names = [(str(o), str(lse)) for o, lse in zip(files[0::2], files[1::2], strict=True)]
    out.print(render.merge_table(names, rep))


@app.command()
@guarded
def sweep(
    files: Annotated[list[str] | None, typer.Argument(
        help="Scores (text, .csv, .npy/.npz file, or '-' for standard input), or Q K V as three "
        ".npy files or one .npz holding q, k, v.", metavar="SCORES | Q K V")] = None,
    values: ValuesOpt = None,
    blocks: Annotated[str, typer.Option(
        "--blocks", callback=_block_list, help="Block sizes (keys per block; block_k for Q/K/V), "
        "comma separated.")
    ] = "16,32,64,128,256",
    sram: Annotated[str, typer.Option(
        "--sram", callback=_size, help="SRAM for the model: 192KiB (A100), 228KiB (H100); "
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
    as_json: JsonOpt = False,
):
    """Sweep block sizes: error, rescales and tiles measured; working set and HBM traffic modelled.

    Per block size: online softmax over every row (or, for Q/K/V, the tiled attention forward
    with that block_k), its max error against the one-shot float64 reference and its rescale
    count, beside the FA1 cost model (Theorem 2): the bytes one tile holds on chip and the HBM
    traffic of tiled vs standard attention for this many rows and keys.

    \b
    Examples:
      osm sweep samples/matrix.txt --blocks 1,2,4
      osm sweep scores.npy --blocks 16,32,64,128,256 --sram 192KiB --accum float32
      osm sweep q.npy k.npy v.npy --blocks 16,32,64,128,256 --sram 192KiB --causal
    """
    files = files or []
    _need_plot(plot)
    qkv = io.is_qkv(files)
    _sweep_checks(files, qkv, values, head_dim, causal or (window, mask, scale) != (None,) * 3
                  or layout is not Layout.bhnd or causal_align is not Align.bottom_right)
    if qkv:
        kwargs = _mask_kwargs(causal, causal_align, window, mask, scale, layout)
        q, k, v = io.load_qkv(files)
        res = sweep_attention(blocks, q, k, v, accum=accum.value, block_q=block_q,
                              dtype_bytes=dtype_bytes, sram_bytes=sram, **kwargs)
        name = files[0] if len(files) == 1 else " ".join(files)
        shapes = (q.shape, k.shape, v.shape)
        about = render.attention_sweep_about(res, shapes, kwargs, accum.value)
        doc = documents.attention_sweep_doc(res, name, accum.value, shapes, kwargs)
    else:
        s, name = io.load_scores(files[0] if files else None, values)
        res = sweep_scores(blocks, s, accum=accum.value, block_q=block_q, head_dim=head_dim,
                           dtype_bytes=dtype_bytes, sram_bytes=sram)
        about, doc = None, documents.sweep_doc(res, name, accum.value)
    if plot is not None:
        _save(plot, plots.sweep_titled_png(res, name, accum.value, qkv),
              "error, rescales and HBM traffic vs block size, PNG")
    if csv is not None:
        _save(csv, export.sweep_csv(res), "the sweep table, CSV")
    if as_json:
        return emit_json(doc)
    out.print(render.sweep_table(res, name, about))


@app.command()
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
        "--sram", callback=_size, help="SRAM size M: 192KiB (A100), 228KiB (H100).")] = "192KiB",
    as_json: JsonOpt = False,
):
    """FA1's I/O cost model: HBM bytes of standard vs tiled attention for one shape (a model).

    \b
    Example (GPT-2 medium, FA1 Fig. 2):
      osm cost -n 1024 -d 64 --heads 16 --batch 64
    """
    c = costmodel.cost(seq_len, head_dim, heads, batch, dtype_bytes, sram)
    if as_json:
        return emit_json(documents.cost_doc(c))
    out.print(render.cost_table(c))


@app.command()
@guarded
def check(
    out_file: Annotated[str, typer.Argument(
        help="The kernel's output O as .npy, shaped like Q but with V's head dim.")],
    files: Annotated[list[str], typer.Argument(
        help="The kernel's inputs: Q K V as .npy files, or one .npz (q, k, v).")],
    lse: Annotated[str | None, typer.Option(
        "--lse", help="The kernel's LSE (natural log) as .npy, to judge too.")] = None,
    dtype: DtypeOpt = None,
    causal: CausalOpt = False,
    causal_align: CausalAlignOpt = Align.bottom_right,
    window: WindowOpt = None,
    mask: MaskOpt = None,
    scale: ScaleOpt = None,
    layout: LayoutOpt = Layout.bhnd,
    top: Annotated[int, typer.Option("--top", min=1, help="Worst rows and heads to list.")] = 5,
    no_model: Annotated[bool, typer.Option(
        "--no-model", help="Skip running osm's flash model on the same inputs.")] = False,
    as_json: JsonOpt = False,
):
    """Judge a kernel's output (and LSE) the way FlashAttention's own tests do.

    ref = the float64 reference of the dtype-rounded inputs, cast to the dtype; pt = plain
    attention in the dtype. Pass when max|out − ref| ≤ 2·max|pt − ref| + 2·max|(ref + 0.3 − 0.3)
    − ref|. Exit 0: pass. Exit 1: fail ("FAIL: …" on stderr) or bad input ("Error: …").
    --dtype defaults to OUT's own dtype.

    \b
    Examples:
      osm check out.npy q.npy k.npy v.npy --lse lse.npy --dtype fp16 --causal
      osm check out.npy qkv.npz --dtype bf16 --causal-align top-left --causal
    """
    from . import precision as prec

    o = io.load_array(Path(out_file), mmap=False)
    q, k, v = io.load_qkv(files)
    lse_arr = None if lse is None else io.load_array(Path(lse), mmap=False)
    dt = prec.DTYPES[dtype] if dtype else prec.output_dtype(o, out_file)
    kwargs = _mask_kwargs(causal, causal_align, window, mask, scale, layout)
    rep = prec.check(o, q, k, v, dt, lse=lse_arr, top=top, with_model=not no_model, **kwargs)
    if as_json:
        emit_json(documents.check_doc(rep))
    else:
        out.print(render.check_report(rep, out_file, top))
    if not rep.verdict.passed:
        err.print(f"FAIL: {prec.fail_line(rep)}", markup=False, soft_wrap=True)
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------
# What the commands share: option checks, output files, step mode, the progress bar


def _trace_checks(s, name, row, form, threshold, dtype, precision, others) -> None:
    """trace's option checks, in this order: --row, --dtype's company, --rescale-threshold."""
    n_rows = np.atleast_2d(s).shape[0]
    if row >= n_rows:
        raise OsmError(f"{name}: --row {row} is out of range; it has {n_rows} row(s)")
    if dtype is None and precision is not None:
        raise OsmError("--precision needs --dtype")
    if dtype is not None and others:
        raise OsmError("--dtype does not combine with --order, --rescale-threshold, --csv, "
                       "--plot or --step")
    if dtype is None and threshold and form is not Form.rescale:
        raise OsmError("--rescale-threshold applies to --form rescale only")
    if dtype is None and not np.isfinite(threshold):
        raise OsmError("--rescale-threshold must be a finite number")


def _sweep_checks(files, qkv: bool, values, head_dim, mask_given: bool) -> None:
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


def _mask_kwargs(causal, causal_align, window, mask, scale, layout) -> dict:
    """attention's mask, scale and layout keywords from the shared options."""
    win = None if window is None else io.parse_pair(window, "--window")
    return dict(causal=causal, scale=scale, layout=layout.value, causal_align=causal_align.value,
                window=win, mask=None if mask is None else io.load_mask(mask))


def _attention_files(csv, plot, res, q, k, kwargs, files) -> None:
    """attention --csv and --plot: the traced row's tile table and the traced head's picture.

    The picture is drawn before either file is written, so a head it cannot draw leaves none.
    """
    b, h, i = res.traced
    png = None
    if plot is not None:
        hm = tilemap.head_probabilities(q, k, batch=b, head=h, rows=PLOT_LIMIT, cols=PLOT_LIMIT,
                                        block_q=res.block_q, block_k=res.block_k, **kwargs)
        png = plots.traced_head_png(hm, files[0] if len(files) == 1 else
                                    ", ".join(Path(f).name for f in files), i)
    if csv is not None:
        _save(csv, export.tiles_csv(res), "tile table of the traced row, CSV")
    if png is not None:
        _save(plot, png, f"probability matrix of batch {b}, head {h} with its tiles, PNG")


def _need_plot(plot) -> None:
    """--plot asks for matplotlib: say so before any work is done."""
    if plot is not None:
        plots.require_matplotlib()


def _save(path: Path, data: str | bytes | np.ndarray, what: str = "") -> None:
    """Write an output file (atomically): text, bytes, or an array as .npy; then say so on
    stderr, on one line whatever the width (scripts read the path back). The line names `what`
    the file holds; for an array, its shape ("wrote o.npy (3, 2)")."""
    if isinstance(data, np.ndarray):
        io.save_npy(path, data)
        about = str(tuple(data.shape))
    else:
        (io.save_text if isinstance(data, str) else io.save_bytes)(path, data)
        about = f"({what})"
    err.print(f"wrote {path} {about}", markup=False, soft_wrap=True)


def _present(step: bool, heads: list, pages: list, tables: list) -> bool:
    """Print the headers, then the tables; or, under --step in a terminal, each page (frame,
    count, unit) one key press at a time. False when the user quit early: print nothing more."""
    if _step_interactive(step) and all(count for _, count, _ in pages):
        getkey = _step_keys()
        for frame, count, unit in pages:
            if not _step_frames(frame, count, unit, getkey):
                return False
        return True
    for r in (*heads, *tables):
        out.print(r)
    return True


def _step_interactive(step: bool) -> bool:
    """--step in a terminal; asked for elsewhere, say once that the whole table follows."""
    if step and stepmode.interactive(sys.stdin, sys.stdout):
        return True
    if step:
        which = "output" if not sys.stdout.isatty() else "input"
        err.print(f"--step: standard {which} is not a terminal; showing the whole table")
    return False


def _step_keys():
    return stepmode.buffered(_getkey)


def _step_frames(frame, count: int, unit: str, getkey) -> bool:
    """Show frame(k) one key press at a time; False (and a note) when the user quit early."""
    shown = stepmode.step_through(out, frame, count, getkey)
    if shown < count:
        err.print(f"stopped at {unit} {shown} of {count}")
        return False
    return True


def _getkey() -> str:
    try:
        return typer.getchar()
    except (KeyboardInterrupt, EOFError):
        return "q"


class _progress:
    """A rich progress bar on stderr for runs over about a second, only on a terminal."""

    def __enter__(self):
        self.bar = None
        if not err.is_terminal:
            return None
        import time

        start = time.monotonic()

        def tick(done, total):
            if self.bar is None and time.monotonic() - start > 1.0 and done < total:
                self.bar = render.progress_bar(err)
                self.bar.start()
                self.task = self.bar.add_task("attention", total=total)
            if self.bar is not None:
                self.bar.update(self.task, completed=done)
            if self.bar is not None and done >= total:  # the run is over; its checks are not
                self.bar.stop()
                self.bar = None

        return tick

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


if __name__ == "__main__":  # pragma: no cover
    app()
