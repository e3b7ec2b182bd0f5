"""The public API in FlashAttention's words (issue 20, item 1): every keyword explicit and
named as FlashAttention names it, tensors first, the LSE of FlashAttention's shape, and the
same bits as osm's own records-based call."""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest

import osm_cli
from conftest import osm, qkv, rand
from osm_cli import kernels, testing
from osm_cli.flash.forward import attention as tiled
from osm_cli.flash.options import ScoreOptions

PUBLIC = {
    "attention": osm_cli.attention,
    "attention_backward": osm_cli.attention_backward,
    "attention_reference": osm_cli.attention_reference,
    "check": osm_cli.check,
    "run_kernel": kernels.run_kernel,
    "assert_attention_close": testing.assert_attention_close,
}
FA_NAMES = ("softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
            "learnable_sink", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table")
OSM_NAMES = ("layout", "causal_align", "attn_mask")


@pytest.mark.parametrize("name", PUBLIC)
def test_every_keyword_is_explicit_and_fa_named(name):
    sig = inspect.signature(PUBLIC[name])
    kinds = {p.kind for p in sig.parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds
    assert inspect.Parameter.VAR_POSITIONAL not in kinds
    for kw in FA_NAMES + OSM_NAMES:
        assert sig.parameters[kw].kind is inspect.Parameter.KEYWORD_ONLY, kw
    assert sig.parameters["window_size"].default == (-1, -1)
    assert sig.parameters["softcap"].default == 0.0
    assert "Parameters" in PUBLIC[name].__doc__ and "softmax_scale" in PUBLIC[name].__doc__


def test_tensors_come_first():
    assert list(inspect.signature(osm_cli.attention).parameters)[:3] == ["q", "k", "v"]
    assert list(inspect.signature(osm_cli.attention_backward).parameters)[:5] == [
        "q", "k", "v", "out", "dout"]
    assert list(inspect.signature(osm_cli.check).parameters)[:4] == ["q", "k", "v", "out"]
    assert list(inspect.signature(kernels.run_kernel).parameters)[:3] == ["q", "k", "v"]
    for kw in ("block_q", "block_k", "dtype", "kernel", "mma", "masked_lse", "trace_at"):
        assert kw in inspect.signature(osm_cli.attention).parameters, kw


def test_flash_attn_func_call_is_the_records_call_bit_for_bit():
    """The call a kernel engineer writes equals osm's own (ScoreOptions) call bit for bit."""
    q, k, v = qkv(300, 300, 16, heads=(4, 2), b=2, seed=3)
    sinks = rand(4, seed=9)
    s = 0.3
    new = osm_cli.attention(q, k, v, softmax_scale=s, causal=True, window_size=(128, 0),
                            learnable_sink=sinks, trace_at=(1, 3, 200))
    old = tiled(q, k, v, opts=ScoreOptions(scale=s, causal=True, window=(128, 0), sinks=sinks),
                trace_at=(1, 3, 200))
    assert np.array_equal(new.out, old.out) and np.array_equal(new.lse, old.lse)
    assert len(new.trace.steps) == len(old.trace.steps) > 1
    for a, b in zip(new.trace.steps, old.trace.steps, strict=True):
        assert (a.block, a.m, a.alpha, a.l) == (b.block, b.m, b.alpha, b.l)
        assert np.array_equal(a.o, b.o)
    assert new.tiles.skipped == old.tiles.skipped > 0


def test_no_window_and_no_softcap_are_the_defaults():
    q, k, v = qkv(20, 20, 8, seed=1)
    plain = osm_cli.attention(q, k, v)
    for kw in ({"window_size": (-1, -1)}, {"window_size": None}, {"window_size": (None, None)},
               {"softcap": 0.0}):
        res = osm_cli.attention(q, k, v, **kw)
        assert np.array_equal(res.out, plain.out) and res.options.window is None, kw


def test_window_size_in_parameter_words():
    q, k, v = qkv(4, 4, 2)
    with pytest.raises(osm_cli.InputError, match=r"^`window_size` must be a pair \(left, right\)"):
        osm_cli.attention(q, k, v, window_size=3)
    with pytest.raises(osm_cli.InputError, match=r"^`window_size` must be a pair"):
        osm_cli.attention(q, k, v, window_size=(1.5, 0))


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_lse_is_b_h_n_whatever_the_layout(layout):
    q, k, v = qkv(9, 11, 4, dv=3, heads=(4, 2), b=2, seed=67)
    if layout == "bnhd":
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    res = osm_cli.attention(q, k, v, causal=True, layout=layout)
    ref = osm_cli.attention_reference(q, k, v, causal=True, layout=layout)
    assert res.lse.shape == ref.lse.shape == (2, 4, 9)
    np.testing.assert_allclose(res.lse, ref.lse, atol=1e-12)
    out, lse = ref  # unpacks as FlashAttention's attention_ref
    assert out is ref.out and lse is ref.lse


def test_lse_is_h_total_q_for_varlen():
    cu = np.array([0, 5, 12])
    q, k, v = (rand(12, 3, 4, seed=i) for i in range(3))
    res = osm_cli.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    assert res.out.shape == (12, 3, 4) and res.lse.shape == (3, 12)
    back = osm_cli.attention_backward(q, k, v, res.out, rand(12, 3, 4, seed=7), lse=res.lse,
                                      cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    assert back.dq.shape == (12, 3, 4)


def test_backward_takes_fa_lse_and_osm_0_2_lse():
    """A bnhd forward's LSE as FlashAttention returns it (B, H, N) or as osm 0.2 did (B, N, H):
    the same gradients."""
    q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3))
               for x in qkv(6, 6, 4, heads=(2, 2), b=1, seed=5))
    fwd = osm_cli.attention(q, k, v, layout="bnhd")
    dout = rand(*q.shape, seed=2)
    a = osm_cli.attention_backward(q, k, v, fwd.out, dout, lse=fwd.lse, layout="bnhd")
    b = osm_cli.attention_backward(q, k, v, fwd.out, dout, lse=fwd.lse.transpose(0, 2, 1),
                                   layout="bnhd")
    assert a.delta.shape == (1, 2, 6)
    assert np.array_equal(a.dq, b.dq) and np.array_equal(a.dk, b.dk)


