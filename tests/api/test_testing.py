"""osm_cli.testing.assert_attention_close (issue 13, item 9): a kernel's pytest suite judges its
output in one line; silent on PASS, an AssertionError with osm check's report on FAIL.

The kernel is samples/kernel_bf16.npz, PyTorch's FlashAttention-2 (causal, bf16 values stored
as float32); the failing one has one output row reversed (row 200 of head 1: 332 ulps off).
A row scaled by 1.05 would still pass in bf16: the rule's bound is twice plain attention's
error (README, "The model against a real kernel"). Gradients are the float64 ones cast to bf16.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conftest import rand
from osm_cli.errors import OsmError
from osm_cli.testing import as_numpy, assert_attention_close

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "samples" / "kernel_bf16.npz"


def _kernel():
    z = np.load(KERNEL)
    return z["out"], z["q"], z["k"], z["v"], z["lse"]


def _reversed_row(o):
    o = o.copy()
    o[0, 1, 200] = o[0, 1, 200][::-1].copy()
    return o


SUITE = textwrap.dedent(f'''
    import numpy as np
    from osm_cli.testing import assert_attention_close

    z = np.load({str(KERNEL)!r})


    def test_kernel_passes():
        assert_attention_close(z["out"], z["q"], z["k"], z["v"], lse=z["lse"], dtype="bf16",
                               causal=True)


    def test_kernel_with_a_bad_row_fails():
        out = z["out"].copy()
        out[0, 1, 200] = out[0, 1, 200][::-1].copy()
        assert_attention_close(out, z["q"], z["k"], z["v"], lse=z["lse"], dtype="bf16",
                               causal=True)
''')


def test_a_kernel_suite_under_pytest(tmp_path):
    """A kernel's own test file, run by pytest: one test passes, the other fails with the
    report (the verdict, its bound, the worst row 0 1 200 first, the worst heads)."""
    (tmp_path / "test_kernel.py").write_text(SUITE)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_kernel.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "1 failed, 1 passed" in out
    assert "FAILED test_kernel.py::test_kernel_with_a_bad_row_fails" in out
    assert "AssertionError: out fails FlashAttention's rule: max|out − ref| =" in out
    assert "0.324 > 2·0.0156 + 2·0.00781 = 0.0469 (bfloat16); 1 of 512 rows over the bound" in out
    assert "worst 5 rows" in out and "worst heads" in out
    worst = next(line for line in out.splitlines() if line.split()[:3] == ["E", "0", "1"])
    assert worst.split()[1:6] == ["0", "1", "200", "0.324", "332"]
    assert "assert_attention_close(out, z" in out  # pytest points at the test's own line


def test_silent_on_pass():
    out, q, k, v, lse = _kernel()
    assert assert_attention_close(out, q, k, v, lse=lse, dtype="bf16", causal=True) is None


def test_fail_message_carries_the_report():
    out, q, k, v, lse = _kernel()
    with pytest.raises(AssertionError) as info:
        assert_attention_close(_reversed_row(out), q, k, v, lse=lse, dtype="bf16", causal=True,
                               msg="my_kernel, causal, bf16")
    text = str(info.value)
    assert text.startswith("my_kernel, causal, bf16\nout fails FlashAttention's rule: "
                           "max|out − ref| = 0.324 > ")
    assert "FlashAttention test rule" in text
    assert "rows over the bound                1 of 512" in text
    assert "\x1b[" not in text and all(line == line.rstrip() for line in text.splitlines())


def test_a_wrong_lse_fails_too():
    out, q, k, v, lse = _kernel()
    with pytest.raises(AssertionError, match=r"max\|lse − ref\| = 0\.05 > "):
        assert_attention_close(out, q, k, v, lse=lse + np.float32(0.05), dtype="bf16",
                               causal=True)


def test_dtype_defaults_to_the_outputs():
    """Without dtype, out's own: this float32 output of a bf16 kernel is then judged as fp32 and
    fails, with the hint to name bf16."""
    out, q, k, v, _ = _kernel()
    with pytest.raises(AssertionError, match="Judge it with --dtype bfloat16"):
        assert_attention_close(out, q, k, v, causal=True)
    b = ml_dtypes.bfloat16
    assert_attention_close(out.astype(b), q.astype(b), k.astype(b), v.astype(b), causal=True)


def test_mask_scale_and_layout_options():
    """bnhd (FlashAttention's (B, N, H, d)) with the LSE left (B, H, N); a mask as check's."""
    out, q, k, v, lse = _kernel()
    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    assert_attention_close(t(out), t(q), t(k), t(v), lse=lse, dtype="bf16", causal=True,
                           layout="bnhd")
    causal = np.tril(np.ones((256, 256), bool))
    assert_attention_close(out, q, k, v, lse=lse, dtype="bf16", mask=causal)
    with pytest.raises(AssertionError):
        assert_attention_close(out, q, k, v, dtype="bf16", causal=True, scale=0.2)


def test_unknown_kernel_gradients_and_bad_input():
    out, q, k, v, _ = _kernel()
    with pytest.raises(ValueError, match=r"unknown kernel 'fa3'; known: fa2"):
        assert_attention_close(out, q, k, v, kernel="fa3")
    with pytest.raises(OsmError, match="judging gradients needs dO"):
        assert_attention_close(out, q, k, v, dq=np.zeros_like(q), dtype="bf16", causal=True)
    with pytest.raises(OsmError, match="OUT has shape"):
        assert_attention_close(out[..., :8], q, k, v, dtype="bf16")


def test_gradients_are_judged_too():
    """With do, the kernel's dq, dk, dv: the float64 gradients cast to bf16 pass; one dK row
    5 % off fails, and the message names dK's rule."""
    from osm_cli import attention_reference

    out, q, k, v, lse = _kernel()
    do = rand(*q.shape, seed=7, dtype=np.float32)
    b = ml_dtypes.bfloat16
    do = do.astype(b).astype(np.float32)
    dq, dk, dv = (g.astype(b) for g in attention_reference(q, k, v, dout=do, causal=True).grads)
    assert_attention_close(out, q, k, v, lse=lse, do=do, dq=dq, dk=dk, dv=dv, dtype="bf16",
                           causal=True)
    dk = dk.copy()
    dk[0, 0, 3] *= b(1.05)
    with pytest.raises(AssertionError, match="dK") as info:
        assert_attention_close(out, q, k, v, do=do, dk=dk, dtype="bf16", causal=True)
    assert "dK rule" in str(info.value)


def test_numpy_only_never_imports_torch():
    code = ("import sys, numpy as np\n"
            "from osm_cli.testing import assert_attention_close\n"
            "z = np.load(sys.argv[1])\n"
            "assert_attention_close(z['out'], z['q'], z['k'], z['v'], dtype='bf16', "
            "causal=True)\n"
            "print('torch' in sys.modules, 'typer' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(KERNEL)], capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout == "False False\n"


def test_torch_tensors_keep_their_dtype():
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch path of "
                                "assert_attention_close is not exercised")
    out, q, k, v, lse = _kernel()
    tb = [torch.from_numpy(x).to(torch.bfloat16) for x in (out, q, k, v)]
    assert as_numpy(tb[0]).dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(as_numpy(tb[0]).astype(np.float32), out)  # bf16 values, exactly
    assert_attention_close(*tb, lse=torch.from_numpy(lse), causal=True)  # dtype from out: bf16
    bad = tb[0].clone()
    bad[0, 1, 200] = bad[0, 1, 200].flip(0)
    with pytest.raises(AssertionError, match="1 of 512 rows over the bound"):
        assert_attention_close(bad, *tb[1:], causal=True)
    grad = torch.ones(3, requires_grad=True) * 2  # a tensor in a graph: detached, not refused
    assert as_numpy(grad).tolist() == [2.0, 2.0, 2.0]
    assert as_numpy(torch.ones(2, dtype=torch.float16)).dtype == np.float16
    if hasattr(torch, "float8_e4m3fn"):
        f8 = torch.tensor([0.5, 448.0]).to(torch.float8_e4m3fn)
        assert as_numpy(f8).dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def test_takes_every_keyword_check_takes():
    """Issue 22: assert_attention_close takes every keyword osm_cli.check takes (with_model was
    missing: a TypeError), and with_model=False reaches check."""
    import inspect

    from osm_cli import check

    mine = inspect.signature(assert_attention_close).parameters
    assert [n for n in inspect.signature(check).parameters if n not in mine] == []
    out, q, k, v, lse = _kernel()
    assert_attention_close(out, q, k, v, lse=lse, causal=True, dtype="bf16", with_model=False)
    with pytest.raises(OsmError, match="which `with_model` False skips"):
        assert_attention_close(out, q, k, v, causal=True, dtype="bf16", rule="model",
                               with_model=False)
