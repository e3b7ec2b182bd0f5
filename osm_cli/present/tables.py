"""The other commands' tables: overflow-demo, osm merge, osm sweep and osm cost.

Leaves out: computing anything (studies/, reports/merge.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Group
from rich.text import Text

from .format import Table, bytes_text, fit, num, values


def chunks(n: int, k: int) -> list[range]:
    """0..n-1 in runs of k. Example: chunks(5, 2) -> [range(0, 2), range(2, 4), range(4, 5)]"""
    return [range(i, min(i + k, n)) for i in range(0, n, k)]


def overflow_tables(demo, width: int = 100) -> Group:
    """Three tables: exp of each value per dtype, softmax by each method, and the all −inf row.

    One column per value: where they do not fit `width`, the limits get a table of their own
    and the values' columns are cut into as few tables as fit."""
    xs = demo.values
    n = len(xs)
    title = f"exp(x) in each dtype (x = {', '.join(f'{x:g}' for x in xs)})"

    def limits_table(cols) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
        t.add_column("dtype", no_wrap=True)
        for name in ("largest finite", "exp overflows\nabove", "exp underflows\nbelow"):
            t.add_column(name, justify="right", no_wrap=True)
        for j in cols:
            t.add_column(f"exp({xs[j]:g})", justify="right", no_wrap=True)
        for d in demo.rows:
            t.add_row(d.dtype, num(d.max_finite, 4), num(d.overflow_at, 6),
                      num(d.underflow_at, 6), *(num(d.exp[j], 4) for j in cols))
        return t

    def exp_table(cols) -> Table:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        t.add_column("dtype", no_wrap=True)
        for j in cols:
            t.add_column(f"exp({xs[j]:g})", justify="right", no_wrap=True)
        for d in demo.rows:
            t.add_row(d.dtype, *(num(d.exp[j], 4) for j in cols))
        return t

    def heads(k: int | None) -> Group:  # k: exp columns per table; None: beside the limits
        if k is None:
            return Group(limits_table(range(n)))
        return Group(limits_table(()), *(exp_table(c) for c in chunks(n, k)))

    def softmax(k: int) -> Group:
        tables = []
        for c in chunks(n, k):
            t = Table(title=None if tables else "softmax(x)", box=box.SIMPLE_HEAD,
                      title_justify="left", pad_edge=False)
            t.add_column("dtype", no_wrap=True)
            t.add_column("method", no_wrap=True)
            for i in c:
                t.add_column(f"p[{i}]", justify="right", no_wrap=True)
            for d in demo.rows:
                if not d.fits:
                    continue
                for method, p in (("naive", d.naive), ("stabilized", d.stable),
                                  ("online", d.online)):
                    t.add_row(d.dtype if method == "naive" else "", method,
                              *(num(p[i], 6) for i in c))
                t.add_section()
            tables.append(t)
        return Group(*tables)

    masked = Table(
        title="a fully masked row, x = [-inf, -inf, -inf] (float32)",
        box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
    )
    masked.add_column("method")
    masked.add_column("probabilities")
    masked.add_column("why", ratio=1)
    for method, p, why in demo.masked:
        masked.add_row(method, values(p, 6), why)
    per_table = range(n, 0, -1)
    return Group(
        *fit(heads, width, (None, *per_table), part=None).renderables,
        Text(demo.overflow_note + "\n"), *fit(softmax, width, per_table, part=None).renderables,
        Text(""), masked, Text(demo.masked_note)
    )


def overflow_report(demo, width: int = 100) -> Group:
    """overflow-demo: its tables, then the values as each dtype holds them, if a dtype moved any
    (each fit to `width`)."""
    moved = any(not np.array_equal(r.held, demo.values) for r in demo.rows)
    held = [fit(lambda k: held_table(demo, k), width, range(len(demo.values), 0, -1),
                part=None)] if moved else []
    return Group(overflow_tables(demo, width), *held)


def held_table(demo, per_table: int | None = None) -> Group:
    """overflow-demo: the values as each dtype holds them (shown when a dtype moved them), in
    tables of `per_table` values (default: all in one)."""
    n = len(demo.values)
    tables = []
    for c in chunks(n, per_table or n):
        t = Table(title=None if tables else "x as each dtype holds it", box=box.SIMPLE_HEAD,
                  title_justify="left", pad_edge=False)
        t.add_column("dtype", no_wrap=True)
        for i in c:
            t.add_column(f"x[{i}] = {demo.values[i]:g}", justify="right", no_wrap=True)
        for d in demo.rows:
            t.add_row(d.dtype, *(num(d.held[i], 6) for i in c))
        tables.append(t)
    return Group(*tables)


