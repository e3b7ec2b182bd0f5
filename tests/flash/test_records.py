"""The nested result records (flash/records.py): Attention and Backward share their sub-records,
every record is built by keyword only, and osm 0.2's flat names still read (deprecated) the
value the nested field holds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import osm_cli
from osm_cli.flash.records import (
    Attention,
    AttentionTrace,
    Backward,
    BackwardTrace,
    Counters,
    RunOptions,
    Shapes,
    Tiles,
)


@pytest.fixture(scope="module")
def runs():
    with np.load("samples/causal.npz") as z:
        q, k, v = z["q"], z["k"], z["v"]
    fwd = osm_cli.attention(q, k, v, causal=True, block_q=4, block_k=2, trace_at=(0, 1, [2, 5]))
    do = np.load("samples/do.npy")
    bwd = osm_cli.attention_backward(np.load("samples/q.npy"), np.load("samples/k.npy"),
                                     np.load("samples/v.npy"), None, do, causal=True, block_q=4,
                                     block_k=2, trace_at=(0, 0, 5), trace_key=3)
    return fwd, bwd


def test_the_run_in_sub_records_shared_by_forward_and_backward(runs):
    """samples/causal.npz: (2, 8, 4), causal, tiles 4×2: 8 tiles, the 2 above the diagonal
    skipped, 4 on it partial; softmax_scale 1/√4."""
    fwd, bwd = runs
    for res in runs:
        assert type(res.shapes) is Shapes and type(res.options) is RunOptions
        assert type(res.tiles) is Tiles and type(res.counters) is Counters
        assert res.shapes == Shapes(q=(2, 8, 4), k=(2, 8, 4), v=(2, 8, 4))
        assert res.options.softmax_scale == 0.5 and res.options.causal
        assert res.options.causal_align == "bottom-right" and res.options.window is None
        assert res.tiles == Tiles(block_q=4, block_k=2, computed=6, skipped=2, partial=4,
                                  total=8)
    assert type(fwd.trace) is AttentionTrace and type(bwd.trace) is BackwardTrace
    # 6 computed tiles of 4 query rows each; 8 (row, tile) updates moved a finite max, as the
    # summary in docs/notebooks.md says
    assert fwd.counters == Counters(rescales=8, masked_rows=0, row_visits=24)
    assert bwd.counters == Counters(masked_rows=0)  # the backward counts no rescales, no visits
    assert fwd.trace.at == (0, 1, 2) and fwd.trace.queries == (2, 5)
    assert fwd.trace.steps is fwd.trace.rows[0] and len(fwd.trace.rows) == 2
    assert np.array_equal(fwd.trace.out, fwd.out[1, 2])  # (H, N, d) inputs: head 1, query 2
    assert fwd.trace.outs.shape == (2, 4)
    assert (bwd.trace.at, bwd.trace.key, bwd.trace.kv_head, bwd.trace.group) == ((0, 0, 5), 3,
                                                                                   0, 1)
    assert [s.block for s in bwd.trace.key_steps] == [0, 1]
    assert [s.block for s in bwd.trace.steps] == [0, 1, 2, 3]


@pytest.mark.parametrize("cls", [Attention, Backward, Shapes, RunOptions, Tiles, Counters,
                                 AttentionTrace, BackwardTrace])
def test_every_record_is_built_by_keyword_only_and_frozen(cls):
    assert all(f.kw_only for f in dataclasses.fields(cls))
    with pytest.raises(TypeError):
        cls(*range(len(dataclasses.fields(cls))))
    one = Tiles(block_q=4, block_k=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.block_q = 8


FLAT = {  # osm 0.2's flat name -> where it lives now
    "scale": "options.softmax_scale", "shape_q": "shapes.q", "shape_k": "shapes.k",
    "shape_v": "shapes.v", "block_q": "tiles.block_q", "block_k": "tiles.block_k",
    "causal": "options.causal", "align": "options.causal_align", "window": "options.window",
    "mask": "options.mask", "tiles_computed": "tiles.computed",
    "tiles_skipped": "tiles.skipped", "tiles_partial": "tiles.partial",
    "tiles_total": "tiles.total", "masked_rows": "counters.masked_rows",
    "traced": "trace.at", "queries": "trace.queries", "batch": "options.batch",
    "softcap": "options.softcap", "alibi": "options.alibi", "sinks": "options.sinks",
    "mods": "options.mods",
}
FORWARD = {**FLAT, "masked_lse": "options.masked_lse", "kernel": "options.kernel",
           "splits": "options.splits", "one_shot": "options.one_shot",
           "rescales": "counters.rescales", "row_visits": "counters.row_visits",
           "trace_out": "trace.out", "traces": "trace.rows", "trace_outs": "trace.outs"}
BACKWARD = {**FLAT, "key_trace": "trace.key_steps", "query_trace": "trace.steps",
            "query_traces": "trace.rows", "traced_key": "trace.key",
            "kv_head": "trace.kv_head", "group": "trace.group"}


def _nested(res, path):
    sub, attr = path.split(".")
    return getattr(getattr(res, sub), attr)


def test_the_old_flat_names_read_the_nested_fields_with_a_warning(runs):
    """osm 0.2's Attention had 34 fields: out and lse stay, the other 32 moved (31 here, and
    trace below); Backward's 36 less the 8 that stay (dq, dk, dv, delta, out, lse, own_forward,
    dsink) moved; each old name reads the new field with a DeprecationWarning naming it."""
    fwd, bwd = runs
    assert len(FORWARD) + 1 == 32 and len(BACKWARD) == 28
    for res, flat in ((fwd, FORWARD), (bwd, BACKWARD)):
        for name, path in flat.items():
            with pytest.warns(DeprecationWarning, match=rf"\.{name} is deprecated .*\.{path}"):
                old = getattr(res, name)
            new = _nested(res, path)
            assert old is new or (isinstance(new, np.ndarray) and np.array_equal(old, new))
        with pytest.raises(AttributeError):
            res.tiles_computed = 1


def test_the_old_trace_sequence_reads_the_first_rows_steps(runs):
    """osm 0.2's Attention.trace was the first traced row's steps: indexing, len and iteration
    still give them, with a warning to say trace.steps."""
    fwd, _ = runs
    with pytest.warns(DeprecationWarning, match="trace.steps"):
        assert len(fwd.trace) == 4
    with pytest.warns(DeprecationWarning, match="trace.steps"):
        assert fwd.trace[0] is fwd.trace.steps[0]
    with pytest.warns(DeprecationWarning, match="trace.steps"):
        assert list(fwd.trace) == list(fwd.trace.steps)


def test_replace_takes_the_nested_records(runs):
    """A changed copy is built by keyword too: the sub-record replaced whole."""
    fwd, _ = runs
    two = dataclasses.replace(fwd, tiles=dataclasses.replace(fwd.tiles, skipped=3))
    assert (two.tiles.skipped, fwd.tiles.skipped) == (3, 2) and two.options is fwd.options
    with pytest.raises(TypeError):
        dataclasses.replace(fwd, tiles_skipped=3)
