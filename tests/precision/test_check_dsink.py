"""osm check judges the learnable sink's gradient dsink (issue 22 item 5) as FlashAttention-4's
tests do: against the float64 gradient in float32, |dsink − ref| ≤ 2·max|pt − ref| + 2 ulp; its
verdict in the table, the JSON failures and assert_attention_close, a bundle's `dsink` read."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from osm_cli.cli import app
from osm_cli.errors import OsmError
from osm_cli.precision.check import check
from osm_cli.present.console import as_text
from osm_cli.present.verdicts import check_report
from osm_cli.testing import assert_attention_close
from tests.kernels.planted import planted, sink_backward

BF16 = ml_dtypes.bfloat16
SINK = np.array([0.5, -1.0, 2.0, 0.0], np.float32)


def _case(bug=None, causal=True):
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 96, 4, 32)).astype(BF16) for _ in range(3))
    kern = planted(None)
    out, lse = kern(q, k, v, causal=causal, learnable_sink=SINK)
    dout = rng.standard_normal(out.shape).astype(BF16)
    dq, dk, dv = kern.osm_backward(q, k, v, out, lse, dout, causal=causal)
    dsink = sink_backward(out, lse, dout, SINK, bug=bug)
    return dict(out=out, q=q, k=k, v=v, lse=lse, do=dout, dq=dq, dk=dk, dv=dv, dsink=dsink)


def _check(c, **kw):
    return check(c["out"], c["q"], c["k"], c["v"], "bf16", lse=c["lse"], do=c["do"],
                 dq=c["dq"], dk=c["dk"], dv=c["dv"], dsink=c["dsink"], causal=True,
                 layout="bnhd", sinks=SINK, **kw)


def test_the_correct_kernels_dsink_passes():
    rep = _check(_case())
    assert rep.passed
    assert [t.tensor for t in rep.tensors] == ["out", "lse", "dq", "dk", "dv", "dsink"]
    g = next(x for x in rep.grads if x.name == "dsink")
    assert 0 < g.rule.err <= g.rule.bound and g.total_rows == 4
    assert g.rule.k_pt == 2 and g.rule.k_round == 2 and "ulp" in g.rule.note


@pytest.mark.parametrize("bug", ["dsink_head", "dsink_sign"])
def test_a_planted_dsink_bug_fails_alone_and_is_named(bug):
    c = _case(bug)
    for rule in ("fa", "model"):
        rep = _check(c, rule=rule)
        assert [t.tensor for t in rep.failures] == ["dsink"]
    t = rep.failures[0]
    assert t.judged.err > t.judged.bound
    if bug == "dsink_head":  # only head 0 is wrong: the location says so
        assert t.location.patterns[-1] == "head 0 of 4"
    text = as_text(check_report(rep, "out", 5), width=100)
    assert "dsink" in text and "FAIL" in text
    from osm_cli.present import json as documents

    doc = documents.check_doc(rep, None)
    assert [f["tensor"] for f in doc["failures"]] == ["dsink"]
    assert doc["failures"][0]["max_error"] == pytest.approx(t.judged.err)
    with pytest.raises(AssertionError, match="dsink"):
        assert_attention_close(c["out"], c["q"], c["k"], c["v"], lse=c["lse"], dout=c["do"],
                               dq=c["dq"], dk=c["dk"], dv=c["dv"], dsink=c["dsink"],
                               causal=True, layout="bnhd", learnable_sink=SINK)


def test_dsink_needs_the_sinks_and_their_shape():
    c = _case()
    with pytest.raises(OsmError, match="gradient of the sinks"):
        check(c["out"], c["q"], c["k"], c["v"], "bf16", do=c["do"], dsink=c["dsink"],
              causal=True, layout="bnhd")
    with pytest.raises(OsmError, match="dsink has shape"):
        check(c["out"], c["q"], c["k"], c["v"], "bf16", do=c["do"], dsink=c["dsink"][:3],
              causal=True, layout="bnhd", sinks=SINK)


def test_a_bundles_dsink_is_judged(tmp_path):
    good, bad = _case(), _case("dsink_sign")
    for name, c, code in (("good", good, 0), ("bad", bad, 1)):
        p = tmp_path / f"{name}.npz"
        np.savez(p, **{n: np.asarray(x, np.float32) for n, x in c.items()},
                 learnable_sink=SINK)
        r = CliRunner().invoke(app, ["check", str(p), "--causal", "--layout", "bnhd",
                                     "--dtype", "bf16", "--json"])
        assert r.exit_code == code, r.output
        doc = json.loads(r.stdout)
        assert "ignored" not in r.stderr
        assert [t["tensor"] for t in doc["tensors"]][-1] == "dsink"
        assert [f["tensor"] for f in doc.get("failures", [])] == ([] if code == 0 else
                                                                 ["dsink"])
