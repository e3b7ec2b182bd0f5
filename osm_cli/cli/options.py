"""The command line's choices and shared options, each declared once.

Choices are enums made from the lower layers' own tuples (a new update form or layout there is a
new choice here), taken from their names.py modules, which load no numpy: `osm --help` builds
every option from this module. Options that several commands share are Annotated types used by
each.
Leaves out: the option groups (groups.py), the commands.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from osm_cli.core.names import FORMS, LSE_BASES
from osm_cli.errors import OsmError
from osm_cli.flash.names import ALIGNS, KV_LAYOUTS, LAYOUTS, MASKED_LSE
from osm_cli.precision.names import (
    ACCUMS,
    ALIASES,
    CHECK_RULES,
    DTYPE_NAMES,
    GRAD_RULES,
    KERNELS,
    MMAS,
    PRECISIONS,
    canonical,
)
from osm_cli.studies import costmodel
from osm_cli.studies.names import ORDERS


def _choices(name: str, values) -> type[Enum]:
    """A str Enum whose members are `values` (member names: '-' → '_', a leading digit
    prefixed by 'n'), as Typer lists and parses choices."""
    def member(v: str) -> str:
        key = v.replace("-", "_")
        return f"n{key}" if key[0].isdigit() else key

    return Enum(name, [(member(v), v) for v in values], type=str)


Form = _choices("Form", (*FORMS, "both"))
UpdateForm = _choices("UpdateForm", FORMS)
Align = _choices("Align", ALIGNS)
Layout = _choices("Layout", LAYOUTS)
MaskedLse = _choices("MaskedLse", tuple(MASKED_LSE))
TileOrder = _choices("TileOrder", ORDERS)
PrecisionModel = _choices("PrecisionModel", PRECISIONS)
AccumDtype = _choices("AccumDtype", ACCUMS)
LseBase = _choices("LseBase", LSE_BASES)
GradRule = _choices("GradRule", GRAD_RULES)
CheckRule = _choices("CheckRule", CHECK_RULES)
Kernel = _choices("Kernel", KERNELS)
Mma = _choices("Mma", MMAS)


def bad_value(read, value):
    """read(value), the library's refusal (an OsmError) turned into a bad option value: exit 2
    with the usage lines and the library's words."""
    try:
        return read(value)
    except OsmError as exc:
        raise typer.BadParameter(str(exc)) from None


def dtype_name(value):
    """--dtype: a dtype name or alias, as its canonical name (a bad one exits 2)."""
    return None if value is None else bad_value(canonical, value)


def dtype_names(values):
    return None if not values else [dtype_name(v) for v in values]


def block_list(text: str) -> list[int]:
    try:
        blocks = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give whole numbers separated by commas") from None
    if not blocks or min(blocks) < 1:
        raise typer.BadParameter(f"{text!r}: block sizes must be at least 1")
    return blocks


def size(text: str) -> int:
    return bad_value(costmodel.parse_size, text)


def _short(name: str) -> list[str]:
    """A dtype's aliases as the help lists them: fp64, fp32, fp16, bf16, e4m3, e5m2."""
    return [a for a, n in ALIASES.items() if n == name][:1]


DTYPES_HELP = (f"{', '.join(DTYPE_NAMES)} "
               f"(or {', '.join(a for n in DTYPE_NAMES for a in _short(n))})")


def csv_option(table: str):
    """--csv FILE, writing `table` (its help names the command's table)."""
    return Annotated[Path | None, typer.Option(
        "--csv", metavar="FILE", help=f"Also write {table} to FILE as CSV.")]


def library_checked(check: str):
    """An option's callback that runs the library's own check of its value (flash/options.py)
    and turns its refusal into a bad option value (exit 2); numpy is loaded only for a value
    given."""
    def callback(value):
        if value is not None:
            from osm_cli.flash import options

            bad_value(getattr(options, check), value)
        return value

    return callback


