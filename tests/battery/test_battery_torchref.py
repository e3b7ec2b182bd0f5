"""osm battery's torch path for its reference and baseline (battery/torchref.py), run on the CPU
with torch so that CI covers what runs on a GPU: the float64 reference and gradients equal the
numpy reference's to float64 rounding, the plain same-dtype baseline errs as osm's plain does,
and a battery judged on it gives the numpy path's verdicts, bounds within a few per cent.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch path skips")

from kernels.planted import planted_torch, torch_mods  # noqa: E402

from osm_cli.battery import Case, run  # noqa: E402
from osm_cli.battery.cases import inputs  # noqa: E402
from osm_cli.battery.judge import check_options  # noqa: E402
from osm_cli.battery.torchref import baseline  # noqa: E402
from osm_cli.errors import InputError  # noqa: E402
from osm_cli.flash.reference import reference, reference_backward  # noqa: E402
from osm_cli.precision.backward import plain_backward  # noqa: E402
from osm_cli.precision.dtypes import DTYPES  # noqa: E402
from osm_cli.precision.model import plain  # noqa: E402

CASES = [
    "b2h4g2-q113k211-d64-fp16-causal-alibi-s1440696408",
    "b2h3g3-q128k64-d32-bf16-causal-sink-enokey-s907713895",
    "b2h4g4-q128k217-d32-bf16-causal-cap5-s2008052739",
    "b3h6g2-q128k217-d32-bf16-v_128.217_113.0_0.145-s72124473",
    "b3h3g3-q113k211-d64-fp16-p32_113.211_113.0_113.189-s1818006483",
    "b2h6g2-q108k256-d32-bf16-w104.42-s1960127676",
    "b2h8g2-q257k257-d64-fp16-sm.alibi-mm.causal-s552547096",
    "b2h2g2-q250k250-d64-fp16-sm.softcap.20-mm.doc.50.1.199-s815020182",
    "b2h4g4-q190k300-d32-bf16-sm.relbias-s1321529464",
]


def _max(x) -> float:
    return float(np.max(np.abs(x), initial=0.0))


@pytest.mark.parametrize("spec", CASES)
def test_torch_reference_and_baseline_match_the_numpy_path(spec):
    case = Case.parse(spec)
    data = inputs(case)
    dt = DTYPES["bfloat16" if case.dtype == "bf16" else "float16"]
    opts = check_options(case, data)
    q, k, v = (data[n].astype(dt) for n in "qkv")
    ref, lse = reference(q, k, v, **opts)
    pt, _ = plain(q, k, v, dt, **opts)
    grads = not case.page
    got = baseline(case, data, "cpu", grads=grads)
    assert got["ref"].shape == ref.shape and got["ref_lse"].shape == lse.shape
    assert _max(got["ref"] - ref) < 1e-14
    both = np.isneginf(lse) & np.isneginf(got["ref_lse"])
    assert np.array_equal(np.isneginf(lse), np.isneginf(got["ref_lse"]))
    assert _max(np.where(both, 0.0, got["ref_lse"]) - np.where(both, 0.0, lse)) < 1e-13
    # plain attention in the dtype: the same error against the reference, up to a few roundings
    assert _max(got["pt"] - ref) == pytest.approx(_max(pt - ref), rel=0.05)
    if grads:
        do = data["dout"].astype(dt)
        exact = reference_backward(q, k, v, do, **opts)
        rough = plain_backward(q, k, v, do, dt, **opts)
        for name, g, g_pt in zip(("dq", "dk", "dv"), exact, rough, strict=True):
            assert _max(got["grads"][name] - g) < 1e-13 * max(1.0, _max(g))
            assert _max(got["grad_pts"][name] - g) == pytest.approx(_max(g_pt - g), rel=0.1)


def test_a_battery_on_the_torch_path_gives_the_numpy_paths_verdicts():
    by = {ref: run(torch_mods, cases=2, head_dims="32", reference=ref)
          for ref in ("numpy", "torch")}
    assert by["torch"].passed and by["numpy"].passed
    assert {r.reference for r in by["torch"].results} == {"torch"}
    assert {r.reference for r in by["numpy"].results} == {"numpy"}
    for a, b in zip(by["numpy"].results, by["torch"].results, strict=True):
        assert a.case == b.case
        va, vb = a.report.verdict.rule, b.report.verdict.rule
        assert va.err == vb.err and vb.bound == pytest.approx(va.bound, rel=0.05)
    bad = run(planted_torch("dq_head"), cases=0, max_failures=1, reference="torch")
    (f,) = bad.failures
    assert f.smallest.failed == ("dq",) and f.smallest.reference == "torch"


def test_reference_is_checked():
    with pytest.raises(InputError, match="reference must be one of auto, numpy, torch"):
        run(torch_mods, reference="gpu")
