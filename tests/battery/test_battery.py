"""osm battery: correct kernels written in the project pass the quick battery; each planted bug
fails, shrinks to a small case and is named (its convention, tensor or feature); the guards
(inputs written, aliasing, wrong shape, exceptions) are failures with their message; case IDs
replay exactly; the command's exit codes, table, JSON and JUnit files.

numpy kernels run everywhere (CI has no torch); the torch-CPU ones skip without torch.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from kernels.planted import (
    BUGS,
    flash_gqa_causal,
    flash_mods,
    flash_plain,
    flash_varlen,
    planted,
)

from conftest import osm
from osm_cli.battery import Case, replay, run
from osm_cli.battery.cases import inputs
from osm_cli.battery.draw import Declared, draw
from osm_cli.battery.shrink import candidates
from osm_cli.errors import InputError
from osm_cli.testing import assert_battery, battery_cases

KERNELS = "tests/kernels/planted.py"


@pytest.mark.parametrize("kernel", [flash_plain, flash_gqa_causal, flash_varlen, flash_mods],
                         ids=lambda k: k.__name__)
def test_correct_kernels_pass_the_quick_battery(kernel):
    rep = run(kernel, arrays="numpy")
    assert rep.passed, [r.message for r in rep.results if not r.passed]
    assert len(rep.results) >= 14
    declared = set(kernel.osm_features.split(","))
    for row in rep.rows:
        states = {rep.cell(row, c)[0] for c in rep.classes}
        if row != "dense" and row not in declared:
            assert states == {"skipped"}
        else:
            assert "FAIL" not in states and "skipped" not in states
    assert rep.cell("dense", "fa-shapes")[0] == "PASS"


# bug -> (features declared, rule, dtype, what the report must name, largest shrunk N_q·N_k)
PLANTED = {
    "lse_base2": ("lse", "fa", "bf16", "base 2", 4),
    "causal_topleft": ("causal,lse", "fa", "bf16", "top-left", 8),
    "scale_1_over_d": ("lse", "fa", "bf16", "1/d", 4),
    "gqa_mod": ("gqa,lse", "fa", "bf16", "h % Hkv", 512),
    "softcap_after_mask": ("causal,softcap,lse", "fa", "bf16", "softcap", 64 * 128),
    "double_count": ("lse", "fa", "bf16", "at queries 64", 65 * 8),  # the second Q tile
    "last_tile_drop": ("lse", "fa", "bf16", "lse", 80),  # N_k 65: the last tile of 1 key
    "bf16_accumulation": ("", "model", "fp16", "out", 130 * 256),
    "head_scale": ("", "model", "fp16", "heads 1 of", 300 * 300),
    "masked_rows": ("causal,lse", "fa", "bf16", "out", 8),
    "dq_head": ("grad,lse", "fa", "bf16", "dq", 4),
    "varlen_shift": ("varlen,lse", "fa", "bf16", "varlen", 8),
    "score_mod_unscaled": ("score_mod,lse", "fa", "bf16", "before softmax_scale", 4),
    "mask_last_tile": ("mask_mod,lse", "fa", "bf16", "ignores mask_mod", 8),
}


def test_every_planted_bug_is_tested():
    assert set(PLANTED) == set(BUGS)


@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bug_fails_shrinks_and_is_named(bug):
    features, rule, dtype, named, largest = PLANTED[bug]
    rep = run(planted(bug, features), arrays="numpy", rule=rule, dtypes=dtype, cases=2,
              max_failures=1)
    assert not rep.passed
    assert len(rep.failures) == 1
    f = rep.failures[0]
    small = f.smallest
    assert not small.passed
    assert small.case.size <= f.first.case.size
    nq_nk = sum(a * b for a, b in small.case.lens) if small.case.lens else \
        small.case.nq * small.case.nk
    assert nq_nk <= largest, small.case.id
    text = " ".join((small.message, small.where, small.convention, *small.failed,
                     *small.case.features))
    assert named in text, text
    # the replay ID reruns exactly that case, which fails the same way
    again = replay(planted(bug, features), small.case.id, arrays="numpy", rule=rule)
    assert again.failed == small.failed and again.err == small.err


def test_case_ids_round_trip_and_refuse_garbage():
    cases = draw(Declared(frozenset({"causal", "gqa", "window", "softcap", "alibi", "sink",
                                     "varlen", "paged", "lse"}), (64, 128), ("bf16", "fp16")),
                 "quick", 5, seed=3)
    assert {c.klass for c in cases} == {"fa-shapes", "edge", "random"}
    for c in cases:
        back = Case.parse(c.id)
        assert back.id == c.id
        assert {k: v for k, v in vars(back).items() if k != "klass"} == \
            {k: v for k, v in vars(c).items() if k != "klass"}
    with pytest.raises(InputError, match="not a battery case ID"):
        Case.parse("b1h2-q3")
    with pytest.raises(InputError, match="multiple of Hkv"):
        Case.parse("b1h3g2-q4k4-d8-bf16-s1")


def test_cases_are_seeded_and_cover_what_the_issue_names():
    decl = Declared(frozenset({"causal", "gqa", "varlen", "paged", "sink", "lse"}), (64,))
    a = [c.id for c in draw(decl, "quick", seed=1)]
    assert a == [c.id for c in draw(decl, "quick", seed=1)]
    assert a != [c.id for c in draw(decl, "quick", seed=2)]
    cases = draw(decl, "quick", seed=1)
    causal = [c for c in cases if c.causal]
    assert any(c.nq > c.nk for c in causal) and any(c.nq < c.nk for c in causal)
    assert {c.edge for c in cases} >= {"nokey", "big", "mod64", "rise", "ties", "n1", "q1"}
    assert any(c.nq % 128 == 64 and c.nk % 128 == 64 for c in cases)
    assert any(c.hkv == 1 and c.h > 1 for c in cases)  # MQA
    varlen = [c for c in cases if c.varlen]
    assert any(0 in (a, b) for c in varlen for a, b in c.lens)  # zero-length sequences
    paged = next(c for c in cases if c.page)
    data = inputs(paged)
    used = data["seqused_k"]
    assert any(n % paged.page for n in used)  # a partial last page
    # every cache row past seqused_k holds the poison value, finite and large
    k = data["k"]
    seen = np.zeros(k.shape[:2], dtype=bool)
    for b, n in enumerate(used):
        for j in range(n):
            seen[data["page_table"][b, j // paged.page], j % paged.page] = True
    assert np.isfinite(k).all() and (np.abs(k[~seen]) > 9000).all()


def test_shrink_candidates_are_smaller_and_valid():
    c = Case(3, 8, 2, 130, 257, 128, causal=True, window=(40, 0), seed=5, lens=None)
    cands = list(candidates(c, (64, 128)))
    assert cands and all(x.size <= c.size and x.h % x.hkv == 0 for x in cands)
    assert cands[0].features != c.features  # features are dropped first
    assert any(x.nq == 65 for x in cands) and any(x.d == 64 for x in cands)


def _guarded_kernel(kind):
    def attn(q, k, v, softmax_scale=None):
        out, lse = flash_plain(q, k, v, softmax_scale=softmax_scale)
        if kind == "writes":
            q[..., 0] = 0
        if kind == "alias":
            return q
        if kind == "shape":
            return out[:, :-1]
        if kind == "dtype":
            return out.astype(np.float32)
        if kind == "raises":
            raise RuntimeError("no kernel image for this head dim")
        return out

    attn.osm_features = ""
    return attn


@pytest.mark.parametrize("kind,message", [
    ("writes", "the kernel wrote its inputs: q changed during the call"),
    ("alias", "the output shares memory with an input"),
    ("shape", "out has shape"),
    ("dtype", "out has dtype float32; the inputs are bfloat16"),
    ("raises", "the kernel raised RuntimeError: no kernel image for this head dim"),
])
def test_guards_fail_the_case_with_their_message_and_the_battery_goes_on(kind, message):
    rep = run(_guarded_kernel(kind), arrays="numpy", cases=0, shrinking=False)
    assert rep.failed == len(rep.results) > 5  # every case ran and failed
    assert all(message in r.message and r.failed == ("kernel",) for r in rep.results)


def test_nan_never_passes_and_repeat_reports_nondeterminism():
    calls = {"n": 0}

    def flaky(q, k, v, softmax_scale=None):
        out, lse = flash_plain(q, k, v, softmax_scale=softmax_scale)
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            out = out.copy()
            out.flat[0] = out.flat[0] * 2 + 1
        return out, lse

    flaky.osm_features = "lse"
    res = replay(flaky, "b1h1g1-q4k4-d8-bf16-s1", arrays="numpy", repeat=3)
    (nd,) = res.nondeterminism
    assert (nd.tensor, nd.runs_differing) == ("out", 1) and nd.max_diff > 0.5

    def nan(q, k, v, softmax_scale=None):
        out = flash_plain(q, k, v)[0]
        out.flat[3] = np.nan
        return out

    bad = replay(nan, "b1h1g1-q4k4-d8-bf16-s1", arrays="numpy")
    assert bad.failed == ("out",) and "NaN" in bad.message and math.isnan(bad.err)


def test_battery_cases_and_assert_battery():
    cases = battery_cases(features="causal,lse", head_dims="64", cases=1)
    assert all(set(c.features) <= {"causal"} and c.d == 64 for c in cases)
    assert_battery(flash_gqa_causal, case=cases[0], arrays="numpy")
    assert_battery(flash_gqa_causal, case=str(cases[-1]), arrays="numpy")
    with pytest.raises(AssertionError, match=r"(?s)fails: lse: max error.*replay|base 2"):
        assert_battery(planted("lse_base2", "lse"), case="b1h1g1-q3k5-d16-bf16-s2",
                       arrays="numpy")


def test_cli_passes_fails_and_writes_junit(tmp_path, strict_json):
    ok = osm("battery", f"{KERNELS}:flash_plain", "--arrays", "numpy",
             "--cases", "0", "--head-dims", "32")
    assert ok.exit_code == 0, ok.output
    lines = ok.stdout.splitlines()
    assert lines[0].startswith(f"osm battery {KERNELS}:flash_plain: ")
    table = "\n".join(lines)
    assert " dense " in table and "skipped" in table and "PASS" in table
    assert "verdict   PASS" in table
    junit = tmp_path / "battery.xml"
    bad = osm("battery", f"{KERNELS}:flash_plain", "--arrays", "numpy",
              "--cases", "0", "--head-dims", "32", "--lse-base", "2",
              "--junit", str(junit), "--max-failures", "1")
    assert bad.exit_code == 1
    assert bad.stderr.splitlines() == [f"wrote {junit} (JUnit XML)",
                                       "FAIL: 1 of 1 cases failed (stopped at --max-failures)"]
    words = " ".join(bad.stdout.split())
    assert "convention the LSE is in base e (natural log, FlashAttention's and PyTorch's " \
           "convention), not base 2: drop --lse-base 2" in words
    assert "replay osm battery tests/kernels/planted.py:flash_plain --lse-base 2 --arrays " \
           "numpy --replay b1h1g1-q1k1-d32-bf16-" in words
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "1"
    assert len(suite.findall("testcase/failure")) == 1
    doc = strict_json(osm("battery", f"{KERNELS}:flash_plain", "--arrays", "numpy", "--cases",
                          "0", "--head-dims", "32", "--lse-base", "2", "--json",
                          "--max-failures", "1").stdout)
    assert doc["passed"] is False and doc["failures"][0]["tensors"] == ["lse"]
    assert doc["table"]["lse"]["fa-shapes"]["state"] == "FAIL"
    replay_line = doc["failures"][0]["replay"]
    again = osm(*replay_line.split()[1:])
    assert again.exit_code == 1 and "max|out − ref|" in again.stdout
    assert again.stderr.startswith("FAIL: lse: max error")


@pytest.mark.parametrize("args,message", [
    (["nowhere.py:attn"], "nowhere.py: no such file"),
    ([f"{KERNELS}:missing"], "has no function 'missing'"),
    ([f"{KERNELS}:flash", "--features", "causal,nope"], "unknown feature 'nope'"),
    ([f"{KERNELS}:flash", "--replay", "garbage"], "not a battery case ID"),
    (["osm:fa2", "--backend", "flash"], "--backend applies to the sdpa and flex targets only"),
])
def test_cli_usage_errors_exit_2(args, message):
    res = osm("battery", *args, "--arrays", "numpy")
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("Error: ") and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_osm_models_pass_as_a_self_test():
    rep = run("osm:fa2", features="causal,gqa,lse", arrays="numpy", cases=1, head_dims="32")
    assert rep.passed, [r.message for r in rep.results if not r.passed]


def test_torch_cpu_kernels():
    pytest.importorskip("torch", reason="torch is not installed: the torch-CPU kernels skip")
    from kernels.planted import planted_torch, torch_correct

    rep = run(torch_correct, cases=2)
    assert rep.passed, [r.message for r in rep.results if not r.passed]
    assert rep.cell("grad", "fa-shapes")[0] == "PASS"
    bad = run(planted_torch("dq_head"), cases=0, max_failures=1)
    (f,) = bad.failures
    assert f.smallest.failed == ("dq",) and f.smallest.case.nq * f.smallest.case.nk <= 4
    sdpa = run("sdpa", backend="math", cases=1, head_dims="64")
    assert sdpa.cell("causal", "fa-shapes")[0] in ("PASS", "FAIL")


def _tutorial_like(q, k, v, softmax_scale=None, causal=False):
    """A kernel with the Triton tutorial's limits: one N for Q and K, N ≥ 64, N % 16 == 0."""
    t, s = q.shape[1], k.shape[1]
    if t != s:
        raise NotImplementedError(f"N_q = {t} != N_k = {s}: one N_CTX for Q and K")
    if t < 64 or t % 16:
        raise RuntimeError("No valid autotuner configs after pruning. `early_config_prune` "
                           "should return at least one config.")
    return flash_plain(q, k, v, softmax_scale=softmax_scale, causal=causal)