# --scale: any finite number (0 and negative ones are legal, and get a note)
finite_scale = library_checked("check_scale")


def window_pair(value):
    """--window's callback: LEFT,RIGHT read and its sides checked by the library (io.parse_pair,
    flash.masks.check_window), a refusal a bad option value (exit 2)."""
    if value is not None:
        from osm_cli.flash.masks import check_window
        from osm_cli.io import parse_pair

        bad_value(lambda text: check_window(parse_pair(text, "the window")), value)
    return value


def show_version(value: bool) -> None:
    """--version: print osm's version and exit."""
    if value:
        from osm_cli import __version__

        typer.echo(f"osm {__version__}")
        raise typer.Exit()


VersionOpt = Annotated[bool, typer.Option(
    "--version", callback=show_version, is_eager=True, help="Print osm's version and exit.")]
# Every command but overflow-demo.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print strict JSON instead.")]
# Options that attention, check, sweep and trace share.
CausalOpt = Annotated[bool, typer.Option("--causal", help="Causal mask.")]
CausalAlignOpt = Annotated[
    Align, typer.Option("--causal-align", help="bottom-right (FlashAttention) or top-left "
                        "(PyTorch is_causal) when Q and K lengths differ.")
]
WindowOpt = Annotated[
    str | None, typer.Option("--window", "--window-size", callback=window_pair,
                             help="Sliding window LEFT,RIGHT: "
                             "keys seen on each side of the diagonal (-1 = unbounded).")
]
MaskOpt = Annotated[
    str | None, typer.Option("--mask", "--attn-mask", help=".npy mask broadcastable to "
                             "(B, H, t, s): bool (True = attend) or float (added to the "
                             "scores).")
]
ScaleOpt = Annotated[float | None, typer.Option(
    "--scale", "--softmax-scale", callback=finite_scale,
    help="Score scale (default 1/sqrt(d)).")]
LayoutOpt = Annotated[
    Layout, typer.Option("--layout", help="bhnd (PyTorch) or bnhd (FlashAttention).")
]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", callback=dtype_name, help=f"Round inputs to this dtype: {DTYPES_HELP}.")]
InputDtypeOpt = Annotated[str | None, typer.Option(
    "--input-dtype", callback=dtype_name, metavar="D",
    help="Read raw 2- or 1-byte values in .npy/.npz files (|V2, |V1: how ml_dtypes saves "
    "bfloat16 and float8) as this dtype: bf16, fp16, e4m3, e5m2.")]
PrecisionOpt = Annotated[PrecisionModel | None, typer.Option(
    "--precision", help="With --dtype: flash (a FlashAttention kernel: fp32 state, P rounded "
    "before P·V; the default) or naive (everything in the dtype).")]
AccumOpt = Annotated[AccumDtype | None, typer.Option(
    "--accum", help="With --dtype: the state's dtype (default float32; float64 for float64).")]
# The kernel preset a model runs (precision/presets.py), on attention, backward, check, sweep.
KernelOpt = Annotated[Kernel | None, typer.Option(
    "--kernel", help="The kernel whose schedule and arithmetic the model follows: fa2 "
    "(FlashAttention-2, PyTorch's flash SDPA), fa4 (FlashAttention-4 on Hopper), fa4-sm100 "
    "(FlashAttention-4 on Blackwell, modelled from source, the FP8 one) or tiles (osm's own "
    "readable loop). Default: fa2 for a 16-bit --dtype, fa4-sm100 for FP8, tiles otherwise.")]
MmaOpt = Annotated[Mma | None, typer.Option(
    "--mma", help="A kernel preset's matmuls: tensor-core (the default: the tensor cores' "
    "truncating float32 accumulation, bit-faithful) or blas (numpy's float32 BLAS: within an "
    "ulp, about twice as fast on a large run). osm's own tiles: blas.")]


