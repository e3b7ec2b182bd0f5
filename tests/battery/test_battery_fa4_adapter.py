"""The `flash_attn.cute` adapter (FlashAttention-4) against a stand-in module with FA4's
signatures and its LSE rule: flash_attn.cute computes an LSE only when return_lse=True (or a
backward needs it), and a paged cache goes through flash_attn_varlen_func with a dense q."""

import sys
import types

import pytest

from osm_cli.battery import run
from osm_cli.battery.adapters import builtin

torch = pytest.importorskip("torch", reason="the adapter hands torch tensors")

from kernels.planted import flash_numpy  # noqa: E402

CALLS: list = []


def _fa4(q, k, v, *, softmax_scale=None, causal=False, window_size=(None, None),
         learnable_sink=None, softcap=0.0, return_lse=False, **varlen):
    """FA4's contract on the numpy kernel: window sides None for unbounded, LSE only if asked."""
    CALLS.append({"return_lse": return_lse, "window_size": window_size, **varlen})
    win = tuple(-1 if w is None else w for w in window_size)
    arrays = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in varlen.items()}
    out, lse = flash_numpy(
        q.float().numpy(), k.float().numpy(), v.float().numpy(), softmax_scale=softmax_scale,
        causal=causal, window_size=win, softcap=softcap, learnable_sink=None if
        learnable_sink is None else learnable_sink.numpy(), **arrays)
    lse = torch.from_numpy(lse) if return_lse or q.requires_grad else None
    return torch.from_numpy(out).to(q.dtype), lse


def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None,
                    causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
                    return_lse=False):
    return _fa4(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                learnable_sink=learnable_sink, softcap=softcap, return_lse=return_lse)


def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                           max_seqlen_q=None, max_seqlen_k=None, seqused_k=None,
                           page_table=None, softmax_scale=None, causal=False,
                           window_size=(None, None), learnable_sink=None, softcap=0.0,
                           return_lse=False):
    if page_table is not None:
        assert q.dim() == 4 and cu_seqlens_q is None, "paged: q (B, N, H, d), no cu_seqlens"
        extra = {"page_table": page_table, "seqused_k": seqused_k}
    else:
        extra = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                 "max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k,
                 "seqused_k": seqused_k}
    return _fa4(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                learnable_sink=learnable_sink, softcap=softcap, return_lse=return_lse, **extra)


@pytest.fixture
def fake_fa4(monkeypatch):
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func, cute.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    pkg = types.ModuleType("flash_attn")
    pkg.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    CALLS.clear()
    return CALLS


def test_fa4_adapter_declares_paged_and_asks_for_the_lse(fake_fa4):
    fn = builtin("flash_attn.cute")
    assert set(fn.osm_features.split(",")) == {
        "causal", "gqa", "window", "softcap", "sink", "varlen", "paged", "lse", "grad"}
    q = torch.randn(1, 5, 2, 16, dtype=torch.bfloat16)
    out, lse = fn(q, q, q, window_size=(3, -1))
    assert lse is not None and tuple(lse.shape) == (1, 2, 5) and out.shape == q.shape
    assert fake_fa4[-1]["return_lse"] is True and fake_fa4[-1]["window_size"] == (3, None)


def test_fa4_adapter_passes_the_forward_battery_with_paged_and_varlen(fake_fa4):
    rep = run("flash_attn.cute", features="causal,gqa,window,softcap,sink,varlen,paged,lse",
              cases=3, head_dims="32", reference="numpy")
    assert rep.passed, [r.message for r in rep.results if not r.passed]
    for row in ("paged", "varlen", "sink", "lse"):
        assert rep.cell(row, "fa-shapes")[0] == "PASS", row
    paged = [c for c in fake_fa4 if "page_table" in c]
    assert paged and all(c["seqused_k"] is not None for c in paged)
    assert all(c["return_lse"] for c in fake_fa4)