_tutorial_like.osm_features = "causal,lse"


def test_refusals_are_told_apart_from_wrong_numbers():
    rep = run(_tutorial_like, arrays="numpy", head_dims="32")
    assert rep.refused > 10 and rep.failed == 0 and not rep.passed
    assert all(r.passed or r.refused for r in rep.results)
    assert rep.cell("dense", "fa-shapes")[0] == "REFUSED"
    refused = [f for f in rep.failures if f.smallest.refused]
    assert {f.smallest.failed for f in refused} == {("refused",)}
    assert all(f.smallest is f.first for f in refused)  # a refusal is not shrunk
    res = osm("battery", "tests/battery/test_battery.py:_tutorial_like", "--arrays",
              "numpy", "--head-dims", "32", "--cases", "2")
    assert res.exit_code == 1
    assert "REFUSED 1: the kernel does not take" in res.stdout
    words = " ".join(res.stdout.split())
    assert "kernel said the kernel raised NotImplementedError: N_q = 1 != N_k = 339" in words
    assert "an unsupported shape, not a wrong number: declare the kernel's limits" in words
    assert "cases 15: 0 passed, 0 failed, 15 refused by the kernel" in words
    assert " REFUSED 3/3 " in res.stdout
    assert res.stderr.startswith("FAIL: 0 of ") and "refused by the kernel" in res.stderr


