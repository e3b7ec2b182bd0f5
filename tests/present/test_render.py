"""Golden tables: rendered at 100 columns without colour and compared whole.

Trailing spaces (rich pads every line to the table's width) are stripped before comparing, so the
golden text can live in this file; everything else, alignment included, must match exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from rich.cells import cell_len

from osm_cli import online_softmax
from osm_cli.core.reference import naive_softmax, stable_softmax
from osm_cli.present.format import agreement, arrow, num, values
from osm_cli.present.tables import overflow_tables
from osm_cli.present.trace import element_table, final_line, rows_table, step_table, trace_header
from osm_cli.studies.overflow import overflow_demo


@pytest.fixture
def text(render_text):
    def _text(renderable, width: int = 100) -> str:
        lines = render_text(renderable, width).splitlines()
        return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"

    return _text


def golden(s: str) -> str:
    return s.strip("\n") + "\n"


# ---------------------------------------------------------------------------------------------
# step tables of the seed examples

SEED1_RESCALE = golden("""
form rescale: m = max(m, block max), α = exp(m_old − m), l = l·α + Σ exp(s − m)

 #  keys  values  block max         m  α                      l
 ──────────────────────────────────────────────────────────────
 0   0:2  [2, 4]          4  -inf → 4  0          0 → 1.1353353
 1   2:4  [1, 3]          3         4  1  1.1353353 → 1.5530018
""")

SEED1_MERGE = golden("""
form merge: each block's own m⁽ᵏ⁾ and l⁽ᵏ⁾ = Σ exp(s − m⁽ᵏ⁾), then
m = max(m, m⁽ᵏ⁾), α = exp(m_old − m), w = exp(m⁽ᵏ⁾ − m), l = l·α + l⁽ᵏ⁾·w

 #  keys  m⁽ᵏ⁾       l⁽ᵏ⁾         m  α           w                      l
 ────────────────────────────────────────────────────────────────────────
 0   0:2     4  1.1353353  -inf → 4  0           1          0 → 1.1353353
 1   2:4     3  1.1353353         4  1  0.36787944  1.1353353 → 1.5530018
""")

SEED2_RESCALE = golden("""
form rescale: m = max(m, block max), α = exp(m_old − m), l = l·α + Σ exp(s − m)

 #  keys  values  block max         m            α                     l
 ───────────────────────────────────────────────────────────────────────
 0   0:2  [1, 2]          2  -inf → 2            0         0 → 1.3678794
 1   2:4  [5, 3]          5     2 → 5  0.049787068  1.3678794 → 1.203438
""")

SEED2_MERGE = golden("""
form merge: each block's own m⁽ᵏ⁾ and l⁽ᵏ⁾ = Σ exp(s − m⁽ᵏ⁾), then
m = max(m, m⁽ᵏ⁾), α = exp(m_old − m), w = exp(m⁽ᵏ⁾ − m), l = l·α + l⁽ᵏ⁾·w

 #  keys  m⁽ᵏ⁾       l⁽ᵏ⁾         m            α  w                     l
 ────────────────────────────────────────────────────────────────────────
 0   0:2     2  1.3678794  -inf → 2            0  1         0 → 1.3678794
 1   2:4     5  1.1353353     2 → 5  0.049787068  1  1.3678794 → 1.203438
