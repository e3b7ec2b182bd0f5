"""osm tour: every screen in the teaching notes' order, each one osm command's own output; all
of it when piped, one screen per Enter in a terminal (tmux)."""

from __future__ import annotations

import shlex

from conftest import osm
from osm_cli.cli.tour import SCREENS


def test_piped_prints_every_screen_with_its_commands_output():
    r = osm("tour")
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    text = r.stdout
    at = 0
    for n, (heading, _, line) in enumerate(SCREENS, start=1):
        at = text.index(f"{heading}  ({n} of {len(SCREENS)})", at)  # in order
        at = text.index(f"$ osm {line}\n", at)
        alone = osm(*shlex.split(line)).stdout
        assert text[at + len(line) + 7:].startswith(alone), line
    # the seed's path: overflow, the two worked examples, the guard, O, a mask, bf16, backward
    assert [line.split()[0] for _, _, line in SCREENS] == [
        "overflow-demo", "trace", "trace", "trace", "attention", "attention", "trace", "backward"]
    assert "l = 1.3678794·0.049787068 + exp(5−5) + exp(3−5) = 1.203438" in text
    assert "α = 0: the guard." in text


def test_start_at_a_screen():
    r = osm("tour", "--screen", "8")
    assert r.exit_code == 0
    assert r.stdout.lstrip("─ ").startswith("8. One backward step  (8 of 8)")
    assert "1. Why softmax" not in r.stdout


def test_tour_in_tmux(tmux):
    tmux.start("tour", height=60)
    screen = tmux.wait_for("Enter: next screen")
    assert "(1 of 8)" in screen and "(2 of 8)" not in screen
    tmux("send-keys", "-t", "osm", "Enter")
    tmux.wait_for("(2 of 8)")
    screen = tmux.wait_for("Enter: next screen")
    assert "(1 of 8)" not in screen  # one screen at a time
    tmux("send-keys", "-t", "osm", "q")
    screen = tmux.wait_for("EXIT=0")
    assert "(3 of 8)" not in screen