def test_check_reads_either_lse_layout_of_a_bnhd_kernel():
    z = np.load("samples/kernels/fa4_plain_bf16.npz")
    q, k, v, o = (z[n] for n in ("q", "k", "v", "out"))
    res = osm_cli.attention(q, k, v, layout="bnhd", dtype="bf16", kernel="fa4")
    b, n, h, _ = q.shape
    assert res.lse.shape == (b, h, n)
    for lse in (res.lse, res.lse.transpose(0, 2, 1)):
        rep = osm_cli.check(q, k, v, o, lse=lse, dtype="bf16", layout="bnhd", kernel="fa4")
        assert rep.passed and rep.verdict.lse is not None


def test_a_dtype_runs_the_kernels_model():
    """dtype= rounds the inputs and runs the kernel's model: fa2 for bf16, as `osm attention
    --dtype bf16` does; the reference in that dtype is FA's `pt` (upcast=False)."""
    q, k, v = qkv(40, 40, 64, heads=(2, 2), b=1, seed=11)
    res = osm_cli.attention(q, k, v, causal=True, dtype="bf16")
    assert res.options.kernel == "fa2"
    pt = osm_cli.attention_reference(q, k, v, causal=True, dtype="bf16")
    ref = osm_cli.attention_reference(q, k, v, causal=True)
    assert np.abs(res.out - ref.out).max() <= 2 * np.abs(pt.out - ref.out).max() + 1e-2


