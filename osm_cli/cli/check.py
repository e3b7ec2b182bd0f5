"""osm check: a kernel's output (and LSE, and gradients) judged the way FlashAttention's own
tests judge it. The command imports the layers it uses when it runs (see common.py: `osm
--help` loads no numpy). Leaves out: judging (precision/check.py) and the report
(present/verdicts.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from .common import emit_json, err, guarded, note, out
from .groups import Descales, Inputs, Model, Mods, Scores, group, grouped, score_options
from .options import CheckRule, GradRule, InputDtypeOpt, JsonOpt, LseBase


def JudgedOpt(flag: str, what: str):  # noqa: N802 (a type, as the other options)
    return Annotated[str | None, typer.Option(flag, help=f"The kernel's {what} (.npy), to judge.")]


@group
class Judged:
    """The kernel's tensors beside OUT: its LSE, and its gradients for a dO."""

    lse: Annotated[str | None, typer.Option(
        "--lse", help="The kernel's LSE (natural log) as a tensor file, to judge too (a BUNDLE "
        "holds its own).")] = None
    do: Annotated[str | None, typer.Option(
        "--do", "--dout", help="The upstream gradient dO (.npy) the kernel's gradients were "
        "computed for.")] = None
    dq: JudgedOpt("--dq", "dQ") = None
    dk: JudgedOpt("--dk", "dK") = None
    dv: JudgedOpt("--dv", "dV") = None

    def grads(self) -> dict:
        return {"do": self.do, "dq": self.dq, "dk": self.dk, "dv": self.dv}


@group
class Verdict:
    """How the verdicts are reached and what the report holds."""

    grad_rule: Annotated[GradRule, typer.Option(
        "--grad-rule", help="The gradients' rule: fa3 (FA3/FA4's tests: 2·plain error + "
        "2·rounding) or fa2 (FA2's tests: 3·plain error).")] = GradRule.fa3
    rule: Annotated[CheckRule, typer.Option(
        "--rule", help="The rule that decides each tensor's verdict: fa (FlashAttention's "
        "tests, the default) or model (error ≤ 1.25× osm's model of --kernel, and no head "
        "biased). A row that sees no key must be exactly 0 under both.")] = CheckRule.fa
    lse_base: Annotated[LseBase, typer.Option(
        "--lse-base", help="Base of the kernel's LSE: e (FlashAttention, PyTorch) or 2 "
        "(FlashInfer, Triton's tutorial).")] = LseBase.e
    strict: Annotated[bool, typer.Option(
        "--strict", help="Refuse a BUNDLE holding arrays osm check does not use (without it "
        "they are listed on one 'ignored:' line).")] = False
    rules_table: Annotated[bool, typer.Option(
        "--rules-table", help="Also say what torch.testing.assert_close's defaults, atol 1e-2 "
        "(Triton's tutorial), KernelBench's allclose and flashinfer-bench's matched ratio "
        "would on the same tensors.")] = False
    no_probe: Annotated[bool, typer.Option(
        "--no-probe", help="On a failure, skip trying the other conventions and locating the "
        "failing tiles.")] = False
    top: Annotated[int, typer.Option("--top", min=1, help="Worst rows and heads to list.")] = 5
    no_model: Annotated[bool, typer.Option(
        "--no-model", help="Skip running osm's flash model on the same inputs.")] = False

    def keywords(self) -> dict:
        """precision.check.check's keywords."""
        return {"grad_rule": self.grad_rule.value, "rule": self.rule.value,
                "lse_base": self.lse_base.value, "rules_table": self.rules_table,
                "probe": not self.no_probe, "top": self.top, "with_model": not self.no_model}