def test_declared_limits_draw_only_what_the_kernel_takes():
    opts = {"arrays": "numpy", "head_dims": "32", "seqlens": "equal", "min_seqlen": 64,
            "seqlen_multiple": 16}
    rep = run(_tutorial_like, **opts)
    assert rep.passed, [r.message for r in rep.results if not r.passed]
    assert all(r.case.nq == r.case.nk and r.case.nq >= 64 and r.case.nq % 16 == 0
               for r in rep.results)
    assert rep.left_out >= 3  # N_k = 1, one query, rows that see no key
    assert rep.cell("causal", "fa-shapes")[0] == "PASS"
    # the same limits from the function's osm_constraints, as a dict or as text
    for limits in ({"seqlens": "equal", "min_seqlen": 64, "seqlen_multiple": 16},
                   "seqlens=equal, min_seqlen=64, seqlen_multiple=16"):
        def attn(q, k, v, **kw):
            return _tutorial_like(q, k, v, **kw)

        attn.osm_features, attn.osm_constraints = "causal,lse", limits
        assert [r.case.id for r in run(attn, arrays="numpy", head_dims="32").results] == \
            [r.case.id for r in rep.results]
    res = osm("battery", "tests/battery/test_battery.py:_tutorial_like", "--arrays",
              "numpy", "--head-dims", "32", "--cases", "2", "--seqlens",
              "equal", "--min-seqlen", "64", "--seqlen-multiple", "16")
    assert res.exit_code == 0, res.output
    assert "left out by the declared limits" in res.stdout
    with pytest.raises(InputError, match="unknown constraint 'max_seqlen'"):
        attn.osm_constraints = {"max_seqlen": 4}
        run(attn, arrays="numpy")
    with pytest.raises(InputError, match="seqlens must be one of any, equal"):
        run(flash_plain, arrays="numpy", seqlens="same")


