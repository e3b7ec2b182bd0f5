"""FlashAttention-4's FP8 saturation bug (flash-attention #2716 / #2577), run with osm's model.

FA4 SM100 computes FP8 probabilities as P = exp2(S·c − m·c + 8): the offset 8 lets P use
e4m3's range (largest finite 448 ≈ 2^8.81). With a lazy-rescale threshold τ (log2 units) the
running max m is kept while a tile's max stays within τ of it, so P can reach 2^(8 + τ). With
τ = 8 (the 16-bit threshold) those P saturate to 448 in the P·V product while the float32 row
sum l counts them in full: O comes out too small, silently, and the LSE (from m and l only)
stays exact. The kernel now uses τ = 0 for FP8 and asserts offset + τ < log2 448
(docs/numerics.md#fp8).

The inputs (samples/fp8/: q, k, v as float32 .npy files holding e4m3 values, layout (B, H, N, d)
= (1, 1, 4, 16) and (1, 1, 512, 16); q_descale, k_descale, v_descale of shape (B, Hkv) = (1, 1))
give row 0 one tile max per 128-key tile that rises by 2 log2 units each time, in the order the
kernel visits the tiles (last to first): 4, 6, 8, 10. Rows 1–3 are random. This program runs
osm's fa4-sm100 preset with τ = 0 and τ = 8 and prints, per K/V tile of row 0
(res.trace.steps), the block max and m in log2 units, whether m moved, α, the largest P of the
tile before rounding against 448, and how many of its P saturate; then O's and the LSE's
error against the float64 reference for each τ.

The largest P and the saturated count are the trace's own (Step.p_max, Step.saturated: the
model's P before rounding); beside them, 2^(8 + (block max − m)·log2 e) from m and the block max
and the count from the float64 scores, 2^8·exp(s − m) > 448, as a check on both.

Usage: python benchmarks/fp8_saturation.py [--write-samples]
(--write-samples makes samples/fp8/ again from its seed; the output is
benchmarks/results/fp8_saturation.txt.)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from osm_cli.flash.reference import reference  # noqa: E402
from osm_cli.precision.emulate import Descale  # noqa: E402
from osm_cli.precision.kernels import run_flash  # noqa: E402
from osm_cli.precision.model import model  # noqa: E402

SAMPLES = ROOT / "samples" / "fp8"
E4M3_MAX = 448.0
OFFSET = 8  # FA4's max_offset for 8-bit inputs
LOG2E = math.log2(math.e)
NAMES = ("q", "k", "v", "q_descale", "k_descale", "v_descale")


def make_samples(seed: int = 12) -> dict:
    """Q, K, V in e4m3 values (carried in float32) and their descales.

    Row 0 of Q is (4, 0, …, 0), so its raw score with key j is 4·K[j, 0]; with q_descale 0.5,
    k_descale ln 2 and scale 1/4 (d = 16) that is K[j, 0] / 2 in log2 units. Each 128-key tile
    holds K[·, 0] in [top − 8, top] with one key at top: 20, 16, 12, 8 for tiles 0..3, so the
    kernel, visiting tile 3 first, sees its max rise 4 → 6 → 8 → 10.
    """
    import ml_dtypes

    e4m3 = ml_dtypes.float8_e4m3fn
    rng = np.random.default_rng(seed)
    t, s, d = 4, 512, 16
    q = np.zeros((1, 1, t, d))
    q[0, 0, 0, 0] = 4.0
    q[0, 0, 1:, 1:] = rng.normal(0.0, 1.0, (t - 1, d - 1))
    k = rng.normal(0.0, 2.0, (1, 1, s, d))
    for j, top in enumerate((20.0, 16.0, 12.0, 8.0)):
        col = rng.uniform(top - 8.0, top, 128)
        col[rng.integers(128)] = top
        k[0, 0, j * 128:(j + 1) * 128, 0] = col
    v = rng.normal(4.0, 2.0, (1, 1, s, d))  # x / v_descale for values near 1

    def fp8(x):
        return np.asarray(x, np.float32).astype(e4m3).astype(np.float32)

    return {"q": fp8(q), "k": fp8(k), "v": fp8(v),
            "q_descale": np.array([[0.5]], np.float32),
            "k_descale": np.array([[math.log(2.0)]], np.float32),
            "v_descale": np.array([[0.25]], np.float32)}


def load_samples(folder: Path = SAMPLES) -> dict:
    return {n: np.load(folder / f"{n}.npy") for n in NAMES}


def dequantized(a: dict) -> tuple:
    """The true Q, K, V (stored values times their descale), float64, for the reference."""
    return tuple(a[n].astype(np.float64) * a[f"{n}_descale"].astype(np.float64)[:, :, None, None]
                 for n in "qkv")


def run(a: dict, tau: float):
    desc = Descale(a["q_descale"], a["k_descale"], a["v_descale"])
    return run_flash(model("e4m3"), a["q"], a["k"], a["v"], kernel="fa4-sm100", threshold=tau,
                     descale=desc, trace_at=(0, 0, 0))


def tile_rows(res, scores: np.ndarray) -> list[dict]:
    """Row 0's tiles as the kernel visited them: block max, m, α, l, largest P, saturated."""
    rows = []
    for st in res.trace.steps:
        if st.sink or st.masked:
            continue
        m = st.m
        top = 2.0 ** (OFFSET + (st.block_max - m) * LOG2E)
        p = 2.0 ** OFFSET * np.exp(scores[st.start:st.stop] - m)
        if abs(st.p_max - top) > 1e-3 * top or st.saturated != np.count_nonzero(p > E4M3_MAX):
            raise SystemExit(f"tile {st.block}: the trace's P max {st.p_max} ({st.saturated} "
                             f"saturated) is not 2^(8 + Δ·log2 e) = {top:.6g}")
        rows.append({"tile": st.block, "keys": f"{st.start}:{st.stop}",
                     "block_max": st.block_max * LOG2E,
                     "m": m * LOG2E,
                     "m_was": "-" if not np.isfinite(st.m_prev) else
                     ("moved" if st.m != st.m_prev else "kept"),
                     "alpha": st.alpha, "l": st.l, "p_max": st.p_max,
                     "saturated": st.saturated})
    return rows