""")


@pytest.mark.parametrize(
    "scores, form, expected",
    [
        ([2, 4, 1, 3], "rescale", SEED1_RESCALE),
        ([2, 4, 1, 3], "merge", SEED1_MERGE),
        ([1, 2, 5, 3], "rescale", SEED2_RESCALE),
        ([1, 2, 5, 3], "merge", SEED2_MERGE),
    ],
    ids=["seed1-rescale", "seed1-merge", "seed2-rescale", "seed2-merge"],
)
def test_step_table_golden(text, scores, form, expected):
    """Seed 1: l = e^-2 + 1 = 1.1353353, then + e^-3 + e^-1 = 1.5530018, α = 1, w = e^-1.
    Seed 2: l = e^-1 + 1 = 1.3678794, then α = e^-3 = 0.049787068, l = 1.2034380 (%g drops the 0).
    """
    trace = online_softmax(np.array(scores, dtype=np.float64), 2, form)
    assert text(step_table(trace)) == expected


# ---------------------------------------------------------------------------------------------
# element table

ELEMENTS = golden("""
 i   score          online p      stabilized p   naive p   |online−stab|   ulps
 ──────────────────────────────────────────────────────────────────────────────
 0    1001   0.0152194288642   0.0152194288642       nan        1.73e-18      1
 1    1002    0.041370696921    0.041370696921       nan               0      0
 2    1005    0.830952660544    0.830952660544       nan        2.22e-16      2
 3    1003    0.112457213671    0.112457213671       nan               0      0
 4    -inf                 0                 0         0               0      0

