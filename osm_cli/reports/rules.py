"""The rules a command's options obey before it runs, each checked here once and worded in
parameter names (the command line prints each `parameter` as its flag, cli/flags.py): what a
run's views (csv, plot, step, html) can show, which options go together, what trace and
sweep take.

Leaves out: the values' own checks (flash/options.py, io/ and the layers below make them for
every entry point), running anything.

Example: attention_views(packed=True, plot=True) raises "`plot`, `step` and `html` draw one
dense head; …"
"""

from __future__ import annotations

import math

import numpy as np

from osm_cli.errors import OsmError

WHOLE = 4096  # a trace of up to this many blocks keeps every step (more: the first and last)


def attention_views(packed: bool = False, naive: bool = False, *, csv: bool = False,
                    plot: bool = False, step: bool = False, html: bool = False) -> None:
    """attention's views: one dense head drawn (not a varlen or paged batch), the tiles of a
    tiled run (not one-shot attention in the dtype)."""
    if packed and (plot or step or html):
        raise OsmError("`plot`, `step` and `html` draw one dense head; a varlen or paged batch "
                       "runs its sequences one by one (its trace is in the table, `csv`, "
                       "`json`)")
    if naive and (csv or plot or step or html):
        raise OsmError("`csv`, `plot`, `step` and `html` show the tiles of the tiled run; "
                       "`precision` naive is one-shot attention")


def backward_views(packed: bool = False, *, html: bool = False) -> None:
    """backward's page draws one dense head."""
    if packed and html:
        raise OsmError("`html` draws one dense head; a varlen or paged batch runs its "
                       "sequences one by one (its traces are in the tables, `csv`, `json`)")


def saved_forward(o, lse) -> None:
    """The forward's saved O and LSE come together, or neither (osm runs its own)."""
    if (o is None) != (lse is None):
        raise OsmError("give `o` and `lse` together (the forward's saved O and LSE), or "
                       "neither (osm runs its own forward)")


def trace_mods(softcap, score_mod) -> None:
    if softcap is not None and score_mod is not None:
        raise OsmError("give `softcap` or `score_mod` (softcap:C is one), not both")


def trace_options(s, name: str, row: int, form: str, threshold: float, dtype, precision,
                  others: bool) -> None:
    """trace's options, in this order: row, dtype's company (others: order,
    rescale_threshold, csv, plot or step asked for), rescale_threshold."""
    n_rows = np.atleast_2d(s).shape[0]
    if row >= n_rows:
        raise OsmError(f"{name}: `row` {row} is out of range; it has {n_rows} row(s)")
    if dtype is None and precision is not None:
        raise OsmError("`precision` needs `dtype`")
    if dtype is not None and others:
        raise OsmError("`dtype` does not combine with `order`, `rescale_threshold`, `csv`, "
                       "`plot` or `step`")
    if dtype is None and threshold and form != "rescale":
        raise OsmError("`rescale_threshold` applies to `form` rescale only")
    if dtype is None and not math.isfinite(threshold):
        raise OsmError("`rescale_threshold` must be a finite number")


def trace_blocks(s, block: int, html: bool) -> int:
    """The blocks a trace folds; a page holds at most WHOLE."""
    blocks = -(-np.atleast_2d(s).shape[-1] // block)
    if html and blocks > WHOLE:
        raise OsmError(f"`html` shows every block; {blocks} blocks are more than the page holds "
                       f"({WHOLE}): a larger `block` makes fewer")
    return blocks


def sweep_options(files, qkv: bool, values, head_dim, scored: bool, modelled: bool) -> None:
    """sweep's options: values and head_dim are for scores, the score options (scored) and a
    kernel's model (modelled: dtype, kernel, mma) for Q/K/V; scores come from one file at
    most."""
    if qkv and (values is not None or head_dim is not None):
        raise OsmError("`values` and `head_dim` are for scores; Q/K/V carry their own keys and "
                       "head dim")
    if not qkv and len(files) > 1:
        raise OsmError(f"sweep takes SCORES, or Q K V (three .npy files or one .npz with q, k, "
                       f"v); got {len(files)} files")
    if not qkv and scored:
        raise OsmError("`causal`, `causal_align`, `window_size`, `attn_mask`, `softmax_scale` "
                       "and `layout` are for Q/K/V; scores carry their mask as -inf")
    if not qkv and modelled:
        raise OsmError("`dtype`, `kernel` and `mma` model a kernel on Q/K/V; scores run the "
                       "online softmax alone")


def bundle_unused(path: str, unused: list, strict: bool) -> None:
    """check: a bundle's arrays check does not use are refused under strict."""
    if unused and strict:
        raise OsmError(f"{path}: holds {', '.join(unused)}, which osm check does not use "
                       "(`strict` refuses them)")


__all__ = ["WHOLE", "attention_views", "backward_views", "bundle_unused", "saved_forward",
           "sweep_options", "trace_blocks", "trace_mods", "trace_options"]
