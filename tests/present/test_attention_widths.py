"""O in view: attention's trace shows O's leading components at 72, 80 and 100 columns (fewer
digits and components before none), says what a width leaves out, and says when a single K/V
tile hides every online step; trace's dropped values column is noted."""

from __future__ import annotations

import re

import pytest

from conftest import osm

ATTENTION = ("attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
             "--block-q", "4", "--block-k", "2")


@pytest.mark.parametrize("width, row0", [
    (72, "[-1.08, 0.244, 1.15]"), (80, "[-1.08, 0.244, 1.15]"), (100, "[-1.085, 0.2441, 1.147]"),
])
def test_o_components_at_every_width(width, row0):
    out = osm(*ATTENTION, width=width, code=0).stdout
    trace = out[out.index("trace of batch 0"):out.index("output row")]
    assert "O[:3] of 4" in trace  # O has 4 components; the trace records the first 3
    tile0 = next(line for line in trace.splitlines() if re.match(r"\s+0\s+0:2\s", line))
    assert row0 in tile0
    assert "left out" not in trace  # nothing of O is left out at these widths
    assert max(len(line) for line in out.splitlines()) <= width


def test_a_narrow_terminal_says_what_of_o_it_left_out():
    out = osm(*ATTENTION, width=56, code=0).stdout
    assert re.search(r"\(O\[\d:3\] left out at this width: --json or --csv has it,", out)


def test_one_tile_says_so_and_how_to_see_steps():
    """bf16 runs fa2's model, whose K/V tiles are 128 keys: the 8-key sample is one tile."""
    out = osm("attention", "samples/q.npy", "samples/k.npy", "samples/v.npy", "--dtype", "bf16",
              width=100, code=0).stdout
    assert ("(one K/V tile holds all 8 keys, so no online step shows: --block-k 2 makes tiles "
            "of 2 keys)") in out
    more = osm("attention", "samples/q.npy", "samples/k.npy", "samples/v.npy", "--dtype", "bf16",
               "--block-k", "2", width=100, code=0).stdout
    assert "one K/V tile" not in more
    assert re.search(r"\n\s+3\s+6:8\s", more)  # four tiles of two keys


@pytest.mark.parametrize("width, noted", [(72, True), (100, False)])
def test_trace_notes_a_dropped_values_column(width, noted):
    out = osm("trace", "samples/masked.txt", "-b", "4", width=width, code=0).stdout
    header = out[:out.index("─")]
    assert ("values" in header.split("\n")[-2]) is not noted
    assert ("the values column is left out at this width" in out) is noted