@guarded
@grouped
def check(
    files: Annotated[list[str], typer.Argument(
        help="BUNDLE: one .npz or .safetensors holding out, q, k, v (and any of lse, do, dq, dk, "
        "dv); or OUT Q K V (OUT shaped like Q with V's head dim); or OUT and one file holding "
        "q, k, v. Tensor files are .npy, .npz or .safetensors.",
        metavar="BUNDLE | OUT Q K V | OUT QKV", show_default=False)],
    *,
    judged: Judged,
    scores: Scores,
    verdict: Verdict,
    kernel: Model,
    descales: Descales,
    input_dtype: InputDtypeOpt = None,
    as_json: JsonOpt = False,
    block_mask: Annotated[str | None, typer.Option(
        "--block-mask", metavar="FILE.npz", help="The kernel's block-sparse metadata "
        "(FlexAttention's kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, or "
        "FA4's mask_block_cnt, …; block_size (2,), default 128,128), judged against "
        "--mask-mod: a tile claimed full that is partial, or left out with a visible key, "
        "is named and fails the check.")] = None,
    inputs: Inputs,
    mods: Mods,
    seq: Annotated[int | None, typer.Option("--seq", min=0, hidden=True)] = None,  # taken as
    # before the option groups (check traces no row); hidden, as it does nothing here
):
    """Judge a kernel's output (and LSE) the way FlashAttention's own tests do.

    ref = the float64 reference of the dtype-rounded inputs, cast to the dtype; pt = plain
    attention in the dtype. Pass when max|out − ref| ≤ 2·max|pt − ref| + 2·max|(ref + 0.3 − 0.3)
    − ref|. Exit 0: pass. Exit 1: fail ("FAIL: …" on stderr) or bad input ("Error: …").
    --dtype defaults to OUT's own dtype. With --do and any of --dq, --dk, --dv, each gradient
    is judged too, against the float64 gradients, by FlashAttention's backward rule. A BUNDLE
    may name its tensors as FlashAttention and PyTorch do (softmax_lse, dout, o, query, …).
    On a failure osm says where the failing rows are (heads, sequences, tiles) and which other
    convention the kernel fits (LSE base 2, causal alignment, scale, GQA map, layout, …).
    A kernel's own files: osm check out.npy q.npy k.npy v.npy
    --lse lse.npy --causal, or a bundle: osm check flashinfer_out.npz --lse-base 2.

    \b
    Examples:
      osm check samples/kernel_fp16.npz --causal
      osm check samples/kernel_bf16.safetensors --causal
      osm check samples/kernel_fp16.npz --causal --top 3 --json
    """
    from osm_cli import io
    from osm_cli.precision.check import check as judge
    from osm_cli.precision.presets import judged_as
    from osm_cli.present import json as documents
    from osm_cli.present.verdicts import check_report, fail_line

    from .flags import flag

    ignored(files, verdict.strict)
    t = io.load_kernel_tensors(files, judged.lse, input_dtype, judged.grads())
    o, name = t.pop("out"), t.pop("name")
    dt, said = judged_as(kernel.dtype, kernel.name, o, name, t["q"], t["k"], t["v"])
    opts = score_options(scores, t["q"], inputs, mods)
    if len(files) == 1:  # a bundle's own varlen, paged, sink and ALiBi arrays, unless given
        opts = io.with_bundle_inputs(opts, files[0])
    note(said)
    scales = descales.read()
    blocks_ok = block_mask is None or judge_block_mask(block_mask, opts, t["q"], t["k"])
    rep = judge(o, t.pop("q"), t.pop("k"), t.pop("v"), dt, opts=opts, kernel=kernel.name,
                mma=kernel.mma_value, descale=scales, **verdict.keywords(), **t)
    if as_json:
        emit_json(documents.check_doc(rep, flag))
    else:
        out.print(check_report(rep, name, verdict.top, flag))
    if not rep.passed:
        err.print(f"FAIL: {fail_line(rep, flag)}", markup=False, soft_wrap=True)
    if not rep.passed or not blocks_ok:
        raise typer.Exit(1)


def ignored(files: list[str], strict: bool) -> None:
    """The arrays check does not use: a BUNDLE's, or what the QKV of OUT QKV holds beside q, k,
    v (an LSE there is not judged); refused under --strict, else listed on stderr."""
    from osm_cli import io
    from osm_cli.reports.rules import bundle_unused

    if len(files) == 1:
        path, unused = files[0], io.unused_names(files[0])
        why = f"osm check does not use {'it' if len(unused) == 1 else 'them'}"
    elif len(files) == 2:  # OUT QKV: only q, k, v are read from QKV
        path, unused = files[1], io.unused_names(files[1], ("q", "k", "v"), inputs=False)
        why = "OUT QKV reads only q, k, v from it"
    else:
        return
    bundle_unused(path, unused, strict)
    if unused:
        err.print(f"ignored: {', '.join(unused)} ({path}: {why})", markup=False,
                  soft_wrap=True)


def judge_block_mask(path: str, opts, q, k) -> bool:
    """check --block-mask: the kernel's block mask judged against the mask_mod, its verdict
    and wrong tiles printed; False when it fails."""
    from osm_cli import io
    from osm_cli.flash.blockmask import judge_against
    from osm_cli.present.verdicts import block_mask_lines

    rep = judge_against(opts, q, k, lambda: io.load_named(path))
    for line in block_mask_lines(rep, opts.mask_mod.name):
        out.print(line, markup=False, soft_wrap=True)
    if not rep.passed:
        err.print(f"FAIL: block mask: {rep.wrong[0]}", markup=False, soft_wrap=True)
    return rep.passed


