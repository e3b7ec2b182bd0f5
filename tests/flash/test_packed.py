"""Packed (varlen) and paged batches cut into their sequences: the rows each sequence reads,
and a clear error for every malformed cu_seqlens, page table or seqused_k."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import rand
from osm_cli.errors import InputError, ShapeError
from osm_cli.flash.packed import (
    Packing,
    gather,
    lse_parts,
    plan_packing,
    scatter_kv,
    scatter_lse,
    scatter_rows,
)


def test_varlen_sequences_and_round_trip():
    cu_q = np.array([0, 3, 3, 7], np.int32)  # the middle sequence has no queries
    cu_k = np.array([0, 5, 6, 6], np.int32)  # the last has no keys
    q, k, v = rand(7, 4, 8), rand(6, 2, 8, seed=1), rand(6, 2, 5, seed=2)
    p = plan_packing(q, k, v, Packing(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k))
    assert [(s.t, s.s) for s in p.seqs] == [(3, 5), (0, 1), (4, 0)]
    qb, kb, vb = gather(p, p.seqs[0], q, k, v)
    assert qb.shape == (1, 4, 3, 8) and kb.shape == (1, 2, 5, 8) and vb.shape == (1, 2, 5, 5)
    np.testing.assert_array_equal(qb[0, 1, 2], q[2, 1])
    parts = [gather(p, s, q, k, v)[0] for s in p.seqs]
    np.testing.assert_array_equal(scatter_rows(p, parts, np.float64, 8), q)
    lse = rand(4, 7, seed=3)
    np.testing.assert_array_equal(scatter_lse(p, lse_parts(p, lse), np.float64), lse)
    dk = scatter_kv(p, [gather(p, s, q, k, v)[1] for s in p.seqs], k)
    np.testing.assert_array_equal(dk, k)


@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_paged_cache_reads_its_pages_in_table_order(kv_layout):
    pages, ps, hk, d = 6, 4, 2, 3
    cache = rand(pages, ps, hk, d)
    k = cache if kv_layout == "nhd" else cache.swapaxes(1, 2).copy()
    table = np.array([[5, 0, 3], [2, 2, 1]], np.int32)  # sequence 1 reads page 2 twice
    used = np.array([10, 6], np.int32)
    q = rand(2, 3, 4, d, seed=1)
    p = plan_packing(q, k, k, Packing(page_table=table, seqused_k=used, kv_layout=kv_layout))
    assert [s.s for s in p.seqs] == [10, 6]
    assert p.seqs[0].pages.tolist() == [5] * 4 + [0] * 4 + [3] * 2
    _, kb, _ = gather(p, p.seqs[0], q, k, k)
    want = np.concatenate([cache[5], cache[0], cache[3, :2]])  # (10, Hkv, d)
    np.testing.assert_array_equal(kb[0].swapaxes(0, 1), want)
    ones = [np.ones((1, hk, s.s, d)) for s in p.seqs]
    grad = scatter_kv(p, ones, k)
    flat = grad if kv_layout == "nhd" else grad.swapaxes(1, 2)
    # sequence 1's keys 0-3 and 4-5 both come from page 2: its first two rows get both
    assert (flat[2, :2] == 2).all() and (flat[2, 2:] == 1).all()
    assert flat[4].sum() == 0 and flat[3, 2:].sum() == 0


@pytest.mark.parametrize("packing, words", [
    (dict(cu_seqlens_q=[1, 3, 7], cu_seqlens_k=[0, 3, 6]), "cu_seqlens_q must start at 0"),
    (dict(cu_seqlens_q=[0, 5, 3, 7], cu_seqlens_k=[0, 1, 2, 6]),
     "cu_seqlens_q must be non-decreasing; it falls from 5 to 3 at index 2"),
    (dict(cu_seqlens_q=[0, 3, 6], cu_seqlens_k=[0, 3, 6]),
     "cu_seqlens_q ends at 6, but the packed tensor has 7 rows"),
    (dict(cu_seqlens_q=[0.0, 7.0], cu_seqlens_k=[0, 6]), "cu_seqlens_q must be a vector of int"),
    (dict(cu_seqlens_q=[0, 7], cu_seqlens_k=[0, 3, 6]), "cu_seqlens_k gives 2 sequences"),
    (dict(cu_seqlens_q=[0, 3, 7], cu_seqlens_k=[0, 3, 6], seqused_k=[3, 4]),
     "seqused_k[1] = 4, more keys than sequence 1 has (cu_seqlens_k gives 3)"),
])
def test_malformed_varlen_is_refused(packing, words):
    q, k = rand(7, 2, 4), rand(6, 2, 4)
    packing = {n: np.asarray(x) for n, x in packing.items()}
    with pytest.raises((InputError, ShapeError), match=re.escape(words)):
        plan_packing(q, k, k, Packing(**packing))


@pytest.mark.parametrize("table, used, words", [
    ([[0, 9]], [5], r"page_table\[0, 1\] = 9 is not a page of the cache \(0 to 3\)"),
    ([[0, 1]], [9], r"seqused_k\[0\] = 9, more keys than sequence 0 has \(its pages hold 8\)"),
    ([[0, 1]], None, "a paged K/V cache needs seqused_k"),
])
def test_malformed_pages_are_refused(table, used, words):
    k = rand(4, 4, 1, 2)
    with pytest.raises(InputError, match=words):
        plan_packing(rand(1, 2, 1, 2), k, k, Packing(
            page_table=np.array(table), seqused_k=None if used is None else np.array(used)))


def test_unused_page_table_entries_are_not_checked():
    k = rand(4, 4, 1, 2)
    p = plan_packing(rand(1, 2, 1, 2), k, k, Packing(page_table=np.array([[1, -1, 99]]),
                                                       seqused_k=np.array([3])))
    assert p.seqs[0].pages.tolist() == [1, 1, 1]


def test_wrong_ranks_are_shape_errors():
    with pytest.raises(ShapeError, match=r"with cu_seqlens_q it must be \(total_q, H, d\)"):
        plan_packing(rand(1, 7, 2, 4), rand(6, 2, 4), rand(6, 2, 4),
                     Packing(cu_seqlens_q=np.array([0, 7]), cu_seqlens_k=np.array([0, 6])))
    with pytest.raises(InputError, match="give one"):
        plan_packing(rand(1, 2, 1, 2), rand(4, 4, 1, 2), rand(4, 4, 1, 2),
                     Packing(page_table=np.zeros((1, 1), int), cu_seqlens_k=np.array([0, 3])))
