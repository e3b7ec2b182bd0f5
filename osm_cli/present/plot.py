"""Pictures of the records, as PNG bytes (matplotlib, the optional extra `plot`).

matplotlib is imported inside each function (it costs start-up time, and is optional); figures
are drawn on a bare Agg canvas, so no GUI backend or global pyplot state is involved. Sizes are
fixed (FIGSIZE at DPI) so a picture's pixel size is known. Each picture draws what a reader
could misread as it is: errors at rounding level in ulps inside a band that says so (not
rounding noise on a log axis, which reads as a trend), zero errors as points, integer ticks
for indices, the traced query's outline above the tile grid, l as its two parts (l·α and the
block's own sum). The `*_figure` functions return the figure (its artists are what the tests
read); the `*_png` ones its PNG. Leaves out: writing files (io/).
"""

from __future__ import annotations

import io as _io
import math

import numpy as np

from osm_cli.errors import OsmError

DPI = 100
TRACE_SIZE = (9.0, 7.5)  # inches: 900 × 750 pixels
SWEEP_SIZE = (9.0, 7.5)
HEATMAP_SIZE = (9.0, 8.0)  # 900 × 800 pixels
# right for an installed osm and for a clone (whose extra is `plot`: pip install '.[plot]')
INSTALL = ("--plot needs matplotlib: pip install matplotlib (in a clone of osm: "
           "pip install '.[plot]')")
ROUNDING_ULPS = 16  # an error up to this many ulps of the largest value is rounding


