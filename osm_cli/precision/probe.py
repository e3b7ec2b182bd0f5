"""The convention probe (osm check, on a failure): which other convention the kernel's tensors
fit, tried on the failing heads only, so that a report can say "the kernel's LSE matches osm's
in base 2" rather than only FAIL.

Tried, where they apply: the LSE in the other base (2, or e when it was read in base 2: ratio
log₂e), the LSE of the unscaled scores, the LSE written (B, N, H) and read (B, H, N), the LSE
of rows that see no key (+inf, −inf, 0); for the output, the other causal alignment, no causal
mask or a causal one, scale 1/d or 1 (or 1/√d when a scale was given), softcap after the mask,
softcap of the unscaled scores, no softcap, the GQA head map h % n_kv, Q/K/V read in the other
layout, K and V swapped; for every tensor a constant factor per head (dropout's 1/(1 − p), a
scale applied twice).
Each alternative fits when the kernel's tensor is within the same bound of it that the rule
gave osm's reference. The probe never changes a verdict.

Leaves out: the verdict (check.py), where the rows fail (locate.py), printing (present/).

Example: [f.message for f in probe(case).found]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.core.names import LSE_BASES
from osm_cli.errors import OsmError
from osm_cli.flash.masks import alibi_bias, make_band
from osm_cli.flash.options import ScoreOptions
from osm_cli.flash.plan import per_head
from osm_cli.flash.reference import reference
from osm_cli.flash.shapes import broadcast_mask, kv_head

HEADS = 2  # failing heads each alternative is tried on (the worst ones)
ROWS = 256  # query rows of each head the alternatives are computed on (its failing rows)
TRANSPOSE_LIMIT = 2e9  # scores·d of the whole transposed problem the layout probe may compute
LN2 = math.log(2.0)
_LN_OF = {"e": 1.0, "2": LN2}  # a base's log in natural units: log_b x · ln b = ln x


@dataclass(frozen=True)
class Finding:
    """One alternative tried on one tensor: whether the kernel's values fit it."""

    tensor: str  # out, lse, dq, dk, dv
    probe: str  # a short name: lse-base-2, causal-align, scale, gqa-map, …
    fits: bool
    max_diff: float  # max |kernel − alternative| over the rows tried
    bound: float  # the rule's bound the fit is measured against
    message: str  # what fits, in words (only meaningful when fits)
    option: tuple = ()  # (parameter, value) that states the convention to osm, if one does


@dataclass(frozen=True)
class Probe:
    """Every alternative tried, per tensor; `found` the ones that fit."""

    tried: tuple[Finding, ...]
    heads: tuple[tuple[int, int], ...]  # the (batch, head) pairs tried

    @property
    def found(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.tried if f.fits)

    def of(self, tensor: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.found if f.tensor == tensor)


