"""Each step's arithmetic with its actual numbers, as plain lines of text (`--explain`, step
mode, the HTML page): `m = max(2, 5) = 5`, `α = exp(2 − 5) = 0.049787068`,
`l = 1.3678794·0.049787068 + exp(5−5) + exp(3−5) = 1.203438`, and for attention
`O[0] = O[0]·α + (P·V)[0] = …` on the traced row's leading components.

The numbers are the step records' own (core/record.py): nothing is recomputed but the two parts
an attention tile adds (Σ P = l − l_prev·α and P·V = O − O_prev·α), so the lines show the sum
the table's l and O came from. Lines are at most about 76 characters: a block with more than
three terms shows its sum as one number.

The backward's lines (backward_query_lines, backward_key_lines) read a GradStep's detail:
the tile's own P, dP, D and dS on the traced row or key, and the gradients before and after.
Leaves out: styling and layout (present/explain.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from osm_cli.core.notebook import num

TERMS = 3  # a block's exp terms written out one by one up to this many
COMPONENTS = 4  # O's leading components written out


def g(x, digits: int = 8) -> str:
    """A number as the tables print it: `digits` significant digits, -inf and inf spelt out
    (core.notebook.num, which the notebooks' tables use too)."""
    return num(float(x), digits)


def plus(a: str, x: float, digits: int) -> str:
    """'a + x', or 'a − |x|' for a negative x."""
    return f"{a} − {g(-x, digits)}" if x < 0 else f"{a} + {g(x, digits)}"


def _exp(s, m) -> str:
    return f"exp({g(s, 6)}−{g(m, 6)})" if m >= 0 else f"exp({g(s, 6)}+{g(-m, 6)})"


def _terms(values: Sequence[float], m: float, total: float, digits: int) -> str:
    """Σ exp(s − m) over the block's finite scores, written out or as one number."""
    finite = [float(v) for v in values if not math.isinf(v) or v > 0]
    masked = len(values) - len(finite)
    if not finite:
        return f"{masked} × exp(-inf)" if masked else "0"
    if len(finite) <= TERMS:
        text = " + ".join(_exp(v, m) for v in finite)
    else:
        text = (f"({' + '.join(_exp(v, m) for v in finite[:2])} + … "
                f"{len(finite) - 2} more = {g(total, digits)})")
    return text + (f" (+ {masked} × exp(-inf) = 0)" if masked else "")


def _alpha_line(step, digits: int) -> str:
    if math.isinf(step.m) and step.m < 0:
        return ("α = 0: the guard. m is still -inf (every score so far masked), so nothing is "
                "rescaled and exp(s − m) is taken with 0 for m")
    return f"α = exp({g(step.m_prev, digits)} − {g(step.m, digits)}) = {g(step.alpha, digits)}"


def _m_line(step, block_max: float, digits: int, name: str = "block max") -> str:
    top = max(step.m_prev, block_max)
    if step.m != top and not (math.isnan(top)):
        return (f"m stays {g(step.m, digits)}: the {name} {g(block_max, digits)} is within τ of "
                "m (lazy rescale: no rescale, α = 1)")
    return f"m = max({g(step.m_prev, digits)}, {g(block_max, digits)}) = {g(step.m, digits)}"


def trace_lines(step, form: str = "rescale", digits: int = 8) -> list[str]:
    """The arithmetic of one block of `osm trace` (a core.record.Step with its values)."""
    vals = [] if step.values is None else [float(v) for v in step.values]
    if form == "merge" and step.block_m is not None:
        bm, bl, w = step.block_m, step.block_l, step.block_weight
        own = (f"m⁽ᵏ⁾ = max({', '.join(g(v, 6) for v in vals)}) = {g(bm, digits)}"
               if 0 < len(vals) <= TERMS + 1 else f"m⁽ᵏ⁾ = {g(bm, digits)} (the block's max)")
        return [
            own,
            f"l⁽ᵏ⁾ = {_terms(vals, bm, bl, digits) if vals else g(bl, digits)} = {g(bl, digits)}",
            _m_line(step, bm, digits, "block's m⁽ᵏ⁾"),
            _alpha_line(step, digits) + (
                f",  w = exp({g(bm, digits)} − {g(step.m, digits)}) = {g(w, digits)}"
                if not math.isinf(step.m) else ""),
            f"l = {g(step.l_prev, digits)}·{g(step.alpha, digits)} + {g(bl, digits)}·"
            f"{g(w, digits)} = {g(step.l, digits)}",
        ]
    added = step.l - step.l_prev * step.alpha
    terms = _terms(vals, step.m, added, digits) if vals else g(added, digits)
    return [
        _m_line(step, step.block_max, digits),
        _alpha_line(step, digits),
        f"l = {g(step.l_prev, digits)}·{g(step.alpha, digits)} + {terms} = {g(step.l, digits)}",
    ]


def attention_lines(step, o_prev: Sequence[float] | None, digits: int = 7) -> list[str]:
    """The arithmetic of one K/V tile of `osm attention`'s traced row: m, α, l, and
    O = O·α + P·V on O's leading components (o_prev: the components before the tile)."""
    if step.masked:
        return ["skipped, not computed: the mask hides its keys; m, l, O unchanged"]
    sum_p = step.l - step.l_prev * step.alpha
    hidden = math.isinf(step.block_max) and step.block_max < 0 and not step.sink
    lines = [
        *(["this row sees none of the tile's keys (masked): P = 0, l and O keep their values"]
          if hidden else []),
        _m_line(step, step.block_max, digits, "tile max"),
        _alpha_line(step, digits),
        f"l = l·α + ΣP = {g(step.l_prev, digits)}·{g(step.alpha, digits)} + {g(sum_p, digits)}"
        f" = {g(step.l, digits)}",
    ]
    if step.o is not None:
        o = [float(x) for x in step.o][:COMPONENTS]
        prev = [0.0] * len(o) if o_prev is None else [float(x) for x in o_prev][:COMPONENTS]
        lines.append("O = O·α + P·V, on O's leading components:")
        for j, (now, before) in enumerate(zip(o, prev, strict=False)):
            pv = now - before * step.alpha
            lines.append(f"  O[{j}] = " + plus(f"{g(before, digits)}·{g(step.alpha, digits)}",
                                                pv, digits) + f" = {g(now, digits)}")
    return lines


VECTOR = 4  # a vector's entries written out before "…"


def _vec(xs, count: int, digits: int) -> str:
    """'[a, b, c, …]': the first VECTOR of xs, '…' when the tile holds more (count)."""
    shown = [g(x, digits) for x in list(xs)[:VECTOR]]
    return "[" + ", ".join(shown) + (", …" if count > len(shown) else "") + "]"


def _ds_lines(det, first: int, what: str, fixed: int, digits: int) -> list[str]:
    """dS = P∘(dP − D) entry by entry, all of a tile of up to TERMS + 1, else the first TERMS
    (what: "keys", the row `fixed` along a tile's keys; or "rows", key `fixed` down a Q
    tile's rows): dS[row, key]."""
    many = len(det.d) > 1  # a key trace: each row its own D
    most = det.count if det.count <= TERMS + 1 else TERMS
    lines = []
    for n in range(min(most, len(det.ds), len(det.dp))):
        d = det.d[n] if many else det.d[0]
        at = f"{first + n}, {fixed}" if what == "rows" else f"{fixed}, {first + n}"
        lines.append(f"  dS[{at}] = {g(det.p[n], digits)}·("
                     + plus(g(det.dp[n], digits), -float(d), digits)
                     + f") = {g(float(det.ds[n]) + 0.0, digits)}")  # + 0.0: no "-0"
    if det.count > most:
        lines.append(f"  … {det.count - most} more {what}")
    if det.factor:
        lines.append("  (dS also carries the score transform's derivative: softcap's 1 − tanh², "
                     "a score_mod's)")
    return lines


def _adds(det, digits: int) -> list[str]:
    """'dQ[0] = before + share = after' for each gradient's leading components."""
    lines = []
    for name, before, add, after in det.adds:
        for c, (b, a, x) in enumerate(zip(before, add, after, strict=True)):
            lines.append(f"  {name}[{c}] = " + plus(g(b, digits), float(a), digits)
                         + f" = {g(x, digits)}")
    return lines


def backward_query_lines(step, scale: float, digits: int = 6) -> list[str]:
    """The arithmetic of one K/V tile of `osm backward`'s traced query row i (a GradStep with
    its detail; step.query is i): P, dP, D, dS on the tile's keys, and dQ_i += scale·dS·K_j."""
    det = step.detail
    if step.masked or det is None:
        return ["skipped, not computed: the mask hides these keys from the row's Q tile; dQ_i "
                "unchanged"]
    n = det.count
    return [
        f"P = exp(S − LSE) = {_vec(det.p, n, digits)}",
        f"dP = dO_i·V_jᵀ = {_vec(det.dp, n, digits)}",
        f"dS = P∘(dP − D), D = rowsum(dO_i∘O_i) = {g(det.d[0], digits)}:",
        *_ds_lines(det, step.start, "keys", step.query, digits),
        f"dQ_i += scale·dS·K_j (scale {g(scale, digits)}), on dQ_i's leading components:",
        *_adds(det, digits),
    ]


def backward_key_lines(step, scale: float, key: int, digits: int = 6) -> list[str]:
    """The arithmetic of one Q tile of `osm backward`'s traced key j: its column of P, dP and
    dS over the tile's rows, their D, and dV_j += Pᵀ·dO_i, dK_j += scale·dSᵀ·Q_i."""
    det = step.detail
    if step.masked or det is None:
        return ["skipped, not computed: the mask hides this key tile from these rows; dK_j, "
                "dV_j unchanged"]
    n = det.count
    lines = [
        f"P[:, {key}] = exp(S − LSE) = {_vec(det.p, n, digits)}",
        f"dP[:, {key}] = dO·V[{key}] = {_vec(det.dp, n, digits)}",
        f"D = rowsum(dO∘O) = {_vec(det.d, n, digits)}",
        "dS = P∘(dP − D), row by row:",
        *_ds_lines(det, step.start, "rows", key, digits),
        f"dV_j += Σ_i P_ij·dO_i, dK_j += scale·Σ_i dS_ij·Q_i (scale {g(scale, digits)}):",
        *_adds(det, digits),
    ]
    if det.heads > 1:
        lines.append(f"  (the sums run over the {det.heads} query heads that read this kv head; "
                     "the columns above are the traced head's)")
    return lines


def trace_heading(step) -> str:
    """A block's heading above its lines: "block 1, keys 2:4, scores [5, 3]" (the scores of a
    block of up to 8)."""
    shown = "" if step.values is None or len(step.values) > 8 else (
        ", scores [" + ", ".join(f"{float(v):g}" for v in step.values) + "]")
    return f"block {step.block}, keys {step.start}:{step.stop}{shown}"


def attention_heading(step) -> str:
    """A K/V tile's heading: "tile 1, keys 2:4" (or "sink")."""
    return "sink" if step.sink else f"tile {step.block}, keys {step.start}:{step.stop}"


def attention_step_lines(steps: Sequence, k: int, digits: int = 7) -> list[str]:
    """attention_lines of steps[k], O before it taken from the last step before k that has O."""
    prev = next((p.o for p in reversed(steps[:k]) if p.o is not None), None)
    return attention_lines(steps[k], prev, digits)


BACKWARD_NOTE = ("P = exp(S − LSE): the forward's probabilities, recomputed from its LSE; "
                 "D = rowsum(dO∘O), once per row before the loop")

ATTENTION_NOTE = ("P = exp(S − m) on the tile's keys: ΣP is what the tile adds to l, P·V what it "
                  "adds to O")

__all__ = ["ATTENTION_NOTE", "BACKWARD_NOTE", "attention_heading", "attention_lines",
           "attention_step_lines", "backward_key_lines", "backward_query_lines", "g", "plus",
           "trace_heading", "trace_lines"]