def report(a: dict) -> str:
    q, k, v = dequantized(a)
    ref, ref_lse = reference(q, k, v)
    d = q.shape[-1]
    scores = (q[0, 0, 0] @ k[0, 0].T) / math.sqrt(d)  # row 0, natural-log units
    lines = ["FlashAttention-4 SM100 (osm's fa4-sm100 preset), e4m3 inputs, FP8 offset 8; "
             "row 0 of samples/fp8/", f"e4m3 max {E4M3_MAX:g} = 2^{math.log2(E4M3_MAX):.3f}; "
             "log2 units: S·scale·q_descale·k_descale·log2 e", ""]
    errors = {}
    for tau in (0.0, 8.0):
        res = run(a, tau)
        guard = OFFSET + tau < math.log2(E4M3_MAX)
        lines.append(f"threshold τ = {tau:g} (log2 units): offset + τ = {OFFSET + tau:g} "
                     f"{'<' if guard else '≥'} log2 448 = {math.log2(E4M3_MAX):.2f}: "
                     f"{'the guard holds' if guard else 'the guard FAILS (the kernel asserts it)'}")
        lines.append(f"  {'tile':>4} {'keys':>8} {'block max':>9} {'m':>6} {'m was':>6} "
                     f"{'alpha':>7} {'largest P':>10} {'> 448':>5} {'saturated':>9} "
                     f"{'l / 2^8':>10}")
        for r in tile_rows(res, scores):
            alpha = "-" if r["m_was"] == "-" else f"{r['alpha']:.4f}"
            lines.append(f"  {r['tile']:>4} {r['keys']:>8} {r['block_max']:9.3f} {r['m']:6.3f} "
                         f"{r['m_was']:>6} {alpha:>7} {r['p_max']:10.1f} "
                         f"{'yes' if r['p_max'] > E4M3_MAX else 'no':>5} "
                         f"{r['saturated']:>5} / {128:<3} {r['l']:10.4g}")
        err_o = np.abs(res.out.astype(np.float64) - ref)
        err_l = np.abs(res.lse.astype(np.float64) - ref_lse)
        top = float(np.abs(ref).max())
        errors[tau] = (float(err_o[0, 0, 0].max()), float(err_o.max()), float(err_l.max()))
        lines.append(f"  O error vs float64: row 0 {errors[tau][0]:.3e}, all rows "
                     f"{errors[tau][1]:.3e} (max |O_ref| {top:.3f}); "
                     f"LSE error {errors[tau][2]:.2e}")
        lines.append(f"  row 0: O[:4] = {np.array2string(res.out[0, 0, 0, :4], precision=4)} "
                     f"vs reference {np.array2string(ref[0, 0, 0, :4], precision=4)}")
        lines.append("")
    (o0, oa, l0), (o8, oa8, l8) = errors[0.0], errors[8.0]
    lines.append(f"τ = 8 against τ = 0: O error of row 0 × {o8 / o0:.0f} "
                 f"({o0:.2e} → {o8:.2e}), all rows × {oa8 / oa:.0f}; "
                 f"LSE error {l0:.1e} → {l8:.1e} (both float32 rounding)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-samples", action="store_true",
                    help="make samples/fp8/ again from its seed")
    args = ap.parse_args()
    if args.write_samples:
        SAMPLES.mkdir(parents=True, exist_ok=True)
        for name, x in make_samples().items():
            np.save(SAMPLES / f"{name}.npy", x)
    print(report(load_samples()))


if __name__ == "__main__":
    main()