def test_attention_json_names_the_softmax_scale_apart_from_a_steps_alpha():
    """The attention document's top level says softmax_scale (1/√d here: d = 4); each step's
    "scale" stays its α, the rescale factor (a JSON contract since 0.1)."""
    import json

    r = osm("attention", "samples/qkv.npz", "--causal", "--query", "5", "--block-k", "2",
            "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["softmax_scale"] == 0.5 and "scale" not in doc
    q, k, v = (np.load("samples/qkv.npz")[n] for n in "qkv")
    res = osm_cli.attention(q, k, v, causal=True, block_k=2, trace_at=(0, 0, 5))
    steps = doc["trace"]["steps"]
    assert len(steps) == 4 and [s["scale"] for s in steps] == [s.alpha for s in res.trace.steps]
    assert res.options.softmax_scale == 0.5


def test_backward_json_names_the_softmax_scale_too():
    """osm backward's document says softmax_scale at its top level as attention's does (osm
    0.2 said "scale", the key attention's steps use for α): 1/√d = 0.5 here, and 0.25 given."""
    import json

    from conftest import osm

    for extra, want in (((), 0.5), (("--scale", "0.25"), 0.25)):
        r = osm("backward", *(f"samples/{n}.npy" for n in ("q", "k", "v", "do")), "--causal",
                *extra, "--json")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["softmax_scale"] == want and "scale" not in doc
        assert list(doc)[:5] == ["kernel", "mma", "shape_q", "shape_k", "shape_v"]


def test_fa2_split_kv_of_a_bnhd_batch_is_the_bhnd_one():
    """FA2's split-KV combine (16 splits here) on (B, N, H, d): O stored like Q, the LSE
    (B, H, N); the same bits as the (B, H, N, d) run (the battery found a bnhd mismatch)."""
    import ml_dtypes

    q, k, v = qkv(4, 4096, 64, heads=(2, 2), b=1, layout="bnhd", dtype=ml_dtypes.bfloat16,
                  stream=True)
    a = osm_cli.attention(q, k, v, layout="bnhd", dtype="bf16", kernel="fa2", trace_at=None)
    b = osm_cli.attention(*(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)),
                          dtype="bf16", kernel="fa2", trace_at=None)
    assert a.options.splits == b.options.splits > 1
    assert np.array_equal(a.out, b.out.transpose(0, 2, 1, 3)) and np.array_equal(a.lse, b.lse)


# --- the matmuls every entry point runs (presets.mma_for) ---------------------------------------

@pytest.mark.parametrize("entry", ["attention", "attention_backward", "check",
                                   "assert_attention_close", "run_kernel", "sweep_attention"])
@pytest.mark.parametrize("mma", [None, "blas"])
def test_every_entry_point_resolves_mma(entry, mma, monkeypatch, qkv):
    """No mma: every entry point that runs a preset runs the tensor cores' matmuls (forward and
    backward: its kernel's own arithmetic); mma="blas": BLAS's, in every matmul; never
    anything else reaches gpu_ops.matmul."""
    import osm_cli.precision.emulate as emulate
    import osm_cli.precision.gpu_ops as gpu_ops
    import osm_cli.precision.kernel_backward as kernel_backward
    from osm_cli.kernels import run_kernel
    from osm_cli.studies.sweep import sweep_attention
    from osm_cli.testing import assert_attention_close

    seen = []

    def spy(a, b, how, c=None):
        seen.append(how)
        return gpu_ops.matmul(a, b, how, c)

    monkeypatch.setattr(emulate, "matmul", spy)
    monkeypatch.setattr(kernel_backward, "matmul", spy)
    q, k, v, do = (x.astype(np.float32) for x in qkv(40, 40, 16, heads=(2, 1), b=1, do=True,
                                                      dtype=ml_dtypes.bfloat16))
    kw = {} if mma is None else {"mma": mma}
    out = osm_cli.attention(q, k, v, causal=True, dtype="bf16", mma="blas").out
    seen.clear()
    if entry == "attention":
        osm_cli.attention(q, k, v, causal=True, dtype="bf16", **kw)
    elif entry == "attention_backward":
        osm_cli.attention_backward(q, k, v, None, do, causal=True, dtype="bf16", **kw)
    elif entry == "check":
        osm_cli.check(q, k, v, out, causal=True, dtype="bf16", **kw)
    elif entry == "assert_attention_close":
        assert_attention_close(out, q, k, v, causal=True, dtype="bf16", **kw)
    elif entry == "run_kernel":
        run_kernel(q, k, v, kernel="fa4", causal=True, dtype="bf16", **kw)
    else:
        sweep_attention([8, 16], q, k, v, causal=True, dtype="bf16", **kw)
    assert seen and set(seen) == {mma or "tensor-core"}
    if entry == "attention_backward" and mma is None:  # the kernel's own backward: five
        assert len(seen) >= 2 + 5  # matmuls a tile pair after the forward's two