@dataclass(frozen=True)
class Case:
    """What the probe needs of a failed check, in (B, H, …) arrays read as float64 (the large
    ones as Float64Heads): the inputs (Q,
    K, V as the kernel saw them), options with layout bhnd, the kernel's tensors and osm's
    references, each tensor's bound, and the failing heads of each tensor, worst first."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    opts: ScoreOptions
    got: dict  # tensor -> the kernel's (B, H, rows[, d]) values
    ref: dict  # tensor -> osm's reference, same shape (the dtype-rounded one for out, grads)
    bounds: dict  # tensor -> the rule's bound
    failing: dict  # tensor -> ((batch, head), …) worst first
    dense: bool = True  # False for varlen or paged batches: only the elementwise probes run
    packed: tuple = ()  # tensors whose rows are a varlen batch's, packed (batch 0: every sequence)
    lse_base: str = "e"  # the base the kernel's LSE was read in (got["lse"] is natural since)


class Float64Heads:
    """A (B, H, …) array read as float64 a piece at a time: indexing converts only what it
    picks (a head, its rows), so that a layer's Q, K, V and output are never held whole in
    float64 (benchmarks/bench_check.py). np.asarray of it converts it all."""

    __slots__ = ("a",)

    def __init__(self, a):
        self.a = np.asarray(a)

    @property
    def shape(self) -> tuple:
        return self.a.shape

    def __getitem__(self, ix) -> np.ndarray:
        return np.asarray(self.a[ix], dtype=np.float64)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.a, dtype=dtype or np.float64)

    def swapaxes(self, a: int, b: int) -> np.ndarray:
        """The values as stored, axes swapped: for reference(), which reads them in float64."""
        return self.a.swapaxes(a, b)


def probe(case: Case) -> Probe:
    """Try every alternative that applies to each failing tensor of `case`."""
    tried: list[Finding] = []
    heads: set = set()
    for tensor, fail in case.failing.items():
        if not fail:
            continue
        hs = tuple(fail[:HEADS])
        heads.update(hs)
        if tensor == "lse":
            tried += _lse_probes(case, hs)
        elif tensor == "out" and case.dense and case.k.shape[2]:
            tried += _out_probes(case, hs)
        if tensor not in ("lse", "dsink"):  # the LSE's factor is its base; dsink: one value a head
            tried += _scaled(case, tensor, hs)
    return Probe(tuple(tried), tuple(sorted(heads)))


def _fit(tensor, name, got, alt, ref, bound, message, option=()) -> Finding:
    """Fits when the kernel is within `bound` of the alternative where it was not of ref."""
    with np.errstate(invalid="ignore"):
        d = float(np.nanmax(np.abs(got - alt), initial=0.0)) if got.size else 0.0
        base = float(np.nanmax(np.abs(ref - alt), initial=0.0)) if ref.size else 0.0
    fits = bool(np.isfinite(got).any() and d <= bound and base > bound
                and np.array_equal(np.isnan(got), np.isnan(alt)))
    return Finding(tensor, name, fits, d, bound, message.replace("{diff}", f"{d:.2g}"), option)


def _lse_probes(case: Case, hs) -> list[Finding]:
    got, ref, bound = case.got["lse"], case.ref["lse"], case.bounds["lse"]
    fin = np.isfinite(ref)
    out = []
    g, r = got[fin], ref[fin]
    given = str(case.lse_base)
    for base in LSE_BASES:  # the kernel's values read in the other base: ln x = log2 x · ln 2
        if base == given:
            continue
        ratio = _LN_OF[base] / _LN_OF[given]
        out.append(_fit("lse", f"lse-base-{base}", g * ratio, r, g, bound,
                        f"the kernel's LSE matches osm's in base {base} (max diff {{diff}}): "
                        "{option} if that is its convention", ("lse_base", base)))
    b, h, t = ref.shape
    if h > 1 and t > 1 and h != t:
        alt = got.reshape(b, t, h).transpose(0, 2, 1)
        out.append(_fit("lse", "lse-layout", alt[fin], r, g, bound,
                        "the kernel's LSE holds (B, N, H) values read as (B, H, N) (max diff "
                        "{diff}): FlashAttention's softmax_lse is (B, H, N) whatever the "
                        "inputs' layout"))
    if case.dense:
        opts = replace(case.opts, scale=1.0)
        g1, r1, a1 = [], [], []
        for bb, hh in hs:
            rows = _rows(case, "lse", bb, hh)
            a1.append(attend_rows(case, bb, hh, rows, opts)[1])
            g1.append(got[bb, hh][rows])
            r1.append(ref[bb, hh][rows])
        g1, r1, a1 = np.concatenate(g1), np.concatenate(r1), np.concatenate(a1)
        f = np.isfinite(r1)
        out.append(_fit("lse", "lse-unscaled", g1[f], a1[f], r1[f], bound,
                        "the kernel's LSE is that of the unscaled scores Q·Kᵀ (max diff {diff}):"
                        " FlashAttention's LSE is of the scaled scores, m·scale + ln l"))
    masked = np.isneginf(ref)
    if masked.any():
        vals = got[masked]
        bad = vals[~(np.isinf(vals) | (vals == 0))]
        if bad.size:
            out.append(Finding(
                "lse", "masked-lse", True, math.inf, bound,
                f"rows that see no key have LSE {_few(bad)} where kernels write −inf (FA3, FA4, "
                "osm), +inf (FA2) or 0 (PyTorch's CPU flash); a finite LSE there is wrong"))
    return out


def _few(x: np.ndarray) -> str:
    u = np.unique(x)
    return ", ".join(f"{v:.4g}" for v in u[:3]) + (", …" if u.size > 3 else "")


def _rows(case: Case, tensor: str, b: int, h: int) -> np.ndarray:
    """The query rows of head (b, h) the alternatives are computed on: its rows off by more
    than the bound (at most ROWS of them, evenly spaced), else its first ROWS."""
    got, ref = case.got[tensor][b, h], case.ref[tensor][b, h]
    with np.errstate(invalid="ignore"):
        d = np.abs(got - ref)
        bad = ~(d.reshape(d.shape[0], -1).max(axis=-1, initial=0.0) <= case.bounds[tensor])
    idx = np.nonzero(bad)[0]
    if not idx.size:
        idx = np.arange(min(ROWS, got.shape[0]))
    return idx[np.linspace(0, idx.size - 1, min(ROWS, idx.size)).astype(int)]


def attend_rows(case: Case, b: int, h: int, rows: np.ndarray, opts: ScoreOptions, *,
                kv: int | None = None, swap: bool = False, cap: str = "before"):
    """(out, lse) of query rows `rows` of head (b, h) in float64 under `opts` (its scale,
    causal band, mask, softcap, ALiBi and sink), reading kv head `kv` (default FlashAttention's
    h // (H / Hkv)), K and V swapped with `swap`; cap "before" the mask (FlashAttention),
    "after-mask" (masked scores become −softcap) or "unscaled" (scale·C·tanh(Q·Kᵀ / C))."""
    B, H, t, d = case.q.shape
    hk, s = case.k.shape[1], case.k.shape[2]
    j = kv_head(h, H, hk) if kv is None else kv
    k, v = case.k[b, j], case.v[b, j]
    if swap:
        k, v = v, k
    raw = case.q[b, h][rows] @ k.T
    scale, c = opts.scale_for(d), opts.softcap
    if c is not None and cap == "unscaled":
        sc = scale * c * np.tanh(raw / c)
    else:
        sc = raw * scale
        if c is not None and cap == "before":
            sc = c * np.tanh(sc / c)
    if opts.alibi_slopes is not None:
        slope = per_head(opts.alibi_slopes, "alibi_slopes", B, H, H, np.float64).reshape(B, H)
        sc = sc + alibi_bias(slope[b, h], rows, 0, s, s - t, np.float64)
    band = make_band(t, s, opts.causal, opts.causal_align, opts.window)
    vis = None
    if band is not None:
        lo, hi = band.bounds(np.asarray(rows)[:, None])
        j = np.arange(s)[None, :]
        vis = (j >= lo) & (j <= hi)
    if opts.mask is not None:
        m = broadcast_mask(np.asarray(opts.mask), (B, H, t, s))[b, h][rows]
        if m.dtype == bool:
            vis = m if vis is None else vis & m
        else:
            sc = sc + m
    if vis is not None:
        sc = np.where(vis, sc, -np.inf)
    if c is not None and cap == "after-mask":
        sc = c * np.tanh(sc / c)
    if opts.sinks is not None:
        sink = np.full((len(rows), 1), float(np.asarray(opts.sinks, dtype=np.float64)[h]))
        sc = np.concatenate([sc, sink], axis=-1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = sc.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(sc - m)
        den = p.sum(axis=-1, keepdims=True)
        if opts.sinks is not None:
            p = p[:, :-1]
        out = np.where(den > 0, (p @ v) / np.where(den > 0, den, 1.0), 0.0)
        lse = np.where(den[:, 0] > 0, m[:, 0] + np.log(den[:, 0]), -np.inf)
    return out, lse


def _out_probes(case: Case, hs) -> list[Finding]:
    o, d = case.opts, case.q.shape[-1]
    alts: list[tuple] = []  # (name, message, option, opts | callable)
    if o.causal:
        other = "top-left" if o.causal_align == "bottom-right" else "bottom-right"
        alts.append(("causal-align", f"the kernel's output fits causal attention aligned "
                     f"{other} (max diff {{diff}}): {{option}} if that is its convention",
                     ("causal_align", other), replace(o, causal_align=other)))
        alts.append(("causal", "the kernel's output fits attention without the causal mask "
                     "(max diff {diff}): does it apply the mask?", (), replace(o, causal=False)))
    elif o.window is None and o.mask is None:
        for al in ("bottom-right", "top-left"):
            alts.append(("causal", f"the kernel's output fits causal attention aligned {al} "
                         "(max diff {diff}): {option} if it is causal",
                         ("causal", True) if al == "bottom-right" else ("causal_align", al),
                         replace(o, causal=True, causal_align=al)))
    scale = o.scale_for(d)
    for name, value in (("1/d", 1.0 / d), ("1", 1.0), ("1/√d", 1.0 / math.sqrt(d))):
        if not math.isclose(value, scale, rel_tol=1e-9):
            alts.append(("scale", f"the kernel's output fits the scale {name} = {value:.6g} in "
                         f"place of {scale:.6g} (max diff {{diff}}): {{option}} if it means "
                         "that scale", ("softmax_scale", value), replace(o, scale=value)))
    if o.softcap is not None:
        alts.append(("softcap-order", "the kernel's output fits softcap applied after the mask"
                     " (max diff {diff}): masked keys then weigh exp(−softcap − m), not 0; "
                     "FlashAttention caps the scores before masking", (), "after-mask"))
        alts.append(("softcap-scale", "the kernel's output fits softcap of the unscaled scores"
                     ", scaled after (max diff {diff}): FlashAttention caps scale·Q·Kᵀ", (),
                     "unscaled"))
        alts.append(("softcap", "the kernel's output fits attention without softcap (max diff "
                     "{diff}): does it apply the cap?", (), replace(o, softcap=None)))
    H, hk = case.q.shape[1], case.k.shape[1]
    if 1 < hk < H:
        alts.append(("gqa-map", f"the kernel's output fits the head map h % {hk} (max diff "
                     f"{{diff}}): FlashAttention's query head h reads kv head h // {H // hk}",
                     (), "gqa"))
    if case.k.shape[-1] == case.v.shape[-1]:
        alts.append(("kv-swapped", "the kernel's output fits K and V swapped (max diff {diff})",
                     (), "swap"))
    got, ref, bound = case.got["out"], case.ref["out"], case.bounds["out"]
    rows = {(b, h): _rows(case, "out", b, h) for b, h in hs}
    g = np.concatenate([got[b, h][rows[b, h]] for b, h in hs])
    r = np.concatenate([ref[b, h][rows[b, h]] for b, h in hs])
    found = []
    for name, msg, option, how in alts:
        alt = np.concatenate([_alt_head(case, b, h, rows[b, h], how) for b, h in hs])
        found.append(_fit("out", name, g, alt, r, bound, msg, option))
    lay = _transposed(case, hs)
    g = np.stack([got[b, h] for b, h in hs])
    r = np.stack([ref[b, h] for b, h in hs])
    if lay is not None:
        found.append(_fit("out", "layout", g, lay, r, bound,
                          "the kernel's output fits Q, K, V read as (B, N, H, d) (max diff "
                          "{diff}): {option} if that is the kernel's layout",
                          ("layout", "bnhd")))
    return found


def _alt_head(case: Case, b: int, h: int, rows, how) -> np.ndarray:
    """Rows `rows` of head (b, h)'s output under an alternative: other options, or a variant."""
    if isinstance(how, ScoreOptions):
        return attend_rows(case, b, h, rows, how)[0]
    if how == "gqa":
        return attend_rows(case, b, h, rows, case.opts, kv=h % case.k.shape[1])[0]
    if how == "swap":
        return attend_rows(case, b, h, rows, case.opts, swap=True)[0]
    return attend_rows(case, b, h, rows, case.opts, cap=how)[0]


def _transposed(case: Case, hs) -> np.ndarray | None:
    """The failing heads' output when Q, K, V in (B, H, N, d) are read as (B, N, H, d)."""
    o = case.opts
    q, k, v = case.q, case.k, case.v
    B, H, t, d = q.shape
    if (o.mask is not None or o.alibi_slopes is not None or o.sinks is not None
            or k.shape[1] != H or min(q.shape + k.shape) == 0
            or B * t * H * H * d > TRANSPOSE_LIMIT):
        return None
    try:
        sw = reference(q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2), o)[0]
    except (OsmError, ValueError, ZeroDivisionError):
        return None
    alt = sw.swapaxes(1, 2)
    if alt.shape != case.got["out"].shape:
        return None
    return np.stack([alt[b, h] for b, h in hs])