def merge_table(names: Sequence[tuple[str, str]], rep, width: int = 100) -> Group:
    """osm merge (merge.MergeReport): one row per split (empty rows, LSE and weight ranges, the
    chosen row), then the merged result; names are the (O, LSE) file pairs. Where the table does
    not fit `width`, the files are listed above it, then its numbers get fewer digits."""
    table = fit(lambda v: _merge_splits(names, rep, *v), width,
                ((True, 8, 5), (False, 8, 5), (False, 6, 4), (False, 5, 3)), part=None)
    return Group(*table.renderables, _merged_summary(rep))


def _merge_splits(names, rep, files_column: bool, d: int, dr: int) -> Group:
    stats, row = rep.stats, rep.row
    base = "log2" if rep.merged.lse_base == "2" else "natural log"
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
              title=f"splits (LSE in {base}; weight = exp(LSE_s − L), L = logsumexp LSE_s)")
    for name in ("split", "files O, LSE", "empty rows", "+inf", "LSE range", "weight range",
                 f"row {row}: LSE_s", "weight"):
        if files_column or not name.startswith("files"):
            t.add_column(name, justify="left" if name.startswith("files") else "right",
                         no_wrap=not name.startswith("files"))
    files = [f"{Path(o_name).name}, {Path(l_name).name}" for o_name, l_name in names]
    for st, file, row_lse, row_w in zip(stats, files, rep.row_lses, rep.row_weights,
                                        strict=True):
        if st.empty < st.rows and None not in (st.lse_min, st.weight_min):
            lse_range = Text.assemble(num(st.lse_min, dr), " … ", num(st.lse_max, dr))
            w_range = Text.assemble(num(st.weight_min, dr - 1), " … ", num(st.weight_max, dr - 1))
        else:
            lse_range = w_range = Text("all empty", style="dim")
        t.add_row(
            str(st.split), *([file] if files_column else []), f"{st.empty}/{st.rows}",
            str(st.pos_inf), lse_range, w_range, num(row_lse, d), num(row_w, d),
        )
    if files_column:
        return Group(t)
    listed = "\n".join(f"split {st.split}: {file}" for st, file in zip(stats, files, strict=True))
    return Group(Text(listed), t)


def _merged_summary(rep) -> Text:
    merged, row = rep.merged, rep.row
    base = "log2" if merged.lse_base == "2" else "natural log"
    live = merged.lse[np.isfinite(merged.lse)]
    summary = Text.assemble(
        f"merged: O {tuple(merged.out.shape)}, LSE {tuple(merged.lse.shape)} ({base}); ",
        f"{rep.empty_rows} of {merged.lse.size} row(s) empty in every split (O = 0, LSE = -inf)",
        *((";\nLSE range ", num(live.min(), 8), " … ", num(live.max(), 8)) if live.size else ()),
        f"\nrow {row}: L = ", num(rep.row_lse, 10), ", O[:4] = ", values(rep.row_out, 8, 4),
    )
    return summary


def attention_sweep_about(result, shapes, opts, accum: str) -> str:
    """osm sweep Q K V: the `about` lines of sweep_table (shapes, mask, sizes, state dtype)."""
    masks = [f"causal ({opts.causal_align})"] if opts.causal else []
    masks += [] if opts.window is None else ["window {},{}".format(*opts.window)]
    masks += [] if opts.mask is None else ["--mask"]
    sq, sk, sv = (tuple(x) for x in shapes)
    run = f"the tiled forward at each block_k (state in {accum})"
    if getattr(result, "dtype", None) is not None:
        matmuls = ("the tensor cores' matmuls" if result.mma == "tensor-core"
                   else "BLAS's matmuls")
        run = (f"kernel {result.kernel}'s model in {result.dtype} at each block_k (its own "
               f"tile width replaced; {matmuls})" if result.kernel != "tiles" else
               f"osm's tiles, the flash model in {result.dtype}, at each block_k")
    return (f"Q {sq}  K {sk}  V {sv}, {', '.join(masks) or 'no mask'}\nB = {result.batch}, "
            f"H = {result.heads}, {result.n_q} queries × {result.n_k} keys per head: {run}")


