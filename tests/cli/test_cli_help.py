"""The command line's help in panels, its version, and FlashAttention's flag names beside
osm's (issue 20, item 6)."""

from __future__ import annotations

import re

import pytest

import osm_cli
from conftest import osm
from osm_cli.cli.panels import PANELS, panel_of

COMMANDS = ("trace", "attention", "backward", "overflow-demo", "merge", "sweep", "cost",
            "check", "battery")


def sections(text: str) -> list[str]:
    """The help's section headings ("Masking:", …), in order."""
    return re.findall(r"^([A-Z][\w &]*):$", text, flags=re.M)


def test_attention_help_groups_its_options_in_panels_at_80_columns():
    r = osm("attention", "--help", width=80)
    assert r.exit_code == 0
    assert sections(r.stdout) == ["Arguments", "Scores", "Masking", "Tiling", "Trace",
                                  "Precision & kernel", "Kernel inputs", "Output", "Options"]
    assert max(map(len, r.stdout.splitlines())) <= 80
    masking = r.stdout.split("\nMasking:\n")[1].split("\n\n")[0]
    assert "--causal " in masking and "--mma" not in masking and "--page-table" not in masking
    kernel_inputs = r.stdout.split("\nKernel inputs:\n")[1].split("\n\n")[0]
    assert "--page-table" in kernel_inputs and "--softcap" in kernel_inputs


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_lists_its_options_in_known_panels(command):
    r = osm(command, "--help", width=80)
    assert r.exit_code == 0, r.output
    heads = sections(r.stdout)
    assert heads[-1] == "Options"  # -h, --help alone
    assert set(heads) <= {"Usage", "Arguments", "Examples", "Options", *PANELS}, heads
    options = r.stdout.split("\nOptions:\n")[1]
    assert options.strip().splitlines()[0].lstrip().startswith("-h, --help")
    assert len(options.strip().splitlines()) == 1


def test_one_name_two_meanings_is_placed_per_command():
    assert panel_of("attention", "lse_path") == "Output"  # attention --lse writes it
    assert panel_of("backward", "lse_path") == "Kernel tensors"  # backward --lse reads it
    assert panel_of("cost", "batch") == "Cost model" and panel_of("attention", "batch") == "Trace"
    assert panel_of("check", "rule") == "Verdict" and panel_of("battery", "rule") == "Battery"


def test_check_lists_rule_with_its_verdict_options():
    """check's --rule decides its verdicts: it is listed under Verdict beside --rules-table,
    not under Battery (a panel check has no other option in); battery's stays in Battery."""
    r = osm("check", "--help", width=80, code=0)
    assert "Battery" not in sections(r.stdout)
    verdict = r.stdout.split("\nVerdict:\n")[1].split("\n\n")[0]
    assert verdict.lstrip().startswith("--rule <fa|model>") and "--rules-table" in verdict
    battery = osm("battery", "--help", width=80, code=0).stdout
    assert "--rule <fa|model>" in battery.split("\nBattery:\n")[1].split("\n\n")[0]


def test_version():
    r = osm("--version")
    assert (r.exit_code, r.stdout) == (0, f"osm {osm_cli.__version__}\n")
    assert osm_cli.__version__ == "0.3.0"


@pytest.mark.parametrize(("old", "new", "value"), [
    ("--scale", "--softmax-scale", "0.25"),
    ("--window", "--window-size", "2,0"),
    ("--sinks", "--learnable-sink", "samples/sinks.npy"),
    ("--alibi", "--alibi-slopes", "samples/slopes.npy"),
    ("--mask", "--attn-mask", "samples/mask.npy"),
])
def test_flash_attention_flag_names_are_the_same_option(old, new, value, tmp_path):
    if value.endswith(".npy"):
        import numpy as np

        made = {"sinks": np.array([0.5, -1.0]), "slopes": np.array([0.5, 0.25]),
                "mask": np.tril(np.ones((8, 8), bool))[:, ::-1]}[value[8:-4]]
        value = str(tmp_path / "tensor.npy")
        np.save(value, made)
    base = ("attention", "samples/qkv.npz", "--causal", "--json", "--no-reference", "--query", "5")
    a, b = osm(*base, old, value), osm(*base, new, value)
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout
    assert a.stdout != osm(*base).stdout  # the option did something


def test_check_takes_dout_beside_do(tmp_path):
    import numpy as np

    from osm_cli.flash.reference import reference_backward

    q, k, v = (np.load("samples/qkv.npz")[n].astype(np.float16) for n in "qkv")
    out = osm_cli.attention(q, k, v, dtype="fp16").out.astype(np.float16)
    do = np.ones_like(out)
    np.save(tmp_path / "do.npy", do)
    np.save(tmp_path / "dv.npy", reference_backward(q, k, v, do)[2].astype(np.float16))
    np.savez(tmp_path / "b.npz", q=q, k=k, v=v, out=out)
    base = ("check", tmp_path / "b.npz", "--dv", tmp_path / "dv.npy", "--json", "--no-model")
    a, b = osm(*base, "--do", tmp_path / "do.npy"), osm(*base, "--dout", tmp_path / "do.npy")
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout and '"tensor": "dv"' in a.stdout


def test_osm_help_gives_every_summary_whole():
    """`osm --help` at 80 columns lists each command with its help's first sentence, wrapped in
    the column, never cut with "..." (click's default cut "Judge a kernel's output (and LSE)
    the way..." there)."""
    width = 80
    r = osm("--help", width=width)
    assert r.exit_code == 0
    listed = r.stdout.split("\nCommands:\n")[1]
    assert "..." not in listed
    assert max(map(len, listed.splitlines())) <= width
    flat = " ".join(listed.split())
    assert "check Judge a kernel's output (and LSE) the way FlashAttention's own tests do." in flat
    assert ("attention Tiled FlashAttention forward on real Q/K/V tensors, traced tile by "
            "tile.") in flat
    assert all(f" {c} " in f" {flat} " for c in (*COMMANDS, "tour"))


@pytest.mark.parametrize("command", (*COMMANDS, "tour"))
def test_every_commands_unknown_option_is_no_such_option(command):
    r = osm(command, "--bogus-option", "x.svg")
    assert r.exit_code == 2
    assert r.stderr.rstrip().splitlines()[-1] == "Error: No such option: --bogus-option"


@pytest.mark.parametrize("args", [["-inf", "-1", "2"], ["--dtype", "fp16", "-5", "3"],
                                  ["-1e3", "--dtype=fp32", "7"], ["--", "-2", "1"]])
def test_overflow_demo_takes_negative_numbers_and_refuses_unknown_options(args):
    r = osm("overflow-demo", *args)
    assert r.exit_code == 0, r.output
    values = [a for a in args if a not in ("--", "--dtype", "fp16", "--dtype=fp32")]
    assert f"(x = {', '.join(values)})" in r.stdout.replace("-1000", "-1e3")
    r = osm("overflow-demo", "--svg", "x.svg", "-1")
    assert r.exit_code == 2 and "Error: No such option: --svg" in r.stderr
