"""`assert_attention_close`: osm check as one line in a kernel's own pytest suite.

In the habit of torch.testing.assert_close: silent when the kernel's output (and LSE, and
gradients dq, dk, dv for an upstream gradient do) meet FlashAttention's test rules against the
float64 reference of the dtype-rounded inputs (docs/numerics.md#precision-model, #grad-rule;
precision/check.py judges), an AssertionError carrying osm check's report as text (each verdict
with its bound, the worst rows and heads) when they do not. Arrays may be numpy arrays or torch
tensors on any device; torch is never imported here unless an argument already is a torch
tensor (then its dtype is kept: bfloat16 becomes ml_dtypes.bfloat16, float8 ml_dtypes' float8).

Leaves out: the rules and the judging (precision/), files (io/), the command line (cli/).

Example: assert_attention_close(out, q, k, v, lse=lse, causal=True) passes silently.
"""

from __future__ import annotations

from osm_cli.battery.arrays import as_numpy  # torch tensors as numpy, dtype kept
from osm_cli.precision.names import KERNELS  # the kernel presets (precision/presets.py)


def assert_attention_close(
    out, q, k, v, *, lse=None, dout=None, dq=None, dk=None, dv=None, dsink=None,
    softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple | None = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
    learnable_sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, page_table=None,
    layout: str = "bhnd", kv_layout: str = "nhd", causal_align: str = "bottom-right",
    attn_mask=None, score_mod=None, mask_mod=None,
    dtype=None, kernel: str | None = None, mma: str | None = None, q_descale=None,
    k_descale=None, v_descale=None, grad_rule: str = "fa3", rule: str = "fa",
    lse_base: str = "e", probe: bool = True, rules_table: bool = False, top: int = 5,
    with_model: bool = True, msg: str | None = None, do=None, scale: float | None = None,
    window=None, mask=None,
) -> None:
    """Raise AssertionError, with osm check's report, unless `out` (and `lse`) are what a
    faithful FlashAttention kernel computes for q, k, v.

    Parameters
    ----------
    out, q, k, v : array or torch tensor
        The kernel's output and inputs (torch tensors on any device are copied to numpy).
    lse, dout, dq, dk, dv, dsink, softmax_scale, causal, window_size, softcap, alibi_slopes,
    learnable_sink, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, layout, kv_layout,
    causal_align, attn_mask, dtype, kernel, mma, q_descale, k_descale, v_descale, grad_rule,
    rule, lse_base, probe, rules_table, top, with_model
        As `osm_cli.check` takes them (FlashAttention's names); dtype defaults to out's own;
        an unknown kernel is a ValueError naming the known ones.
    msg : str, optional
        A line put before the report.
    do, scale, window, mask
        osm 0.2's names of dout, softmax_scale, window_size, attn_mask; they still work.

    Raises
    ------
    AssertionError
        Opening with one line per failing tensor (its rule and bound, where its rows fail,
        the convention the probe found), then osm check's report.
    OsmError
        For inputs osm cannot judge (shapes that do not fit, values that overflow the dtype,
        gradients without dout).

    Examples
    --------
    >>> import numpy as np
    >>> from osm_cli import attention
    >>> from osm_cli.testing import assert_attention_close
    >>> q = k = v = np.random.default_rng(0).standard_normal((1, 2, 8, 16)).astype(np.float16)
    >>> r = attention(q, k, v, dtype="fp16", causal=True)
    >>> assert_attention_close(r.out, q, k, v, lse=r.lse, dtype="fp16", causal=True)  # passes
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's
    from osm_cli.api.check import check
    from osm_cli.present.console import as_text
    from osm_cli.present.diagnosis import failures_text
    from osm_cli.present.verdicts import check_report

    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    arrays = {n: as_numpy(x, n) for n, x in (
        ("out", out), ("q", q), ("k", k), ("v", v), ("lse", lse), ("dout", dout if do is None
                                                                   else do),
        ("dq", dq), ("dk", dk), ("dv", dv), ("dsink", dsink),
        ("attn_mask", attn_mask if mask is None else mask),
        ("alibi_slopes", alibi_slopes), ("learnable_sink", learnable_sink),
        ("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))}
    rep = check(
        arrays.pop("q"), arrays.pop("k"), arrays.pop("v"), arrays.pop("out"), **arrays,
        softmax_scale=softmax_scale if scale is None else scale, causal=causal,
        window_size=window_size if window is None else window, softcap=softcap,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        page_table=page_table, layout=layout, kv_layout=kv_layout, causal_align=causal_align,
        score_mod=score_mod, mask_mod=mask_mod, dtype=dtype, kernel=kernel, mma=mma,
        grad_rule=grad_rule, rule=rule, lse_base=lse_base, probe=probe,
        rules_table=rules_table, top=top, with_model=with_model)
    if rep.passed:
        return
    head = f"{msg}\n" if msg else ""
    raise AssertionError(f"{head}{failures_text(rep)}\n\n"
                         f"{as_text(check_report(rep, 'out', top))}")


def battery_cases(*, features=None, head_dims=None, dtypes="bf16", budget: str = "quick",
                  cases: int | None = None, seed: int = 0) -> list:
    """The battery's cases (osm_cli.battery.Case) for a kernel declaring `features`, to
    parametrize a suite with: each case's str is its replay ID.

    Example:
        @pytest.mark.parametrize("case", battery_cases(features="causal,lse"), ids=str)
        def test_attn(case):
            assert_battery(attn, case=case, features="causal,lse")
    """
    from osm_cli.battery.draw import Declared, draw, head_dims_of
    from osm_cli.battery.runner import parse_list

    feats = parse_list(features) if features is not None else frozenset()
    dims = head_dims_of(head_dims) if head_dims is None or isinstance(head_dims, str) \
        else tuple(head_dims)
    declared = Declared(feats, dims, tuple(parse_list(dtypes, ordered=True)))
    return [c for c in draw(declared, budget, cases, seed) if declared.allows(c)]


def assert_battery(fn, *, case=None, msg: str | None = None, **options) -> None:
    """Raise AssertionError, with osm battery's report, unless `fn` passes the battery (or,
    given `case`, a Case or its replay ID, that one case). options: osm_cli.battery.run's
    (features, head_dims, dtypes, lse_base, layout, arrays, device, budget, cases, seed, rule,
    repeat)."""
    __tracebackhide__ = True
    from osm_cli.battery.runner import replay, run
    from osm_cli.present.battery import battery_report, replay_report
    from osm_cli.present.console import as_text

    head = f"{msg}\n" if msg else ""
    if case is not None:
        res = replay(fn, str(case), **options)
        if not res.passed:
            raise AssertionError(f"{head}battery case {res.case.id} fails: {res.message}\n\n"
                                 f"{as_text(replay_report(res, _name(fn)))}")
        return
    rep = run(fn, **options)
    if not rep.passed:
        raise AssertionError(f"{head}{rep.failed} of {len(rep.results)} battery cases fail\n\n"
                             f"{as_text(battery_report(rep, 'osm battery ' + _name(fn)))}")


def _name(fn) -> str:
    return fn if isinstance(fn, str) else getattr(fn, "__name__", repr(fn))


__all__ = ["KERNELS", "as_numpy", "assert_attention_close", "assert_battery", "battery_cases"]
