"""Pictures of the records, as PNG bytes (the optional extra `osm-cli[plot]`, matplotlib).

matplotlib is imported inside each function (it costs start-up time, and is optional); figures
are drawn on a bare Agg canvas, so no GUI backend or global pyplot state is involved. Sizes are
fixed (FIGSIZE at DPI) so a picture's pixel size is known. Leaves out: writing files (io.py).
"""

from __future__ import annotations

import io as _io
import math

import numpy as np

from .errors import OsmError

DPI = 100
TRACE_SIZE = (9.0, 7.5)  # inches: 900 × 750 pixels
SWEEP_SIZE = (9.0, 7.5)
INSTALL = "--plot needs matplotlib: pip install 'osm-cli[plot]'"


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
    """m, l and α per block of one trace, in the order the blocks were folded.

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
    ax_l.plot(x, _finite(s.l for s in steps), "o-", color="tab:green", label="running sum l")
    ax_l.set_ylabel("l = Σ exp(s − m)")
    ax_l.legend(loc="best", fontsize="small")
    colours = [
        "tab:purple" if s.skipped else "tab:orange" if s.rescaled else "tab:gray" for s in steps
    ]
    ax_a.bar(x, [0.0 if math.isnan(a) else a for a in _finite(s.scale for s in steps)],
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
    fig.suptitle(title)
    return _png(fig)


def sweep_png(result, title: str) -> bytes:
    """Error, rescale count and modelled HBM traffic against the block size."""
    fig = _figure(SWEEP_SIZE)
    ax_e, ax_r, ax_h = fig.subplots(3, 1, sharex=True)
    b = np.array([r.block for r in result.rows], dtype=float)
    err = np.array([r.measure.max_error for r in result.rows])
    ax_e.plot(b, np.where(err > 0, err, np.nan), "o-", color="tab:red")
    if (err > 0).any():
        ax_e.set_yscale("log")
    ax_e.set_ylabel("max |p − reference|")
    ax_r.plot(b, [r.measure.rescales for r in result.rows], "o-", color="tab:orange")
    ax_r.set_ylabel("rescales")
    ax_h.plot(b, [r.hbm_flash for r in result.rows], "o-", color="tab:blue",
              label="tiled (model)")
    ax_h.axhline(result.hbm_standard, color="tab:gray", ls="--", label="standard (model)")
    over = [(r.block, r.hbm_flash) for r in result.rows if not r.fits]
    if over:
        ax_h.plot(*zip(*over, strict=True), "x", color="tab:red", ms=12, mew=2,
                  label="tile exceeds the SRAM")
    ax_h.set_yscale("log")
    ax_h.set_ylabel("HBM bytes (forward)")
    ax_h.legend(loc="best", fontsize="small")
    ax_h.set_xscale("log", base=2)
    ax_h.set_xticks(b, [str(int(v)) for v in b])
    ax_h.set_xlabel("block size (keys per block)")
    fig.suptitle(title)
    return _png(fig)


__all__ = ["INSTALL", "require_matplotlib", "sweep_png", "trace_png"]
