"""A batch with one key (N_k = 1): softmax is exactly 1, so out = V and the exact dQ and dK
are 0 (dS = P∘(dP − D) with dP = D = dO·V). FlashAttention's rule then bounds dQ and dK by 0
(plain attention's error and the rounding term are both 0), which no float32 kernel meets: on
an H200 PyTorch's flash backward gave 1.7e-7 (benchmarks/results/battery_h200_full.txt). The
bound there is float32's rounding of the cancelling terms (gradcheck.cancel_floor): a kernel
whose dP and D differ by an ulp passes, one that forgets D fails."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from osm_cli.flash.options import ScoreOptions
from osm_cli.precision.check import check
from osm_cli.precision.gradcheck import U32, cancel_floor

BF16 = ml_dtypes.bfloat16


def _bf16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(BF16).astype(np.float32)


def _one_key(t: int = 2, d: int = 64, seed: int = 3):
    """Q (1, 1, t, d), K and V (1, 1, 1, d), dO, in bf16 values; out = V on every row."""
    rng = np.random.default_rng(seed)
    q = _bf16(rng.standard_normal((1, 1, t, d)))
    k, v = (_bf16(rng.standard_normal((1, 1, 1, d))) for _ in range(2))
    do = _bf16(rng.standard_normal((1, 1, t, d)))
    return q, k, v, do, np.broadcast_to(v, (1, 1, t, d)).copy()


def _grads(q, k, v, do, *, ds):
    """A float32 kernel's dQ, dK, dV for dS (t, 1), rounded to bf16 (P = 1, dV = Σ dO)."""
    scale = np.float32(1 / np.sqrt(q.shape[-1]))
    dq = _bf16((ds @ k[0, 0]) * scale)[None, None]
    dk = _bf16((ds.T @ q[0, 0]) * scale)[None, None]
    dv = _bf16(do[0, 0].astype(np.float64).sum(axis=0, keepdims=True))[None, None]
    return dq, dk, dv


def _dp(do, v) -> np.ndarray:
    return (do[0, 0] @ v[0, 0].T).astype(np.float32)  # (t, 1), float32 as the kernels'


@pytest.mark.parametrize("rule", ["fa", "model"])
def test_a_kernel_off_by_an_ulp_of_dp_passes(rule):
    q, k, v, do, out = _one_key()
    dp = _dp(do, v)
    d_row = np.nextafter(dp, np.float32(np.inf))  # D one float32 ulp from dP, as on the H200
    dq, dk, dv = _grads(q, k, v, do, ds=dp - d_row)
    assert np.abs(dq).max() > 0 and np.abs(dk).max() > 0  # the kernel's dQ, dK are not 0
    rep = check(out, q, k, v, "bf16", do=do, dq=dq, dk=dk, dv=dv, rule=rule)
    verdicts = {t.tensor: t for t in rep.tensors}
    assert rep.passed, [(t.tensor, t.judged.err, t.judged.bound) for t in rep.tensors]
    for name in ("dq", "dk"):
        g = next(x for x in rep.grads if x.name == name)
        assert g.floor > 0 and verdicts[name].judged.bound == pytest.approx(g.floor)
        assert 0 < g.rule.err <= g.floor
    fa_dq = next(x for x in rep.grads if x.name == "dq").rule
    assert fa_dq.k_abs == fa_dq.bound and "exact gradient is 0" in fa_dq.note


def test_a_kernel_without_d_fails():
    q, k, v, do, out = _one_key()
    dp = _dp(do, v)
    dq, dk, dv = _grads(q, k, v, do, ds=dp)  # dS = P∘dP: D left out
    for rule in ("fa", "model"):
        rep = check(out, q, k, v, "bf16", do=do, dq=dq, dk=dk, dv=dv, rule=rule)
        assert [t.tensor for t in rep.failures] == ["dq", "dk"]
        g = next(x for x in rep.grads if x.name == "dq")
        assert g.rule.err > 1e4 * g.floor  # garbage is of the terms' size, the floor 1e-7 of it


def test_the_floor_is_float32s_rounding_of_the_terms():
    """2·u·2·max‖dO_i‖·max‖V_j‖·scale times max|K| (dQ), or max|Q| × the rows of a kv head
    (dK); dV does not cancel."""
    q, k, v, do, _ = _one_key(t=3, d=16)
    opts = ScoreOptions()
    base = 2 * np.linalg.norm(do, axis=-1).max() * np.linalg.norm(v, axis=-1).max() / 4
    assert cancel_floor("dq", q, k, v, do, opts) == pytest.approx(2 * U32 * base *
                                                                  np.abs(k).max())
    assert cancel_floor("dk", q, k, v, do, opts) == pytest.approx(2 * U32 * base *
                                                                  np.abs(q).max() * 3)
    assert cancel_floor("dv", q, k, v, do, opts) == 0.0


def test_the_forward_of_one_key_passes_exactly_and_fails_when_wrong():
    """out = V exactly (the correctly rounded V) passes; V × 1.02 fails. The forward's bound is
    not 0 here: the rounding term of V's own values gives it."""
    q, k, v, _, out = _one_key()
    rep = check(out, q, k, v, "bf16")
    assert rep.passed and rep.verdict.rule.err == 0 and rep.verdict.rule.bound > 0
    bad = check(_bf16(out * 1.02), q, k, v, "bf16")
    assert [t.tensor for t in bad.failures] == ["out"]


def test_a_gradient_that_is_not_identically_0_keeps_fas_bound():
    """Two keys: dQ is not 0, the floor is not taken (FlashAttention's bound as it was)."""
    rng = np.random.default_rng(5)
    q, k, v, do = (_bf16(rng.standard_normal((1, 1, 4, 32))) for _ in range(4))
    from osm_cli.flash.reference import reference, reference_backward

    out = _bf16(reference(q, k, v)[0])
    dq, dk, dv = (_bf16(g) for g in reference_backward(q, k, v, do))
    rep = check(out, q, k, v, "bf16", do=do, dq=dq, dk=dk, dv=dv)
    assert rep.passed and all(g.floor == 0 and g.rule.k_abs == 0 for g in rep.grads)
