"""Inputs a learner has: --random B,H,N,d (and --seed) on attention and backward, and a seeded
dO when backward is given none, said so on the screen."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import osm
from osm_cli.studies.inputs import random_qkv, seeded_do


def test_random_is_seeded_and_shaped():
    a, b = random_qkv((1, 2, 8, 4), 3), random_qkv((1, 2, 8, 4), 3)
    assert all(x.shape == (1, 2, 8, 4) for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], random_qkv((1, 2, 8, 4), 4)[0])
    do = seeded_do(a[0], a[2], 3)
    assert do.shape == (1, 2, 8, 4) and not np.array_equal(do, a[0])


@pytest.mark.parametrize("spec", ["1,2", "1,2,0,4", "a,b,c,d", "1,2,8,4,5"])
def test_bad_shape_is_one_error(spec):
    r = osm("attention", "--random", spec)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith(f"Error: --random '{spec}': give the shape as B,H,N,d")


def test_attention_random_equals_the_same_tensors_from_files(tmp_path):
    q, k, v = random_qkv((1, 2, 8, 4), 5)
    for name, x in zip("qkv", (q, k, v), strict=True):
        np.save(tmp_path / f"{name}.npy", x)
    made = osm("attention", "--random", "1,2,8,4", "--seed", "5", "--json")
    given = osm("attention", *(str(tmp_path / f"{n}.npy") for n in "qkv"),
                "--json")
    assert made.exit_code == given.exit_code == 0
    assert made.stdout == given.stdout


def test_files_and_random_together_are_refused():
    r = osm("attention", "samples/qkv.npz", "--random", "1,1,4,2")
    assert r.exit_code == 1
    assert r.stderr == "Error: give Q K V files or --random B,H,N,d, not both\n"


@pytest.mark.parametrize("command", ["attention", "backward"])
def test_no_inputs_at_all_is_a_usage_error(command):
    r = osm(command)
    assert r.exit_code == 2
    assert "Invalid value for FILES: give Q K V" in r.stderr and "--random B,H,N,d" in r.stderr


def test_backward_without_do_uses_a_seeded_one_and_says_so(tmp_path):
    r = osm("backward", "samples/q.npy", "samples/k.npy", "samples/v.npy")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("dO: none given, so a seeded standard-normal one (seed 0; --seed "
                               "picks another, or give DO as a file)\n")
    q = np.load("samples/q.npy")
    np.save(tmp_path / "do.npy", seeded_do(q, np.load("samples/v.npy"), 0))
    same = osm("backward", "samples/q.npy", "samples/k.npy", "samples/v.npy",
               str(tmp_path / "do.npy"))
    assert same.exit_code == 0
    assert r.stdout.split("\n", 1)[1] == same.stdout  # the rest is the run with that dO


def test_backward_random():
    r = osm("backward", "--random", "1,2,8,4", "--seed", "3", "--block-k", "2")
    assert r.exit_code == 0, r.output
    first = r.stdout.splitlines()[:2]
    assert first[0] == "Q, K, V: standard normal, shape (1, 2, 8, 4), seed 3 (--random)"
    assert first[1].startswith("dO: none given, so a seeded standard-normal one (seed 3;")