ulps: |online−stab| in units in the last place of stabilized p (float64's)
""")


def test_element_table_golden(text):
    """[1001, 1002, 1005, 1003, -inf] has the probabilities of [1, 2, 5, 3] (and a masked 0):
    p = e^(s - 1005) / (e^-4 + e^-3 + 1 + e^-2) = 0.01522, 0.04137, 0.83095, 0.11246.
    Naive overflows (exp(1001) = inf, inf / inf = nan; the masked 0 / inf = 0). The "online"
    column is the stabilized one moved by 1 ulp at i = 0 (|Δ| = 2^-59 = 1.73e-18) and by 2 ulps
    at i = 2 (2·2^-53 = 2.22e-16), so the difference columns are known exactly.
    """
    s = np.array([1001.0, 1002.0, 1005.0, 1003.0, -np.inf])
    stable = stable_softmax(s)
    online = stable.copy()
    online[0] = np.nextafter(stable[0], 0)
    online[2] = np.nextafter(np.nextafter(stable[2], 1), 1)
    assert text(element_table(s, online, stable, naive_softmax(s))) == ELEMENTS


ROWS = golden("""
all rows

 row      m             l           LSE   max |online−stab|
 ──────────────────────────────────────────────────────────
   0      4   1.553001793   4.440189699            1.11e-16
   1      5    1.20343799   5.185182453                   0
   2   -inf             0          -inf                   0
   3      2   1.272917229   2.241311297             3.5e-17
""")


def test_rows_table_golden(text):
    """samples/matrix.txt. Row 3, [0.5, -1, -inf, 2]: m = 2, l = e^-1.5 + e^-3 + 1 = 1.2729172."""
    m = np.array([[2, 4, 1, 3], [1, 2, 5, 3], [-np.inf] * 4, [0.5, -1, -np.inf, 2]])
    t = online_softmax(m, 2)
    diffs = np.array([2.0**-53, 0.0, 0.0, 3.5e-17])
    assert text(rows_table(t.m, t.l, t.lse, diffs)) == ROWS


def test_header_and_final_line(text):
    assert text(trace_header("x.txt", 4, 4, 1, 2)) == (
        "x.txt: row 1 of 4, 4 scores in 2 blocks of 2\nstart: m = -inf, l = 0\n"
    )
    assert text(trace_header("y", 1, 5, 0, 5)) == (
        "y: 5 scores in 1 block of 5\nstart: m = -inf, l = 0\n"
    )
    assert text(final_line(4.0, 1.5530017927759192, 4.440189698561196)) == (
        "final: m = 4, l = 1.553001793, LSE = m + ln l = 4.440189699 (natural log)\n"
    )
    assert text(final_line(-math.inf, 0.0, -math.inf)) == (
        "final: m = -inf, l = 0, LSE = m + ln l = -inf (natural log)\n"
    )


# ---------------------------------------------------------------------------------------------
# overflow demo

OVERFLOW = golden("""
exp(x) in each dtype (x = 100, 102, 99)

                             exp overflows   exp underflows
 dtype      largest finite           above            below    exp(100)    exp(102)     exp(99)
 ──────────────────────────────────────────────────────────────────────────────────────────────
 float16          6.55e+04         11.0899         -17.3287         inf         inf         inf
 bfloat16         3.39e+38         88.7189         -92.8817         inf         inf         inf
 float32         3.403e+38         88.7228         -103.972         inf         inf         inf
 float64        1.798e+308         709.783         -745.133   2.688e+43   1.986e+44   9.889e+42

Naive softmax computes exp(x) first, and exp overflows to inf for x in float16 above 11.09, bfloat16
above 88.72, float32 above 88.72: exp(102) does not fit, so the sum is inf and inf / inf = nan.
Naive softmax still works in float64 (fails above 709.78). Stabilized and online softmax subtract
the max first, so every exponent is ≤ 0 and every dtype gives a finite answer.

softmax(x)

 dtype      method           p[0]       p[1]        p[2]
 ───────────────────────────────────────────────────────
 float16    naive             nan        nan         nan
            stabilized   0.114197   0.843262   0.0419922
            online       0.114197   0.843262   0.0419922

 bfloat16   naive             nan        nan         nan
            stabilized   0.115234   0.847656   0.0422363
            online       0.115234   0.847656   0.0422363

 float32    naive             nan        nan         nan
            stabilized   0.114195   0.843795   0.0420101
            online       0.114195   0.843795   0.0420101

 float64    naive        0.114195   0.843795   0.0420101
            stabilized   0.114195   0.843795   0.0420101
            online       0.114195   0.843795   0.0420101


a fully masked row, x = [-inf, -inf, -inf] (float32)

 method                  probabilities     why
 ──────────────────────────────────────────────────────────────────────────────────────────────────
 naive                   [nan, nan, nan]   exp(-inf) = 0 for all: 0 / 0 = nan
 stabilized (textbook)   [nan, nan, nan]   max = -inf, and (-inf) - (-inf) = nan
 online (osm)            [0, 0, 0]         m stays -inf, l = 0: subtract 0 instead of -inf, output
                                           0

A fully masked row (every score -inf): the textbook stabilized form gives NaN, as its max is -inf
and (-inf) - (-inf) = nan; osm's guarded forms take 0 for that max and give 0 for every entry (LSE
-inf by default), as FlashAttention kernels do: such a row is padding or a causal edge, not an
error. Above, naive and stabilized (textbook) are the unguarded forms, online (osm) the guarded one.
""")


def test_overflow_tables_golden(text):
    """softmax([100, 102, 99]) = [0.1141952, 0.8437947, 0.0420101]; float16 rounds the
    probabilities to 11 bits (0.114197, 0.843262, 0.0419922), bfloat16 to 8. exp(100) = 2.688e43
    exceeds float32's 3.403e38: naive is nan in every dtype but float64. The limits are
    ln(max finite) and ln(smallest subnormal / 2), e.g. ln 65504 = 11.0899 for float16."""
    assert text(overflow_tables(overflow_demo())) == OVERFLOW


# ---------------------------------------------------------------------------------------------
# long inputs


def _data_lines(rendered: str) -> list[str]:
    """Table body lines: those that start with a block number or the ellipsis (not the caption
    under the table that counts the rows left out)."""
    return [ln for ln in rendered.splitlines()
            if (ln.strip()[:1].isdigit() or "⋮" in ln) and "not shown" not in ln]


@pytest.mark.parametrize("form", ["rescale", "merge"])
def test_long_step_table_elides_the_middle(text, form):
    """Falling scores: m moves at block 0 only, so blocks 5–94 are left out, and said so."""
    trace = online_softmax(np.arange(200.0)[::-1], 2, form)  # 100 blocks
    short = text(step_table(trace))
    assert "⋮ 90 blocks not shown, where m did not move (--all shows every row)" in short
    rows = _data_lines(short)
    assert len(rows) == 11
    assert [r.split()[0] for r in rows] == ["0", "1", "2", "3", "4", "⋮", "95", "96", "97", "98",
                                            "99"]
    assert rows[5].split() == ["⋮"] * len(rows[5].split()) and len(rows[5].split()) >= 6

    full = text(step_table(trace, show_all=True))
    assert "⋮" not in full
    assert [r.split()[0] for r in _data_lines(full)] == [str(i) for i in range(100)]


def test_short_step_table_is_not_elided(text):
    """12 blocks fit: the ellipsis would hide only two rows, so all are shown."""
    out = text(step_table(online_softmax(np.arange(24.0), 2)))
    assert "⋮" not in out
    assert len(_data_lines(out)) == 12


def test_long_element_table_elides_the_middle(text):
    s = np.arange(50.0)
    p = stable_softmax(s)
    short = text(element_table(s, p, p, naive_softmax(s)))
    assert "⋮" in short and len(_data_lines(short)) == 11
    full = text(element_table(s, p, p, naive_softmax(s), show_all=True))
    assert "⋮" not in full and len(_data_lines(full)) == 50


def _long_input():
    """10^5 scores, σ = 30 (probabilities down to 1e-100 and below), 1% masked."""
    rng = np.random.default_rng(0)
    s = rng.normal(0.0, 30.0, 100_000)
    s[rng.integers(0, s.size, 1000)] = -np.inf
    return s


def _fits(rendered: str) -> None:
    assert max(cell_len(line) for line in rendered.splitlines()) <= 100
    assert "…" not in rendered  # no number cut short to fit


@pytest.mark.parametrize("show_all", [False, True])
@pytest.mark.parametrize("form", ["rescale", "merge"])
def test_long_step_table_fits_100_columns(render_text, form, show_all):
    """10^5 scores in blocks of 4096 (keys up to 98304:100000): every line fits 100 columns."""
    trace = online_softmax(_long_input(), 4096, form)
    _fits(render_text(step_table(trace, show_all=show_all, width=100)))


def test_long_element_table_fits_100_columns(render_text):
    s = _long_input()
    p = online_softmax(s, 4096).probabilities
    _fits(render_text(element_table(s, p, stable_softmax(s), naive_softmax(s))))


# ---------------------------------------------------------------------------------------------
# number formatting


def test_num_formats():
    assert num(1 / 3).plain == "0.33333333"
    assert num(1 / 3, 4).plain == "0.3333"
    assert num(1.5530017927759192, 10).plain == "1.553001793"
    assert num(2.688117141816135e43, 4).plain == "2.688e+43"
    assert num(None).plain == ""
    nan, inf, ninf = num(math.nan), num(math.inf), num(-math.inf)
    assert (nan.plain, inf.plain, ninf.plain) == ("nan", "inf", "-inf")
    assert "red" in str(nan.style) and "red" in str(inf.style)  # they stand out


@pytest.mark.parametrize("diff, shown, style", [
    (0.0, "0", "green"), (1e-13, "1e-13", "green"), (1.5e-3, "0.0015", "yellow"),
    (math.nan, "nan", "bold red"), (math.inf, "inf", "bold red"),
])
def test_agreement_styles_like_num(diff, shown, style):
    """A difference is green near 0, yellow otherwise; nan and inf stand out as num shows them."""
    t = agreement("a vs b", diff)
    assert t.plain == f"a vs b: max |difference| = {shown}"
    assert [str(span.style) for span in t.spans] == [style]


def test_arrow_and_values():
    assert arrow(4.0, 4.0).plain == "4"
    assert arrow(-math.inf, 4.0).plain == "-inf → 4"
    assert arrow(math.nan, math.nan).plain == "nan"
    assert values(np.array([2.0, 4.0])).plain == "[2, 4]"
    assert values(np.array([1.0, 2.0, 3.0, 4.0, 5.0])).plain == "[1, 2, 3, …]"
    # as many as fit in a width (at least one), never a value cut short
    assert values(np.array([1.25, -2.5, 3.75, 4.0]), width=15).plain == "[1.25, -2.5, …]"
    assert values(np.array([1.25, -2.5, 3.75, 4.0]), width=14).plain == "[1.25, …]"
    assert values(np.array([5.268e4, -1.748e4]), 4, width=5).plain == "[5.268e+04, …]"
    assert values(np.array([-np.inf, 1.5])).plain == "[-inf, 1.5]"
