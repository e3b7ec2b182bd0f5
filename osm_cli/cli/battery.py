"""osm battery: drive an attention kernel through the cases where real kernels break, shrink
what fails, name why. The command parses options, calls osm_cli.battery (run or replay) and
prints present/battery.py's report. Exit 0 every case passes, 1 any fails (or bad input), 2 bad
options or TARGET. Leaves out: everything it calls.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from osm_cli.errors import InputError

from .common import check_outputs, emit_json, err, fail, guarded, out, save
from .flags import as_flags
from .groups import group, grouped
from .options import JsonOpt


def _choices(name: str, values) -> type[Enum]:
    return Enum(name, [(v.replace(".", "_").replace("-", "_"), v) for v in values], type=str)


Budget = _choices("Budget", ("quick", "full"))
Rule = _choices("Rule", ("fa", "model"))
Base = Enum("Base", [("e", "e"), ("n2", "2")], type=str)
BLayout = _choices("BLayout", ("bnhd", "bhnd"))
Arrays = _choices("Arrays", ("torch", "numpy"))
Device = _choices("Device", ("cpu", "cuda"))
Backend = _choices("Backend", ("flash", "efficient", "cudnn", "math", "eager", "compiled"))
FEATURES_HELP = ("The features the kernel takes, comma-separated: causal, gqa, window, softcap, "
                 "alibi, sink, varlen, paged, score_mod, mask_mod (FlexAttention's functions), "
                 "block_mask (the mask as FlexAttention's BlockMask), lse, grad (default: the "
                 "function's osm_features).")
Seqlens = _choices("Seqlens", ("any", "equal"))


@group
class Declared:
    """What the kernel takes and how it is called (a replay needs the same)."""

    features: Annotated[str | None, typer.Option("--features", help=FEATURES_HELP)] = None
    head_dims: Annotated[str | None, typer.Option(
        "--head-dims", help="Head dims the kernel takes, comma-separated, or 'fa' for "
        "FlashAttention's test list [default: 32,64,96,128].")] = None
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Dtypes the kernel takes: bf16, fp16 or bf16,fp16.")] = "bf16"
    seqlens: Annotated[Seqlens | None, typer.Option(
        "--seqlens", help="equal: the kernel takes one N for Q and K (N_q = N_k) [default: "
        "the function's osm_constraints, else any].", show_default=False)] = None
    min_seqlen: Annotated[int | None, typer.Option(
        "--min-seqlen", min=1, metavar="N", help="The least N_q and N_k the kernel takes.",
        show_default=False)] = None
    seqlen_multiple: Annotated[int | None, typer.Option(
        "--seqlen-multiple", min=1, metavar="M", help="N_q and N_k must be multiples of M.",
        show_default=False)] = None
    lse_base: Annotated[Base, typer.Option(
        "--lse-base", help="The base of the kernel's LSE: e (FlashAttention, PyTorch) or 2 "
        "(FlashInfer, Triton's tutorial).")] = Base.e
    layout: Annotated[BLayout, typer.Option(
        "--layout", help="q, k, v as (B, N, H, d) (bnhd, FlashAttention's) or (B, H, N, d).")
    ] = BLayout.bnhd
    arrays: Annotated[Arrays | None, typer.Option(
        "--arrays", help="Hand the kernel torch tensors or numpy arrays [default: torch when "
        "installed].", show_default=False)] = None
    device: Annotated[Device, typer.Option("--device", help="Where q, k, v live.")] = Device.cpu
    backend: Annotated[Backend | None, typer.Option(
        "--backend", help="sdpa: the backend to force (CUDA); flex: eager (the default) or "
        "compiled (torch.compile).", show_default=False)] = None

    def keywords(self) -> dict:
        """The runner's keywords (battery.runner's run, replay and target_of)."""
        def value(x):
            return getattr(x, "value", x)

        return {"features": self.features, "head_dims": self.head_dims, "dtypes": self.dtype,
                "lse_base": value(self.lse_base), "layout": value(self.layout),
                "arrays": value(self.arrays), "device": value(self.device),
                "backend": value(self.backend), "seqlens": value(self.seqlens),
                "min_seqlen": self.min_seqlen, "seqlen_multiple": self.seqlen_multiple}

    def command(self, target: str, rule: str) -> str:
        """`osm battery TARGET` with the options a replay needs to call the kernel alike."""
        kw = self.keywords()
        parts = ["osm battery", target]
        for flag, name, default in (("--features", "features", None),
                                    ("--lse-base", "lse_base", "e"),
                                    ("--layout", "layout", "bnhd"), ("--arrays", "arrays", None),
                                    ("--device", "device", "cpu"),
                                    ("--backend", "backend", None)):
            if kw[name] is not None and kw[name] != default:
                parts += [flag, kw[name]]
        if rule != "fa":
            parts += ["--rule", rule]
        return " ".join(parts) + "".join(
            f" {f} {kw[n]}" for f, n in (("--seqlens", "seqlens"), ("--min-seqlen", "min_seqlen"),
                                         ("--seqlen-multiple", "seqlen_multiple"))
            if kw[n] is not None)


@guarded
@grouped
def battery(
    target: Annotated[str, typer.Argument(
        help="path/to/file.py:function, package.module:function, or a built-in: sdpa, flex, "
        "flash_attn, flash_attn.cute, osm:fa2, osm:fa4.", metavar="TARGET", show_default=False)],
    *,
    declared: Declared,
    budget: Annotated[Budget, typer.Option(
        "--budget", help="quick (about 45 cases) or full (all of FlashAttention's pairs).")
    ] = Budget.quick,
    cases: Annotated[int | None, typer.Option(
        "--cases", min=0, help="Random cases drawn from the declared space [default: 12 quick, "
        "60 full].", show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the case list.")] = 0,
    rule: Annotated[Rule, typer.Option(
        "--rule", help="fa: FlashAttention's test rule; model: within 1.25× osm's model of "
        "the kernel.")] = Rule.fa,
    repeat: Annotated[int, typer.Option(
        "--repeat", min=1, help="Run each case R times and report bitwise nondeterminism.")] = 1,
    replay: Annotated[str | None, typer.Option(
        "--replay", metavar="ID", help="Rerun exactly the case ID (from a FAIL's replay line) "
        "with osm check's full report.")] = None,
    max_failures: Annotated[int | None, typer.Option(
        "--max-failures", min=1, metavar="N", help="Stop after N failing cases.",
        show_default=False)] = None,
    no_shrink: Annotated[bool, typer.Option(
        "--no-shrink", help="List failures without shrinking them.")] = False,
    as_json: JsonOpt = False,
    junit: Annotated[Path | None, typer.Option(
        "--junit", metavar="FILE", help="Write JUnit XML for CI here.")] = None,
):
    """Drive an attention kernel through the cases where real kernels break.

    The kernel is called as fn(q, k, v, **kw) -> out or (out, lse), with FlashAttention's
    keyword names for the features it declares; each case is judged by osm check's rule
    against osm's float64 reference; each kind of failure is shrunk to its smallest case, with
    a line that replays it. Exit 0: every case passed; 1: a case failed.

    \b
    Examples:
      osm battery mykernel.py:attn --features causal,gqa,lse --dtype bf16
      osm battery osm:fa2 --arrays numpy --budget quick
      osm battery sdpa --device cuda --backend flash --features causal,gqa,grad
      osm battery mykernel.py:attn --replay b1h2g1-q65k128-d64-bf16-causal-s7
    """
    from osm_cli.battery.runner import replay as replay_case
    from osm_cli.battery.runner import run
    from osm_cli.present import battery as view

    opts = declared.keywords()
    check_outputs(junit=junit)
    callable_as_declared(target, opts, replay)
    again = declared.command(target, rule.value)
    if replay is not None:
        res = replay_case(target, replay, rule=rule.value, repeat=repeat, **opts)
        if as_json:
            emit_json(view.result_doc(res))
        else:
            out.print(view.replay_report(res, target))
        if not res.passed:
            err.print(f"FAIL: {res.message}", markup=False, soft_wrap=True)
            raise typer.Exit(1)
        return
    rep = run(target, budget=budget.value, cases=cases, seed=seed, rule=rule.value,
              repeat=repeat, shrinking=not no_shrink, max_failures=max_failures, **opts)
    if junit is not None:
        save((junit, view.junit_xml(rep), "JUnit XML"))
    if as_json:
        emit_json(view.battery_doc(rep, again))
    else:
        out.print(view.battery_report(rep, again))
    if not rep.passed:
        err.print(f"FAIL: {as_flags(view.fail_line(rep, max_failures))}", markup=False,
                  soft_wrap=True)
        raise typer.Exit(1)


def callable_as_declared(target: str, opts: dict, replay: str | None) -> None:
    """TARGET can be called with the declared options, and --replay's ID is a case's: else
    one "Error: …" line and exit 2 (they are the command's arguments, not inputs)."""
    from osm_cli.battery.runner import target_of

    try:
        target_of(target, **opts)
        if replay is not None:
            from osm_cli.battery.cases import Case

            Case.parse(replay)
    except InputError as exc:
        fail(as_flags(str(exc)), 2)