def _scaled(case: Case, tensor: str, hs) -> list[Finding]:
    """A constant factor c per failing head: the kernel's values are c × the reference."""
    got, ref, bound = case.got[tensor], case.ref[tensor], case.bounds[tensor]
    out = []
    for b, h in hs:
        g, r = got[b, h], ref[b, h]
        f = np.isfinite(g) & np.isfinite(r)
        rr = float((r[f] * r[f]).sum())
        if not rr:
            continue
        c = float((g[f] * r[f]).sum()) / rr
        if abs(c - 1) < 1e-6:
            continue
        label = {"out": "output", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV",
                 "dsink": "dsink"}[tensor]
        why = ""
        where = " (all sequences)" if tensor in case.packed else f" of batch {b}"
        p = 1 - 1 / c if c > 1 else None
        if p is not None and abs(p * 20 - round(p * 20)) < 0.02 and round(p * 20):
            why = f"; dropout's 1/(1 − p) for p = {round(p * 20) / 20:g}?"
        out.append(_fit(tensor, "scaled", g[f], c * r[f], r[f], bound,
                        f"the kernel's {label} in head {h}{where} is {c:.4g}× osm's "
                        f"(max diff after scaling {{diff}}): a factor applied twice or "
                        f"missed{why}"))
    return out


__all__ = ["HEADS", "Case", "Finding", "Float64Heads", "Probe", "probe"]