def test_shrinking_keeps_within_the_limits():
    def wrong(q, k, v, softmax_scale=None, causal=False):
        out, lse = _tutorial_like(q, k, v, softmax_scale=softmax_scale, causal=causal)
        return out, lse * np.float32(1 / math.log(2))  # a base-2 LSE

    wrong.osm_features = "causal,lse"
    rep = run(wrong, arrays="numpy", head_dims="32", seqlens="equal", min_seqlen=64,
              seqlen_multiple=16, cases=0, max_failures=1)
    (f,) = rep.failures
    s = f.smallest.case
    assert (s.nq, s.nk) == (64, 64) and not f.smallest.refused
    assert "base 2" in f.smallest.convention


def _two_bugs(q, k, v, softmax_scale=None, causal=False):
    """The two bugs the battery found in the Triton tutorial on the H200: batch b > 0 gets
    batch 0's rows (its TMA row offset off_z + off_h·N_CTX), and its backward masks causally
    whatever `causal` says."""
    out, lse = flash_plain(q, k, v, softmax_scale=softmax_scale, causal=causal)
    out = out.copy()
    out[1:] = out[:1]
    return out, lse


_two_bugs.osm_features = "causal,lse,grad"
_two_bugs.osm_backward = lambda q, k, v, out, lse, dout, **kw: flash_plain.osm_backward(
    q, k, v, out, lse, dout, **{**kw, "causal": True})


