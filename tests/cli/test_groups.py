"""Option groups declared once (cli/groups.py, issue 20 item 6): each group's options are the
same options on every command that takes the group, a command gets them back as one record,
and the rules and readings the commands used to hold speak the library's parameter names."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
import pytest
import typer
import typer.main

from conftest import osm
from osm_cli import io
from osm_cli.cli import app
from osm_cli.cli.flags import as_flags
from osm_cli.cli.groups import Inputs, Mods, Scores, group, grouped
from osm_cli.errors import OsmError
from osm_cli.reports import rules


def _params(command: str) -> dict:
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def _declared(p) -> tuple:
    return (tuple(p.opts), p.help, p.default, p.metavar)


@pytest.mark.parametrize("cls", [Scores, Inputs, Mods])
def test_a_group_is_the_same_options_on_every_command_that_takes_it(cls):
    names = [f.name for f in dataclasses.fields(cls)]
    commands = [c for c in ("attention", "backward", "check", "sweep", "trace")
                if all(n in _params(c) for n in names)]
    assert len(commands) >= (4 if cls is Scores else 3), commands
    first = {n: _declared(_params(commands[0])[n]) for n in names}
    for c in commands[1:]:
        assert {n: _declared(_params(c)[n]) for n in names} == first, c
    if cls is Scores:  # the six score options, FlashAttention's names beside osm's
        assert first["scale"][0] == ("--scale", "--softmax-scale")
        assert first["window"][0] == ("--window", "--window-size")
        assert first["mask"][0] == ("--mask", "--attn-mask")


@group
class Pair:
    left: Annotated[int, typer.Option("--left")] = 1
    right: Annotated[int, typer.Option("--right")] = 2


def test_grouped_gives_the_command_one_record():
    seen = []
    toy = typer.Typer()

    @toy.command()
    @grouped
    def run(name: str, *, pair: Pair, loud: Annotated[bool, typer.Option("--loud")] = False):
        seen.append((name, pair, loud))

    from typer.testing import CliRunner

    r = CliRunner().invoke(toy, ["x", "--right", "5", "--loud"])
    assert r.exit_code == 0, r.output
    assert seen == [("x", Pair(left=1, right=5), True)]


def test_the_rules_speak_parameters_and_the_cli_prints_flags():
    with pytest.raises(OsmError) as exc:
        rules.attention_views(packed=True, plot=True)
    assert str(exc.value).startswith("`plot`, `step` and `html` draw one dense head")
    assert as_flags(str(exc.value)).startswith("--plot, --step and --html draw one dense head")
    with pytest.raises(OsmError, match=r"^give `o` and `lse` together"):
        rules.saved_forward("o.npy", None)
    with pytest.raises(OsmError, match=r"`window_size`, `attn_mask`, `softmax_scale`"):
        rules.sweep_options([], False, None, None, scored=True, modelled=False)
    r = osm("sweep", "samples/scores.txt", "--window", "1,1")
    assert (r.exit_code, r.stderr) == (1, "Error: --causal, --causal-align, --window, --mask, "
                                          "--scale and --layout are for Q/K/V; scores carry "
                                          "their mask as -inf\n")


def test_io_reads_option_values_as_given(tmp_path):
    # -1,-1 stays a window (the CLI's as ever), unlike the API's window_size=(-1, -1)
    assert io.score_options(None, window_size="-1,-1").window == (-1, -1)
    with pytest.raises(OsmError, match=r"^`window_size` must be two integers"):
        io.score_options(None, window_size="1")
    np.save(tmp_path / "cu.npy", np.array([0.0, 2.0]))
    with pytest.raises(OsmError, match=r"cu.npy: `cu_seqlens_q` must hold integers"):
        io.kernel_inputs(None, cu_seqlens_q=str(tmp_path / "cu.npy"))
    q = np.zeros((1, 3, 4, 2))  # (B, H, N, d): auto slopes for 3 heads
    assert io.kernel_inputs(q, alibi_slopes="auto")["alibi_slopes"].shape == (3,)
    assert io.kernel_inputs(q, "bnhd", alibi_slopes="auto")["alibi_slopes"].shape == (4,)
    s = np.zeros((2, 3))
    assert np.isneginf(io.scores_with_mods(s, mask_mod=("causal",))[0, 1:]).all()
    assert io.scores_with_mods(s) is s