def sweep_table(result, source: str, about: str | None = None, width: int = 100) -> Group:
    """osm sweep: per block size the measured error and rescales beside the modelled costs.

    about: for a Q/K/V sweep, the lines that describe the run (shapes, mask, state dtype); the
    error is then of O, the tiles are computed or skipped, and when the mask skipped tiles a
    column gives FA1's block-sparse traffic in place of the std/tiled ratio. Where the table
    does not fit `width`, its headers take two lines.
    """
    r = result
    qkv = about is not None
    sparse = qkv and any(x.sparse for x in r.rows)
    first = f"{source}: {about}" if qkv else (
        f"{source}: {r.n_q} row(s) × {r.n_k} keys, measured per block size")
    d_text = f"d = {r.d} (Q's)" if qkv else f"head dim d = {r.d}"
    head = Text(
        f"{first}\n"
        f"model: {d_text}, {r.dtype_bytes} bytes per element, tiles of {r.block_q} "
        f"query rows, SRAM {bytes_text(r.sram_bytes, True)}\n"
        f"(M = {r.sram_bytes // r.dtype_bytes} elements: FA1 would pick B_r = {r.fa1_block[0]}, "
        f"B_c = {r.fa1_block[1]})\nstandard attention, forward: {bytes_text(r.hbm_standard)} "
        "of HBM traffic (model)"
    )
    names = ("block", "tiles", "skipped" if qkv else "masked", "rescales",
             "max |O−ref|" if qkv else "max |p−ref|", "max |ΔLSE|", "tile bytes", "fits",
             "HBM tiled", "HBM skip" if sparse else "std/tiled")

    def table(v) -> Group:  # narrower: headers on two lines at their space, one space between
        two_lines, gap = v
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  padding=(0, 1) if gap == 2 else (0, 0))
        for name in names:
            t.add_column(name.replace(" ", "\n", 1) if two_lines else name, justify="right",
                         no_wrap=True)
        _sweep_rows(t, r, sparse)
        return Group(t)

    what = ("skipped: tiles the mask hides entirely, not computed (tiles counted per head)."
            if qkv else "masked: tiles whose scores are all -inf (a kernel with the mask skips "
            "them).")
    skip = ("\nHBM skip: the same model with the skipped tiles left out (FA1 Prop. 4, "
            "block-sparse)." if sparse else "")
    note = Text(
        "tile bytes: one tile step's working set, Q_i, K_j, V_j in the input dtype and S, the "
        f"O accumulator, m, l in fp32.\n{what}\nHBM bytes (forward) are FA1's I/O model "
        f"(Algorithms 0 and 1), not a measurement.{skip}",
        style="dim",
    )
    return Group(head, *fit(table, width, ((False, 2), (True, 2), (True, 1)), part=0).renderables,
                 note)


def _sweep_rows(t: Table, r, sparse: bool) -> None:
    for row in r.rows:
        m = row.measure
        last = (bytes_text(row.hbm_skipping) if sparse else
                f"{r.hbm_standard / row.hbm_flash:.3g}×" if row.hbm_flash else "-")
        t.add_row(
            str(row.block), str(m.tiles), str(m.skipped), str(m.rescales), num(m.max_error, 3),
            num(m.lse_error, 3), bytes_text(row.tile_bytes, True),
            Text("yes", style="green") if row.fits else Text("no", style="bold red"),
            bytes_text(row.hbm_flash), last,
        )


def cost_table(c) -> Group:
    """osm cost: modelled HBM traffic of standard and tiled attention for one shape."""
    head = Text(
        f"N = {c.N}, d = {c.d}, {c.heads} heads, batch {c.batch}, {c.dtype_bytes} bytes per "
        f"element\nSRAM {bytes_text(c.sram_bytes, True)}: M = {c.sram_bytes // c.dtype_bytes} "
        f"elements, FA1 tiles B_c = ceil(M/4d) = {c.block_k}, B_r = min(B_c, d) = {c.block_q}"
    )
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("HBM reads + writes (model)", "standard", "tiled (FlashAttention)", "ratio"):
        t.add_column(name, justify="left" if name.startswith("HBM") else "right")
    for label, std, fl in (
        ("forward", c.standard_fwd, c.flash_fwd),
        ("forward + backward", c.standard_fwd_bwd, c.flash_fwd_bwd),
        ("forward + backward, mask and dropout as\nseparate kernels in standard",
         c.standard_fwd_bwd_passes, c.flash_fwd_bwd),
    ):
        t.add_row(label, bytes_text(std), bytes_text(fl), f"{std / fl:.3g}×")
    note = Text(
        f"matmul FLOPs (both): {c.flops_fwd / 1e9:.4g} G forward, {c.flops_fwd_bwd / 1e9:.4g} G "
        "forward + backward. GB = 10⁹ bytes.\nThis is FA1's I/O model (Theorem 2; Algorithms 0, "
        "1, 3 and 4 counted line by line),\nnot a measurement: caches, kernel launches and "
        "recomputation are left out.",
        style="dim",
    )
    return Group(head, t, note)