def test_a_forward_bug_is_not_shrunk_into_a_gradient_bug():
    # a B = 2 case fails out and the gradients; B = 1 without causal fails the gradients alone,
    # which is the other bug: shrinking the first must keep out failing
    rep = run(_two_bugs, arrays="numpy", head_dims="32", seqlens="equal", min_seqlen=16,
              cases=3)
    smallest = [f.smallest for f in rep.failures]
    fwd = [s for s in smallest if "out" in s.failed]
    assert fwd and all(s.case.b >= 2 for s in fwd), [s.case.id for s in smallest]
    bwd = [s for s in smallest if "out" not in s.failed]
    assert bwd and all(s.case.b == 1 and not s.case.causal for s in bwd)
    assert (fwd[0].case.b, fwd[0].case.h, fwd[0].case.nq) == (2, 1, 16), fwd[0].case.id


@pytest.mark.parametrize("spec", ["b1h2g2-q300k300-d32-bf16-mm.doc.1.120.7.172+causal-s3",
                                  "b1h2g1-q200k333-d32-bf16-sm.softcap.20-s4",
                                  "b2h2g2-q190k300-d32-bf16-sm.relbias-mm.prefix.37-s5"])
def test_mod_cases_replay_and_pass_a_correct_kernel(spec):
    case = Case.parse(spec)
    assert case.id == spec and ("score_mod" in case.features or "mask_mod" in case.features)
    res = replay(flash_mods, spec, arrays="numpy")
    assert res.passed, res.message
    with pytest.raises(InputError, match="not a battery mask_mod"):
        Case.parse("b1h1g1-q3k3-d8-bf16-mm.causal+nope-s1")


def test_mod_cases_are_drawn_at_lengths_not_multiples_of_128():
    decl = Declared(frozenset({"score_mod", "mask_mod", "gqa"}), (64,))
    mods = [c for c in draw(decl, "quick") if c.score_mod or c.mask_mod]
    specs = {c.score_mod for c in mods} | {p for c in mods for p in c.mask_mod.split("+")}
    assert {"softcap.20", "alibi", "relbias", "causal", "sliding.64", "prefix.37",
            "chunked.48"} <= specs
    docs = [c for c in mods if "doc" in c.mask_mod]
    assert any(".1." in c.mask_mod for c in docs)  # a document of length 1
    assert any(c.score_mod and c.mask_mod.startswith("doc") for c in docs)  # softcap + doc
    assert all(c.nk % 128 for c in mods if c.klass == "edge")
    none = draw(Declared(frozenset({"causal"}), (64,)), "quick")
    assert not any(c.score_mod or c.mask_mod for c in none)


def test_torch_kernels_with_mods_and_flex_on_the_cpu():
    pytest.importorskip("torch", reason="torch is not installed: the torch-CPU kernels skip")
    from kernels.planted import torch_mods

    rep = run(torch_mods, cases=1, head_dims="32")
    assert rep.passed, [r.message for r in rep.results if not r.passed]
    assert rep.cell("mask_mod", "edge") == ("PASS", 0, 8)
    assert rep.cell("grad", "edge")[0] == "PASS"
    flex = run("flex", features="score_mod,mask_mod,lse", cases=0, head_dims="32")
    assert flex.passed, [r.message for r in flex.results if not r.passed]
    assert flex.cell("score_mod", "edge")[0] == "PASS"

    def flex_block(q, k, v, softmax_scale=None, score_mod=None, block_mask=None):
        """A user's flex kernel that takes FlexAttention's BlockMask."""
        from torch.nn.attention.flex_attention import flex_attention

        out, lse = flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  score_mod=score_mod, block_mask=block_mask,
                                  scale=softmax_scale, return_lse=True)
        return out.transpose(1, 2), lse

    flex_block.osm_features = "score_mod,block_mask,lse"
    res = replay(flex_block, "b1h2g2-q300k300-d32-bf16-mm.doc.1.120.7.172+causal-s3")
    assert res.passed, res.message
