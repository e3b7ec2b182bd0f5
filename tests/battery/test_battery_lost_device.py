"""A kernel whose error loses the GPU (CUDA's sticky errors: an illegal memory access, say, as
FlashAttention-4 gave on an H200 at head dims past 128): the battery reports that case as
the kernel's failure and stops there, with what it did not run, instead of crashing on the
next call (every later CUDA call in the process raises the same error)."""

import pytest
from kernels.planted import flash_plain

from osm_cli.battery import run
from osm_cli.cli import app

KERNEL = "tests/battery/test_battery_lost_device.py:lost_at_third"
CALLS = {"n": 0}
ILLEGAL = "CUDA error: an illegal memory access was encountered"


def lost_at_third(q, k, v, **kw):
    """Right on its first two calls; the third raises CUDA's sticky error, and so does every
    call after it, as on a GPU whose context is gone."""
    CALLS["n"] += 1
    if CALLS["n"] >= 3:
        raise RuntimeError(f"{ILLEGAL}\nCUDA kernel errors might be asynchronously reported")
    return flash_plain(q, k, v, **kw)


lost_at_third.osm_features = "lse"


@pytest.fixture(autouse=True)
def _fresh():
    CALLS["n"] = 0


def test_a_lost_gpu_stops_the_battery_with_that_case_failed():
    rep = run(lost_at_third, arrays="numpy", head_dims="32", cases=2)
    assert len(rep.results) == 3 and CALLS["n"] == 3  # nothing called after it, no shrinking
    last = rep.results[-1]
    assert last.failed == ("kernel",) and not last.refused and last.lost
    assert last.message == f"the kernel raised RuntimeError: {ILLEGAL} CUDA kernel errors " \
        "might be asynchronously reported"
    assert rep.stopped == f"case {last.case.id} left the GPU unusable ({last.message})"
    whole = len(run(flash_plain, arrays="numpy", head_dims="32", cases=2).results)
    assert rep.not_run == whole - 3 > 0 and rep.failed == 1 and rep.results[0].passed
    (f,) = rep.failures
    assert f.smallest is f.first is last


def test_a_plain_kernel_error_does_not_stop_it():
    def raises(q, k, v, **kw):
        raise RuntimeError("CUDA error: out of memory")  # not sticky: the battery goes on

    raises.osm_features = "lse"
    rep = run(raises, arrays="numpy", head_dims="32", cases=0, shrinking=False)
    assert not rep.stopped and rep.not_run == 0 and rep.failed == len(rep.results) > 5


def test_cli_says_it_stopped(runner, strict_json):
    res = runner.invoke(app, ["battery", KERNEL, "--arrays", "numpy", "--head-dims", "32",
                              "--cases", "2"])
    assert res.exit_code == 1
    words = " ".join(res.stdout.split())
    said = f"left the GPU unusable (the kernel raised RuntimeError: {ILLEGAL} CUDA kernel " \
        "errors might be asynchronously reported); "
    assert "stopped case b" in words and said in words
    assert "cases not run, failures not shrunk" in words
    (line,) = res.stderr.splitlines()
    assert line.startswith("FAIL: 1 of 3 cases failed (stopped: the GPU was lost; ")
    CALLS["n"] = 0
    doc = strict_json(runner.invoke(app, ["battery", KERNEL, "--arrays", "numpy",
                                          "--head-dims", "32", "--cases", "2", "--json"]).stdout)
    assert doc["cases"] == 3 and doc["not_run"] > 0 and ILLEGAL in doc["stopped"]