def require_matplotlib() -> None:
    """Raise OsmError naming the extra to install when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        raise OsmError(INSTALL) from None


def _figure(size):
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _finite(xs) -> np.ndarray:
    """Non-finite values (m = -inf before any visible score) become gaps, not points."""
    a = np.array([np.nan if x is None else float(x) for x in xs], dtype=float)
    return np.where(np.isfinite(a), a, np.nan)


def trace_png(trace, title: str, eager=None, threshold: float = 0.0) -> bytes:
    """m, l and α per block of one trace, in the order the blocks were folded (trace_figure)."""
    return _png(trace_figure(trace, title, eager, threshold))


def trace_figure(trace, title: str, eager=None, threshold: float = 0.0):
    """The figure of trace_png: m with each block's max; l as a bar of its two parts, l_old·α
    (what was summed before, rescaled) and the block's own Σ exp(s − m) (merge form: l⁽ᵏ⁾·w),
    under the line of l, so a step where l falls shows why; α per block.

    eager: the eager (τ = 0) trace beside a lazy one, drawn dashed so the stale m shows.
    """
    fig = _figure(TRACE_SIZE)
    ax_m, ax_l, ax_a = fig.subplots(3, 1, sharex=True)
    steps = trace.steps
    x = np.arange(len(steps))
    m = _finite(s.m for s in steps)
    ax_m.plot(x, m, "o-", color="tab:blue", label="running max m (after block)")
    ax_m.plot(x, _finite(s.block_max for s in steps), "x", color="tab:red", ms=8,
              label="block max")
    if eager is not None:
        ax_m.plot(x, _finite(s.m for s in eager.steps), "s--", color="tab:gray", ms=4,
                  label="eager m (τ = 0)")
    ax_m.set_ylabel("m (score units)")
    ax_m.legend(loc="best", fontsize="small")
    kept = np.nan_to_num(_finite(s.l_prev * s.alpha for s in steps))
    added = np.nan_to_num(_finite(s.l - s.l_prev * s.alpha for s in steps))
    ax_l.bar(x, kept, color="tab:olive", alpha=0.55, width=0.6, label="l_old·α: the sum so far,"
             " rescaled to the new m")
    ax_l.bar(x, added, bottom=kept, color="tab:cyan", alpha=0.55, width=0.6,
             label="+ the block's own Σ exp(s − m)")
    ax_l.plot(x, _finite(s.l for s in steps), "o-", color="tab:green",
              label="running sum l = l_old·α + the block's sum")
    top = np.nanmax(np.append(_finite(s.l for s in steps), 0.0))
    ax_l.set_ylim(0, (top if top > 0 else 1.0) * 1.45)  # headroom for the legend
    ax_l.set_ylabel("l = Σ exp(s − m)")
    ax_l.legend(loc="upper left", fontsize="small", ncol=2)
    colours = [
        "tab:purple" if s.lazy_skipped else "tab:orange" if s.rescaled else "tab:gray"
        for s in steps
    ]
    ax_a.bar(x, [0.0 if math.isnan(a) else a for a in _finite(s.alpha for s in steps)],
             color=colours)
    ax_a.set_ylim(0, 1.35)  # headroom for the legend above the bars
    ax_a.set_yticks([0, 0.25, 0.5, 0.75, 1])
    ax_a.set_ylabel(r"$\alpha$ = exp(m_old − m)")
    from matplotlib.patches import Patch

    legend = [Patch(color="tab:orange", label="rescaled (m moved)"),
              Patch(color="tab:gray", label="no rescale")]
    if threshold > 0:
        legend.append(Patch(color="tab:purple", label=f"rescale skipped (lazy, τ = {threshold:g})"))
    ax_a.legend(handles=legend, loc="upper center", ncol=len(legend), fontsize="small")
    ax_a.set_xlabel("step (block index below)" if len(steps) <= 40 else "step")
    if len(steps) <= 40:
        ax_a.set_xticks(x, [str(s.block) for s in steps])
    else:
        _integer_ticks(ax_a.xaxis)
    fig.suptitle(title)
    return fig


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def source_title(name: str, rep=None) -> str:
    """A picture's title names the scores' source: the file as given, or for scores given
    inline (`--values`) or on standard input, the scores themselves (their first few)."""
    if name in ("--values", "-", "<stdin>", "standard input") and rep is not None:
        xs = np.atleast_2d(np.asarray(rep.scores, dtype=np.float64))[rep.row]
        shown = ", ".join(f"{float(v):g}" for v in xs[:8]) + (", …" if xs.size > 8 else "")
        where = "inline" if name == "--values" else "from standard input"
        return f"scores [{shown}] ({where})"
    return name


def trace_report_png(rep, name: str) -> bytes:
    """osm trace --plot: the report's trace (report.TraceReport), with the eager one beside a
    lazy run, titled with the source, form, block size, order and τ."""
    return _png(trace_report_figure(rep, name))


def trace_report_figure(rep, name: str):
    title = (f"{source_title(name, rep)}: online softmax, form {rep.trace.form}, blocks of "
             f"{rep.block}")
    title += f", order {rep.order}" if rep.order is not None else ""
    title += f", lazy τ = {rep.threshold:g}" if rep.threshold else ""
    return trace_figure(rep.trace, title, rep.eager, rep.threshold)


def sweep_png(result, title: str, error: str = "max |p − reference|",
              accum: str = "float64") -> bytes:
    """Error, rescale count and modelled HBM traffic against the block size (sweep_figure)."""
    return _png(sweep_figure(result, title, error, accum))


def sweep_figure(result, title: str, error: str = "max |p − reference|",
                 accum: str = "float64"):
    """The figure of sweep_png. Errors all within ROUNDING_ULPS ulps of the largest reference
    value (u = ε of `accum` × max |reference|) are drawn in ulps on a linear axis from 0, in a
    band that says they are at `accum`'s rounding, so noise does not read as a trend; larger
    errors on a log axis with that band at its foot. A zero error is a point either way (on
    the log axis at the foot, marked "0: exact")."""
    fig = _figure(SWEEP_SIZE)
    ax_e, ax_r, ax_h = fig.subplots(3, 1, sharex=True)
    b = np.array([r.block for r in result.rows], dtype=float)
    err = np.array([r.measure.max_error for r in result.rows], dtype=float)
    from osm_cli.precision.dtypes import finfo, resolve_dtype

    top = max((getattr(r.measure, "ref_max", 1.0) for r in result.rows), default=1.0)
    rounds = getattr(result, "dtype", None) or accum  # a kernel model's dtype, else the state's
    name, dtype = resolve_dtype(rounds)
    u = float(finfo(dtype).eps) * (top if top > 0 else 1.0)
    band = ROUNDING_ULPS * u
    at = f"at {name} rounding (≤ {ROUNDING_ULPS} ulps)"
    if (err <= band).all():
        ax_e.axhspan(0, ROUNDING_ULPS, color="0.88", label=at)
        ax_e.plot(b, err / u, "o-", color="tab:red", label=error)
        ax_e.set_ylim(-0.5, ROUNDING_ULPS * 1.5)
        ax_e.set_ylabel(f"{error}\nin ulps (u = {u:.2g})")
    else:
        pos = err[err > 0]
        floor = min(float(pos.min()), band) / 10
        ax_e.set_yscale("log")
        ax_e.axhspan(floor, band, color="0.88", label=at)
        ax_e.plot(b, np.where(err > 0, err, np.nan), "o-", color="tab:red", label=error)
        if (err == 0).any():
            ax_e.plot(b[err == 0], np.full(int((err == 0).sum()), floor), "v", color="tab:red",
                      ms=9, label="0: exact (drawn at the foot)")
        ax_e.set_ylim(floor / 2, float(pos.max()) * 1e4)  # the legend's room above the points
        ax_e.set_ylabel(error)
    ax_e.legend(loc="upper left", fontsize="small", ncol=3)
    ax_r.plot(b, [r.measure.rescales for r in result.rows], "o-", color="tab:orange")
    ax_r.set_ylabel("rescales")
    _integer_ticks(ax_r.yaxis)
    ax_h.plot(b, [r.hbm_flash for r in result.rows], "o-", color="tab:blue",
              label="tiled (model)")
    ax_h.axhline(result.hbm_standard, color="tab:gray", ls="--", label="standard (model)")
    sparse = [(r.block, r.hbm_skipping) for r in result.rows if r.sparse]
    if sparse:
        ax_h.plot(*zip(*sparse, strict=True), "s--", color="tab:green",
                  label="tiled, skipped tiles left out (model)")
    over = [(r.block, r.hbm_flash) for r in result.rows if not r.fits]
    if over:
        ax_h.plot(*zip(*over, strict=True), "x", color="tab:red", ms=12, mew=2,
                  label="tile exceeds the SRAM")
    ax_h.set_yscale("log")
    ax_h.set_ylabel("HBM bytes (forward)")
    ax_h.legend(loc="best", fontsize="small")
    ax_h.set_xscale("log", base=2)
    ax_h.set_xticks(b, [str(int(v)) for v in b])
    ax_h.set_xticks([], minor=True)
    ax_h.set_xlabel("block size (keys per block)")
    fig.suptitle(title)
    return fig


def sweep_titled_png(result, source: str, accum: str, qkv: bool = False) -> bytes:
    """osm sweep --plot: sweep_png titled with the source and the state's dtype; for Q/K/V
    (qkv) the error is of attention's output O."""
    if qkv:
        run = (f"{result.kernel} model in {result.dtype}" if getattr(result, "dtype", None)
               else f"state in {accum}")
        return sweep_png(result, f"{source}: block_k sweep of attention ({run})",
                         "max |O − reference|", accum)
    return sweep_png(result, f"{source}: block-size sweep (state in {accum})", accum=accum)


