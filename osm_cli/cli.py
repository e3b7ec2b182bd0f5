"""The `osm` command line: parse options, call io -> core -> render, map errors to exit codes.

Exit codes: 0 success; 1 bad input ("Error: …" on stderr); 2 bad option values (Typer).
Nothing else lives here.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

from . import io, render
from .errors import OsmError

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


class Form(str, Enum):
    rescale = "rescale"
    merge = "merge"
    both = "both"


@app.command()
@guarded
def trace(
    scores: Annotated[
        str | None,
        typer.Argument(help="Scores: text, .csv, .npy/.npz file, or '-' for standard input."),
    ] = None,
    values: Annotated[
        str | None, typer.Option("--values", help='Scores inline, e.g. "1,2,5,3".')
    ] = None,
    block: Annotated[int, typer.Option("--block", "-b", min=1, help="Scores per block.")] = 2,
    form: Annotated[Form, typer.Option("--form", help="Update form to show.")] = Form.rescale,
    row: Annotated[int, typer.Option("--row", min=0, help="Row of a matrix to trace.")] = 0,
    show_all: Annotated[bool, typer.Option("--all", help="Show every block and element.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead.")] = False,
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
    from .online import online_softmax
    from .reference import naive_softmax, stable_softmax

    s, name = io.load_scores(scores, values)
    rows = np.atleast_2d(s)
    if row >= rows.shape[0]:
        raise OsmError(f"{name}: --row {row} is out of range; it has {rows.shape[0]} row(s)")
    forms = ["rescale", "merge"] if form is Form.both else [form.value]
    traces = [online_softmax(s, block, f, row=row) for f in forms]
    stable = stable_softmax(s)
    naive = naive_softmax(s)
    t = traces[0]
    p2, st2, nv2 = (np.atleast_2d(a) for a in (t.probabilities, stable, naive))
    diff_rows = np.abs(p2 - st2).max(axis=-1)
    m, l, lse = (np.atleast_1d(a) for a in (t.m, t.l, t.lse))
    if as_json:
        emit_json(_trace_json(traces, s, stable, naive, diff_rows, block, form.value, row))
        return
    out.print(render.trace_header(name, rows.shape[0], rows.shape[1], row, block))
    for tr in traces:
        out.print(render.step_table(tr, show_all, out.width))
    out.print(render.final_line(m[row], l[row], lse[row]))
    if len(traces) == 2:
        both = np.abs(np.atleast_2d(traces[1].probabilities) - p2).max()
        out.print(render.agreement("rescale vs merge", float(both)))
    out.print(render.element_table(rows[row], p2[row], st2[row], nv2[row], show_all))
    out.print(render.agreement("online vs one-shot stabilized", float(diff_rows[row])))
    if rows.shape[0] > 1:
        out.print(render.rows_table(m, l, lse, diff_rows, show_all))


def _trace_json(traces, s, stable, naive, diff_rows, block, form, row):
    t = traces[0]
    doc = {
        "block": block,
        "form": form,
        "row": row,
        "shape": list(s.shape),
        "steps": [_step_json(st) for st in t.steps],
        "m": t.m,
        "l": t.l,
        "lse": t.lse,
        "lse_base": "e",
        "probabilities": t.probabilities,
        "reference": stable,
        "naive": naive,
        "max_abs_diff": float(diff_rows.max()),
    }
    if len(traces) == 2:
        doc["merge_steps"] = [_step_json(st) for st in traces[1].steps]
        doc["forms_max_abs_diff"] = float(np.abs(traces[1].probabilities - t.probabilities).max())
    return doc


def _step_json(st) -> dict:
    d = {
        "block": st.block, "start": st.start, "stop": st.stop, "block_max": st.block_max,
        "m_prev": st.m_prev, "m": st.m, "scale": st.scale, "l_prev": st.l_prev, "l": st.l,
        "rescaled": st.rescaled,
    }
    if st.block_l is not None:
        d.update(block_m=st.block_m, block_l=st.block_l, block_weight=st.block_weight)
    return d


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


@app.command()
@guarded
def attention(
    files: Annotated[
        list[str], typer.Argument(help="Q K V as .npy files, or one .npz holding q, k, v.")
    ],
    causal: Annotated[bool, typer.Option("--causal", help="Causal mask.")] = False,
    causal_align: Annotated[
        Align, typer.Option("--causal-align", help="bottom-right (FlashAttention) or top-left "
                            "(PyTorch is_causal) when Q and K lengths differ.")
    ] = Align.bottom_right,
    window: Annotated[
        str | None, typer.Option("--window", help="Sliding window LEFT,RIGHT (-1 = unbounded).")
    ] = None,
    mask: Annotated[
        str | None, typer.Option("--mask", help=".npy mask broadcastable to (B, H, t, s): "
                                 "bool (True = attend) or float (added to the scores).")
    ] = None,
    scale: Annotated[
        float | None, typer.Option("--scale", help="Score scale (default 1/sqrt(d)).")
    ] = None,
    block_q: Annotated[
        int | None, typer.Option("--block-q", min=1, help="Query rows per tile (default 128).")
    ] = None,
    block_k: Annotated[
        int | None, typer.Option("--block-k", min=1,
                                 help="Keys per tile (default 128 for d <= 64, else 64).")
    ] = None,
    layout: Annotated[
        Layout, typer.Option("--layout", help="bhnd (PyTorch) or bnhd (FlashAttention).")
    ] = Layout.bhnd,
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
    seed: Annotated[int, typer.Option("--seed", help="Seed of --order shuffle.")] = 0,
    rescale_threshold: Annotated[
        float, typer.Option("--rescale-threshold", min=0.0, help="Lazy rescale (FA4): move m "
                            "only when a tile's max exceeds it by more than τ (natural log).")
    ] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead.")] = False,
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
    """
    att = importlib.import_module("osm_cli.attention")  # the package's `attention` is the function

    q, k, v = io.load_qkv(files)
    win = None if window is None else io.parse_pair(window, "--window")
    mask_arr = None
    if mask is not None:
        mask_arr = io.load_array(Path(mask), mmap=False)
        io.check_mask(mask_arr, mask)
    kwargs = dict(causal=causal, scale=scale, layout=layout.value,
                  causal_align=causal_align.value, window=win, mask=mask_arr)
    run_kw = dict(block_q=block_q, block_k=block_k, masked_lse=masked_lse.value, form=form.value,
                  trace_at=(batch, head, query), threshold=rescale_threshold, **kwargs)
    tile_order = None
    if order is not TileOrder.forward:
        from .merge import block_order

        s_len = att.as_bhnd(k, layout.value, "K").shape[2]
        bk = block_k or att.default_blocks(q.shape[-1])[1]
        tile_order = block_order(-(-s_len // bk), order.value, seed)
    with _progress() as progress:
        res = att.attention(q, k, v, progress=progress, order=tile_order, **run_kw)
    split_run = None if splits is None else att.split_kv(q, k, v, splits, res, **run_kw)
    errors, ref_row = None, None
    if not no_reference:
        ref_out, ref_lse = att.reference(q, k, v, **kwargs)
        errors = att.errors(res, ref_out, ref_lse)
        ref_row = att.row_of(ref_out, res.traced, layout.value)
    if out_path:
        io.save_npy(Path(out_path), res.out)
    if lse_path:
        io.save_npy(Path(lse_path), res.lse)
    if as_json:
        doc = att.summary(res, errors, ref_row)
        if split_run is not None:
            doc["splits"] = [vars(s) for s in split_run.splits]
            doc["splits_max_abs_diff"] = split_run.max_abs_diff
            doc["splits_max_lse_diff"] = split_run.max_lse_diff
        emit_json(doc)
        return
    out.print(render.attention_summary(res, errors))
    out.print(render.attention_trace(res, ref_row, out.width, show_all))
    if split_run is not None:
        out.print(render.split_table(split_run))


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

        return tick

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


@app.command("overflow-demo")
@guarded
def overflow_demo(
    values: Annotated[
        list[float] | None, typer.Argument(help="Scores to try (default 100 102 99).")
    ] = None,
):
    """Show why naive softmax overflows and how subtracting the max fixes it.

    For float16, bfloat16, float32 and float64: exp of each value, naive, stabilized and online
    softmax, the overflow threshold ln(max finite) of each, and a fully masked row.

    \b
    Examples:
      osm overflow-demo
      osm overflow-demo 10 11 12
    """
    from .precision import overflow_demo as demo

    xs = values or [100.0, 102.0, 99.0]
    if any(np.isnan(x) for x in xs):
        raise OsmError("values must not be NaN")
    out.print(render.overflow_tables(demo(xs)))


if __name__ == "__main__":  # pragma: no cover
    app()
