"""--explain: each step's arithmetic with its actual numbers, under the table, as a learner reads
it at 72, 80 and 100 columns (the seed's worked examples, the guard of a fully masked row, the
merge form, a lazy rescale, attention's O = O·α + P·V)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import osm, qkv
from osm_cli import online_softmax
from osm_cli.reports.explain import attention_lines, trace_lines

ATTENTION = ("attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
             "--block-q", "4", "--block-k", "2")


def text(width, *args):
    """What `osm *args` prints at `width` columns (exit 0, nothing on stderr)."""
    result = osm(*args, width=width, code=0)
    assert result.stderr == ""
    return result.stdout


def _section(out: str, title: str) -> list[str]:
    lines = out.splitlines()
    start = lines.index(title)
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return [line.rstrip() for line in lines[start + 1:end]]


@pytest.mark.parametrize("width", [72, 80, 100])
def test_the_max_moves(width):
    """Blocks [1, 2] then [5, 3]: the seed's second example, every number as the table has it."""
    out = text(width, "trace", "--values", "1,2,5,3", "-b", "2",
               "--explain")
    assert _section(out, "each block's arithmetic") == [
        "block 0, keys 0:2, scores [1, 2]",
        "   m = max(-inf, 2) = 2",
        "   α = exp(-inf − 2) = 0",
        "   l = 0·0 + exp(1−2) + exp(2−2) = 1.3678794",
        "block 1, keys 2:4, scores [5, 3]",
        "   m = max(2, 5) = 5",
        "   α = exp(2 − 5) = 0.049787068",
        "   l = 1.3678794·0.049787068 + exp(5−5) + exp(3−5) = 1.203438",
    ]
    assert max(len(line) for line in out.splitlines()) <= width
    # the arithmetic is right: 1.3678794·e^(2−5) + e^0 + e^(−2)
    assert math.isclose((math.exp(-1) + 1) * math.exp(-3) + 1 + math.exp(-2), 1.203438,
                        rel_tol=1e-6)


@pytest.mark.parametrize("width", [72, 80])
def test_merge_form(width):
    out = text(width, "trace", "--values", "1,2,5,3", "-b", "2",
               "--form", "merge", "--explain")
    assert _section(out, "each block's arithmetic")[6:] == [
        "block 1, keys 2:4, scores [5, 3]",
        "   m⁽ᵏ⁾ = max(5, 3) = 5",
        "   l⁽ᵏ⁾ = exp(5−5) + exp(3−5) = 1.1353353",
        "   m = max(2, 5) = 5",
        "   α = exp(2 − 5) = 0.049787068,  w = exp(5 − 5) = 1",
        "   l = 1.3678794·0.049787068 + 1.1353353·1 = 1.203438",
    ]


def test_a_fully_masked_row_names_the_guard():
    out = text(80, "trace", "--values", "-inf,-inf,-inf", "-b", "2",
               "--explain")
    lines = _section(out, "each block's arithmetic")
    assert lines[:2] == ["block 0, keys 0:2, scores [-inf, -inf]",
                         "   m = max(-inf, -inf) = -inf"]
    assert lines[2].startswith("   α = 0: the guard. m is still -inf (every score so far")
    assert "   l = 0·0 + 2 × exp(-inf) = 0" in lines


def test_long_blocks_sum_as_one_number_and_wrap_indented():
    out = text(80, "trace", "--values", "0,1,2,3,4,5,6,7", "-b", "4",
               "--explain")
    lines = _section(out, "each block's arithmetic")
    assert lines[-2:] == [
        "   l = 1.5530018·0.018315639 + (exp(4−7) + exp(5−7) + … 2 more = 1.5530018) =",
        "   1.581446",
    ]


def test_lazy_rescale_says_m_stays():
    t = online_softmax(np.array([0.0, 1.0, 2.0, 3.0]), 2, threshold=2.5)
    assert trace_lines(t.steps[1])[0] == (
        "m stays 1: the block max 3 is within τ of m (lazy rescale: no rescale, α = 1)")


@pytest.mark.parametrize("width", [72, 80, 100])
def test_attention_explains_o(width):
    out = text(width, *ATTENTION, "--explain")
    lines = _section(out, "each tile's arithmetic")
    assert lines[lines.index("tile 1, keys 2:4"):] == [
        "tile 1, keys 2:4",
        "   m = max(1.792688, -0.345765) = 1.792688",
        "   α = exp(1.792688 − 1.792688) = 1",
        "   l = l·α + ΣP = 1.147522·1 + 0.117837 = 1.265359",
        "   O = O·α + P·V, on O's leading components:",
        "     O[0] = -1.084855·1 − 0.002762556 = -1.087618",
        "     O[1] = 0.2440847·1 + 0.008418486 = 0.2525032",
        "     O[2] = 1.147483·1 − 0.08865011 = 1.058833",
        "tile 2, keys 4:6",
        "   skipped, not computed: the mask hides its keys; m, l, O unchanged",
        "tile 3, keys 6:8",
        "   skipped, not computed: the mask hides its keys; m, l, O unchanged",
    ]
    assert max(len(line) for line in out.splitlines()) <= width
    # O/l of the last computed tile is the output row the table shows
    assert math.isclose(-1.087618 / 1.265359, -0.8595332, rel_tol=1e-6)


def test_attention_lines_first_tile_starts_from_zero():
    from osm_cli.flash.forward import attention
    from osm_cli.flash.options import ScoreOptions, Tiling

    q, k, v = qkv(4, 4, 3)
    res = attention(q, k, v, opts=ScoreOptions(), tiling=Tiling(block_q=4, block_k=2),
                    trace_at=(0, 0, 1))
    first = attention_lines(res.trace.steps[0], None)
    assert first[1] == f"α = exp(-inf − {res.trace.steps[0].m:.7g}) = 0"
    assert first[4].startswith("  O[0] = 0·0 ")