def traced_head_png(hm, source: str, traced_query: int | None = None) -> bytes:
    """attention --plot: attention_png of the traced head (tilemap.HeadMap), titled with the
    source and, when the head is larger, the part of it drawn. No query or no key: an error."""
    rows, cols = hm.p.shape
    if not rows or not cols:
        raise OsmError(f"--plot: head {hm.head} has {hm.t} queries and {hm.s} keys; there is no "
                       "probability matrix to draw")
    title = f"{source}: P = softmax(scale·QKᵀ) of batch {hm.batch}, head {hm.head}"
    if (rows, cols) != (hm.t, hm.s):
        title += (f"\nshowing the first {rows} of {hm.t} queries × the first {cols} of "
                  f"{hm.s} keys")
    return attention_png(hm, title, traced_query)


def attention_png(hm, title: str, traced_query: int | None = None) -> bytes:
    """One head's probability matrix as a PNG (attention_figure)."""
    return _png(attention_figure(hm, title, traced_query))


def attention_figure(hm, title: str, traced_query: int | None = None):
    """One head's probability matrix (tilemap.HeadMap) as a heatmap, the tile grid drawn over it,
    the tiles attention skipped shaded and the partial ones (a mask applied) tinted; masked
    entries (score -inf) are white; query and key indices on integer ticks; the traced query's
    outline drawn above the grid.
    """
    fig = _figure(HEATMAP_SIZE)
    ax = fig.subplots()
    rows, cols = hm.p.shape
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    positive = hm.p[(hm.p > 0) & ~hm.masked]
    top = float(positive.max()) if positive.size else 1.0
    # a log scale, as attention rows span orders of magnitude; below 1e-6 of the top is one colour
    floor = min(max(float(positive.min()) if positive.size else 0.0, top * 1e-6), top / 10)
    norm = LogNorm(vmin=floor, vmax=top, clip=True)
    cmap = colormaps["viridis"].with_extremes(bad="white")
    extent = (-0.5, cols - 0.5, rows - 0.5, -0.5)
    img = ax.imshow(np.ma.masked_array(np.maximum(hm.p, floor), mask=hm.masked), cmap=cmap,
                    norm=norm, interpolation="nearest", aspect="auto", extent=extent)
    fig.colorbar(img, ax=ax, shrink=0.8,
                 label="p = softmax of the row over all keys (log scale)")
    # skipped tiles: a translucent grey layer, one cell per (query, key) so any size is fast
    n_q, n_k = hm.skip.shape
    qi = np.minimum(np.arange(rows) // hm.block_q, n_q - 1)
    kj = np.minimum(np.arange(cols) // hm.block_k, n_k - 1)
    if n_q and n_k:
        layer = hm.skip[np.ix_(qi, kj)]
        grey = np.zeros((rows, cols, 4))
        grey[layer] = (0.35, 0.35, 0.35, 0.6)
        ax.imshow(grey, interpolation="nearest", aspect="auto", extent=extent)
    partial = getattr(hm, "partial", None)
    if n_q and n_k and partial is not None and partial.any():  # the masked tiles, tinted
        tint = np.zeros((rows, cols, 4))
        tint[partial[np.ix_(qi, kj)]] = (0.95, 0.55, 0.1, 0.22)
        ax.imshow(tint, interpolation="nearest", aspect="auto", extent=extent)
    lines_q = np.arange(hm.block_q, rows, hm.block_q) - 0.5
    lines_k = np.arange(hm.block_k, cols, hm.block_k) - 0.5
    width = 0.9 if max(len(lines_q), len(lines_k)) <= 32 else 0.3
    for y in lines_q:
        ax.axhline(y, color="tab:red", lw=width)
    for x in lines_k:
        ax.axvline(x, color="tab:red", lw=width)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    handles = [Line2D([], [], color="tab:red", lw=1,
                      label=f"tile grid: block_q {hm.block_q} × block_k {hm.block_k}"),
               Patch(color=(0.35, 0.35, 0.35, 0.6),
                     label=f"skipped tile, not computed ({int(hm.skip.sum())} of the head's "
                     f"{hm.skip.size})"),
               Patch(facecolor="white", edgecolor="black", label="masked score (p = 0)")]
    if partial is not None and partial.any():
        full = int(partial.size - partial.sum() - hm.skip.sum())
        handles.append(Patch(color=(0.95, 0.55, 0.1, 0.22),
                             label=f"partial tile, masked ({int(partial.sum())}); the others "
                             f"full, no mask ({full})"))
    if traced_query is not None and traced_query < rows:
        ax.add_patch(Rectangle((-0.5, traced_query - 0.5), cols, 1, fill=False,
                               edgecolor="tab:orange", lw=3, zorder=5))  # above the grid lines
        handles.append(Patch(facecolor="none", edgecolor="tab:orange", lw=3,
                             label=f"traced query {traced_query}"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2,
              fontsize="small")
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    _integer_ticks(ax.xaxis)
    _integer_ticks(ax.yaxis)
    ax.set_title(title)
    return fig


__all__ = [
    "INSTALL", "ROUNDING_ULPS", "attention_figure", "attention_png", "require_matplotlib",
    "source_title", "sweep_figure", "sweep_png", "sweep_titled_png", "trace_figure", "trace_png",
    "trace_report_figure", "trace_report_png", "traced_head_png",
]
