"""`check` in FlashAttention's words: a kernel's output (and LSE, and gradients) judged by
FlashAttention's test rules against the float64 reference of the dtype-rounded inputs, the
kernel's precision model beside (precision/check.py judges; `osm check` prints the report).

Leaves out: the rules (precision/rule.py, gradcheck.py), printing (present/verdicts.py).
"""

from __future__ import annotations

import numpy as np

from osm_cli.precision.check import CheckReport

from .keywords import descale, documented, scores_of


@documented()
def check(
    q, k, v, out, *, lse=None, dout=None, dq=None, dk=None, dv=None, dsink=None,
    softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple | None = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
    layout: str = "bhnd", kv_layout: str = "nhd", causal_align: str = "bottom-right",
    attn_mask=None, score_mod=None, mask_mod=None,
    dtype: str | None = None, kernel: str | None = None,
    mma: str | None = None, q_descale=None, k_descale=None, v_descale=None,
    grad_rule: str = "fa3", rule: str = "fa", lse_base: str = "e", probe: bool = True,
    rules_table: bool = False, top: int = 5, with_model: bool = True,
) -> CheckReport:
    """Judge a kernel's `out` (and `lse`, and `dq`, `dk`, `dv` for `dout`) for inputs q, k, v
    by FlashAttention's test rule (docs/numerics.md#precision-model, #grad-rule).

    Parameters
    ----------
    q, k, v : array
        The kernel's inputs, as `attention`'s; rounded to dtype (values already in it stay).
    out : array
        The kernel's output, shaped like Q (dv last).
    lse : array, optional
        The kernel's LSE: (B, H, N) as FlashAttention returns it (for bnhd inputs also
        (B, N, H)), (H, total_q) for a varlen batch.
    dout, dq, dk, dv : array, optional
        The upstream gradient and the kernel's gradients for it (any of dq, dk, dv).
    dsink : array (H,), optional
        The kernel's gradient of learnable_sink for dout, judged as FlashAttention-4's tests
        do (2·plain error + 2 float32 ulps).
    {score}
    dtype : str, optional
        The kernel's dtype ("bf16", "fp16", "e4m3", …); None: out's own.
    kernel : {{"fa2", "fa4", "fa4-sm100", "tiles"}}, optional
        The kernel whose model runs beside; None: fa2 for 16-bit, fa4-sm100 for FP8.
    mma : {{"tensor-core", "blas"}}, optional
        How that model's matmuls round; None: a preset's "tensor-core" (bit-faithful), tiles'
        "blas".
    q_descale, k_descale, v_descale : array (B, Hkv), optional
        FP8's descale factors: q, k, v hold x / descale.
    grad_rule : {{"fa3", "fa2"}}
        The backward rule dq, dk, dv are judged by (FA3/FA4's tests, or FA2's).
    rule : {{"fa", "model"}}
        What decides each tensor's verdict: FlashAttention's rule, or error ≤ 1.25× the
        kernel's model with no head biased (docs/check.md#rules). A row that sees no key must
        be exactly 0 under both.
    lse_base : {{"e", "2"}}
        The base of the kernel's LSE (2: FlashInfer's, Triton's tutorial's).
    probe : bool
        On a failure, locate the failing rows and try the other conventions on the failing
        heads (docs/check.md#probe); it names what fits, never changes a verdict.
    rules_table : bool
        Also say what torch's, Triton's, KernelBench's and flashinfer-bench's rules would.
    top : int
        The worst rows and heads the report keeps.
    with_model : bool
        Run the kernel's model beside (its error is what a faithful kernel errs).

    Returns
    -------
    CheckReport
        `.passed`, `.tensors` (a verdict per tensor, with where it fails and the conventions
        found), `.failures`, the worst rows and heads, `.grads`.

    Examples
    --------
    >>> import numpy as np, osm_cli
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float16) for _ in range(3))
    >>> r = osm_cli.attention(q, k, v, dtype="fp16", causal=True)
    >>> osm_cli.check(q, k, v, r.out, lse=r.lse, dtype="fp16", causal=True).passed
    True
    """
    from osm_cli.precision.check import check as judge
    from osm_cli.precision.check import output_dtype

    opts = scores_of(locals())
    return judge(out, q, k, v, dtype if dtype is not None else output_dtype(np.asarray(out), "out"),
                 lse=lse, do=dout, dq=dq, dk=dk, dv=dv, dsink=dsink, top=top,
                 with_model=with_model,
                 grad_rule=grad_rule, opts=opts, kernel=kernel, mma=mma,
                 descale=descale(q_descale, k_descale, v_descale), rule=rule,
                 lse_base=lse_base, probe=probe, rules_table=rules_table)


__all__ = ["check"]