def descale_option(which: str):
    """--q-descale, --k-descale, --v-descale FILE: FP8's descale factors (B, Hkv)."""
    return Annotated[str | None, typer.Option(
        f"--{which}-descale", metavar="FILE", help=f"FP8 (fa4-sm100): {which.upper()}'s descale "
        "factors, a float32 tensor file of shape (B, Hkv); the stored values are x / descale.")]


QDescaleOpt, KDescaleOpt, VDescaleOpt = (descale_option(w) for w in "qkv")
# Options shared by trace and attention (sweep's --csv is the same option, naming its table).
CsvOpt = csv_option("the step table")
SweepCsvOpt = csv_option("the sweep table")
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --order shuffle.")]
RandomOpt = Annotated[str | None, typer.Option(
    "--random", metavar="B,H,N,d", help="No files: seeded standard-normal Q, K, V of shape "
    "(B, H, N, d) (--seed picks them).")]
InputSeedOpt = Annotated[int, typer.Option(
    "--seed", help="Seed of --random's Q, K, V and of a dO made up when none is given.")]
# common.exports gives a command these two (trace, attention; backward with one line)
SvgOpt = Annotated[Path | None, typer.Option(
    "--svg", metavar="FILE.svg", help="Also write what is printed to FILE as SVG (a picture "
    "of the terminal, for slides).")]
HtmlOpt = Annotated[Path | None, typer.Option(
    "--html", metavar="FILE.html", help="Also write an interactive page to FILE, one file that "
    "works offline: each step lit, its state and arithmetic, forward and back with the arrow "
    "keys; FILE.html#step=K opens at step K (what is printed is at its foot).")]
StepOpt = Annotated[bool, typer.Option(
    "--step", help="In a terminal, show one block (attention: K/V tile; backward: the key's Q "
    "tiles, then the query's K/V tiles) at a time (Enter or space: next, b: back, q: quit).")]
ExplainOpt = Annotated[bool, typer.Option(
    "--explain", help="Under each step, its arithmetic with the actual numbers "
    "(m = max(2, 5) = 5, α = exp(2 − 5) = …; backward: dS = P∘(dP − D), dQ_i += scale·dS·K_j "
    "…); always on in step mode.")]
PLOT_LIMIT = 512  # attention --plot draws at most this many queries and keys of the head
# attention's tile size options, shared with sweep (where --block-k is the swept size).
BlockQOpt = Annotated[
    int | None, typer.Option("--block-q", min=1, help="Query rows per tile (default 128).")
]
# Options shared by trace and sweep.
ValuesOpt = Annotated[
    str | None, typer.Option("--values", help='Scores inline, e.g. "1,2,5,3".')
]
# The traced row of attention and backward.
BatchOpt = Annotated[int, typer.Option("--batch", min=0, help="Batch of the traced row.")]
HeadOpt = Annotated[int, typer.Option("--head", min=0, help="Query head of the traced row.")]
MAX_QUERIES = 128  # --query's rows at most: one Q tile of FA2's 128


def query_rows(values: list[str] | None):
    """--query's rows, as a list: one query index, or several: a range 0:4 (rows 0 to 3, as the
    tables write keys), a list 0,2,5, or --query given more than once (common.traced reads
    it)."""
    if not values:
        return [0]
    rows: list[int] = []
    for text in values:
        for part in text.replace(" ", "").split(","):
            try:
                if ":" in part:
                    a, b = (int(x) for x in part.split(":"))
                    if not 0 <= a < b:
                        raise typer.BadParameter(f"{part!r}: a range I:J needs 0 <= I < J (rows "
                                                 "I to J − 1)")
                    rows += range(a, b)
                else:
                    rows.append(int(part))
            except ValueError:
                raise typer.BadParameter(f"{text!r}: give a query index (5), a range (0:4) or "
                                         "a list (0,2,5)") from None
    bad = [r for r in rows if r < 0]
    if bad:
        raise typer.BadParameter(f"query {bad[0]} is negative: queries count from 0")
    twice = sorted({r for r in rows if rows.count(r) > 1})
    if twice:
        raise typer.BadParameter(f"query {twice[0]} is named twice: give each row once")
    if len(rows) > MAX_QUERIES:
        raise typer.BadParameter(f"{len(rows)} rows: trace at most {MAX_QUERIES} at once (one "
                                 "Q tile of 128 rows)")
    return rows


QueryOpt = Annotated[list[str] | None, typer.Option(
    "--query", metavar="I | I:J | I,J,…", callback=query_rows, show_default=False,
    help="Query row to trace (default 0); several side by side, the m and l vectors of a Q "
    "tile: a range 0:4 (rows 0 to 3) or a list 0,2,5.")]
NoReferenceOpt = Annotated[
    bool, typer.Option("--no-reference", help="Skip the float64 reference check.")
]
ShowAllOpt = Annotated[bool, typer.Option("--all", help="Show every tile and component.")]


# --softcap: a positive finite number (FlashAttention's softcap; 0 means none there)
positive_softcap = library_checked("check_softcap")


# The kernels' own inputs (issue: what real kernels take), taken by a command as the group
# groups.Inputs (the mods: groups.Mods); their names are the kernels' argument names.
KvLayout = _choices("KvLayout", KV_LAYOUTS)
SoftcapOpt = Annotated[float | None, typer.Option(
    "--softcap", callback=positive_softcap, help="Logit softcap C: a scaled score s becomes "
    "C·tanh(s/C), before ALiBi and the masks (Gemma 2: 50).")]
AlibiOpt = Annotated[str | None, typer.Option(
    "--alibi", "--alibi-slopes", metavar="SLOPES.npy|auto", help="ALiBi: −slope·|i + s − t "
    "− j| added to the scaled scores; slopes (H,) or (B, H), or auto for the standard "
    "geometric ones.")]
SinksOpt = Annotated[str | None, typer.Option(
    "--sinks", "--learnable-sink", metavar="SINKS.npy", help="Attention sinks: one logit per "
    "query head (H,), in the softmax's denominator only.")]
CuSeqlensQOpt = Annotated[str | None, typer.Option(
    "--cu-seqlens-q", metavar="F.npy", help="varlen: Q packed (total_q, H, d); sequence b is "
    "rows cu[b]:cu[b+1] (int, length B + 1, from 0).")]
CuSeqlensKOpt = Annotated[str | None, typer.Option(
    "--cu-seqlens-k", metavar="F.npy", help="varlen: K/V packed (total_k, Hkv, d).")]
SequsedKOpt = Annotated[str | None, typer.Option(
    "--seqused-k", metavar="F.npy", help="Keys each sequence uses (B,): a paged cache's length.")]
PageTableOpt = Annotated[str | None, typer.Option(
    "--page-table", metavar="F.npy", help="Paged KV: (B, max_pages) page indices into K/V "
    "caches (num_pages, page_size, Hkv, d); needs --seqused-k.")]
KvLayoutOpt = Annotated[KvLayout, typer.Option(
    "--kv-layout", help="A paged cache's layout: nhd (FlashAttention) or hnd (FlashInfer).")]
ScoreModOpt = Annotated[str | None, typer.Option(
    "--score-mod", metavar="SPEC", help="FlexAttention's score_mod on the scaled scores, "
    "before the masks: softcap:C, alibi[:SLOPES.npy], relative-bias:TABLE.npy (H, 2N−1), "
    "tanh-gate, or python:FILE.py:FUNCTION (docs/score-mod.md).")]
MaskModOpt = Annotated[list[str] | None, typer.Option(
    "--mask-mod", metavar="SPEC", help="FlexAttention's mask_mod (True = attend): causal, "
    "sliding:W, document:DOC_IDS.npy, prefix-lm:P, chunked:C, python:FILE.py:FUNCTION; "
    "repeat to and them.")]
SeqOpt = Annotated[int | None, typer.Option(
    "--seq", min=0, help="varlen or paged: the sequence of the traced row (--query counts "
    "within it).")]
