"""osm check names the bug (issue 22): on the planted-bug kernels of tests/kernels/planted.py
each check FAILs under the rule its bug calls for and the report names the convention the
kernel fits (the probe) or where it fails (the localisation); the correct kernels never FAIL.

Kernels take FlashAttention's (B, N, H, d) and return its (B, H, N) LSE; the inputs are bf16
(fp16 where said), small enough to run in a second each.
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from conftest import qkv, rand
from osm_cli.cli.flags import flag
from osm_cli.precision.check import check
from osm_cli.present.console import as_text
from osm_cli.present.diagnosis import advice, failures_text
from tests.kernels.planted import flash, planted

BF16 = ml_dtypes.bfloat16
# FlashAttention's (B, N, H, d) in bfloat16, Q, K, V drawn one after the other from one generator
BNHD = {"layout": "bnhd", "dtype": BF16, "stream": True}


def _judge(kernel, q, k, v, *, rule="fa", **kw):
    """Run `kernel` on q, k, v with FlashAttention's keywords and judge it (layout bnhd)."""
    fa = {n: kw[n] for n in ("causal", "softcap", "cu_seqlens_q", "cu_seqlens_k") if n in kw}
    out, lse = kernel(q, k, v, **fa)
    osm = {("window" if n == "window_size" else n): x for n, x in kw.items()}
    if osm.get("softcap") == 0.0:
        osm.pop("softcap")
    return check(out, q, k, v, "bf16" if q.dtype == BF16 else q.dtype, lse=lse, rule=rule,
                 layout="bnhd", **osm)


def _tensor(rep, name):
    return next(t for t in rep.tensors if t.tensor == name)


def _messages(rep, name):
    return [advice(f, flag) for f in _tensor(rep, name).findings]


@pytest.mark.parametrize("case", [
    {}, {"causal": True}, {"hk": 2, "causal": True}, {"t": 192, "s": 320, "causal": True},
    {"softcap": 20.0, "causal": True}])
def test_correct_kernels_pass_both_rules(case):
    """The blockwise online-softmax kernel (GQA, causal with t ≠ s, softcap) passes fa and
    model: no false positive, no flagged head."""
    shape = {n: case[n] for n in ("t", "s", "hk") if n in case}
    q, k, v = qkv(shape.get("t", 256), shape.get("s", 256), 64, heads=(4, shape.get("hk", 4)),
                  b=1, **BNHD)
    kw = {n: x for n, x in case.items() if n not in shape}
    for rule in ("fa", "model"):
        rep = _judge(flash, q, k, v, rule=rule, **kw)
        assert rep.passed, (rule, failures_text(rep))
        assert [t.tensor for t in rep.tensors] == ["out", "lse"]
        assert not any(b.flagged for b in rep.bias)


@pytest.mark.parametrize("seed", [104, 5, 17])
def test_correct_fp16_kernel_with_wide_scores_passes_the_model_rule(seed):
    """Scores twice as wide in fp16 (LSE up to ~20): a correct kernel's LSE is a float32 ulp
    or two from osm's model's, so 1.25× the model's error alone failed it; the model rule's LSE
    bound is at least 4 float32 ulps of the largest |LSE| (strict.lse_floor)."""
    from osm_cli.precision.strict import LSE_ULPS, lse_floor

    rng = np.random.default_rng(seed)
    q = (2 * rng.standard_normal((1, 512, 8, 64))).astype(np.float16)
    k = (2 * rng.standard_normal((1, 512, 4, 64))).astype(np.float16)
    v = rng.standard_normal((1, 512, 4, 64)).astype(np.float16)
    rep = _judge(flash, q, k, v, rule="model", causal=True)
    assert rep.passed, failures_text(rep)
    lse = _tensor(rep, "lse")
    assert lse.judged.bound >= LSE_ULPS * np.spacing(np.float32(10.0))
    assert lse.judged.err <= lse.judged.bound
    assert lse_floor(np.array([2.5, -np.inf, np.nan])) == 4 * 2.0 ** -22


def test_lse_bugs_still_fail_the_model_rule_past_its_floor():
    """The floor is float32's few ulps: an LSE in base 2, or l summed from P rounded to bf16
    (issue 22: 640× a correct kernel's LSE error), stays far above it."""
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    rep = _judge(planted("lse_base2"), q, k, v, rule="model", causal=True)
    lse = _tensor(rep, "lse")
    assert not lse.passed and lse.judged.err > 1e4 * lse.judged.bound
    out, _ = flash(q, k, v, causal=True)
    qh, kh = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k))
    sc = qh @ kh.transpose(0, 1, 3, 2) / 8.0
    sc = np.where(np.tril(np.ones((256, 256), bool)), sc, -np.inf)
    m = sc.max(-1)
    p16 = np.exp(sc - m[..., None]).astype(np.float32).astype(BF16).astype(np.float64)
    bad = (m + np.log(p16.sum(-1))).astype(np.float32)  # l from P rounded to bf16
    rep = check(out, q, k, v, "bf16", lse=bad, rule="model", layout="bnhd", causal=True)
    lse = _tensor(rep, "lse")
    assert not lse.passed and lse.judged.err > 10 * lse.judged.bound


def test_correct_varlen_kernel_passes():
    cu = np.array([0, 70, 70, 200, 256], np.int32)
    q, k, v = qkv(256, 256, 32, heads=(4, 4), seed=3, **BNHD)  # packed (total, H, d)
    out, lse = flash(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    rep = check(out, q, k, v, "bf16", lse=lse, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert rep.passed and not rep.failures


def test_lse_base2_named():
    """FlashInfer's and Triton's base-2 LSE: the LSE fails, the output passes, and the probe
    says base 2 with the flag that states it; with --lse-base 2 it passes."""
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    rep = _judge(planted("lse_base2"), q, k, v, causal=True)
    assert not rep.passed and [t.tensor for t in rep.failures] == ["lse"]
    msgs = _messages(rep, "lse")
    assert any("LSE matches osm's in base 2" in m and "pass --lse-base 2 if that is its "
               "convention" in m for m in msgs), msgs
    assert "ranked by LSE" in "" or rep.rows[0].lse_err > _tensor(rep, "lse").judged.bound
    out, lse = planted("lse_base2")(q, k, v, causal=True)
    assert check(out, q, k, v, "bf16", lse=lse, causal=True, layout="bnhd",
                 lse_base="2").passed


def test_causal_topleft_named():
    q, k, v = qkv(128, 320, 64, heads=(4, 4), b=1, **BNHD)
    rep = _judge(planted("causal_topleft"), q, k, v, causal=True)
    assert not _tensor(rep, "out").passed
    assert any("aligned top-left" in m and "--causal-align top-left" in m
               for m in _messages(rep, "out")), _messages(rep, "out")


def test_scale_1_over_d_named():
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    rep = _judge(planted("scale_1_over_d"), q, k, v, causal=True)
    assert any("scale 1/d = 0.015625" in m and "--scale 0.015625" in m
               for m in _messages(rep, "out")), _messages(rep, "out")


def test_gqa_mod_named():
    q, k, v = qkv(256, 256, 64, heads=(8, 2), b=1, **BNHD)
    rep = _judge(planted("gqa_mod"), q, k, v, causal=True)
    out = _tensor(rep, "out")
    assert not out.passed
    assert any("head map h % 2" in m and "h // 4" in m for m in _messages(rep, "out"))
    # heads 0, 2, 5, 7 read the right kv head by chance (h % 2 = h // 4)
    assert out.location.patterns[-1] == "heads 1, 3–4, 6 of 8"


def test_softcap_after_mask_named():
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    rep = _judge(planted("softcap_after_mask"), q, k, v, causal=True, softcap=5.0)
    assert any("softcap applied after the mask" in m for m in _messages(rep, "out"))


def test_layout_transposed_named():
    """A kernel given (B, H, N, d) arrays that reads them as FlashAttention's (B, N, H, d)."""
    q, k, v = qkv(96, 96, 32, heads=(4, 4), b=1, seed=5, dtype=BF16, stream=True)
    out, _ = flash(q, k, v)  # reads axis 1 as the sequence
    rep = check(out, q, k, v, "bf16")  # judged as the bhnd arrays they are
    assert any("read as (B, N, H, d)" in m and "--layout bnhd" in m
               for m in _messages(rep, "out")), _messages(rep, "out")


def test_double_count_located():
    """The first K/V tile counted twice on every other Q tile of 64 rows: located as such,
    and the tile map blames K/V tile 0 on Q tiles 1, 3, 5, …"""
    q, k, v = qkv(512, 512, 64, heads=(2, 2), b=1, **BNHD)
    rep = _judge(planted("double_count"), q, k, v)
    out = _tensor(rep, "out")
    assert not out.passed
    assert out.location.block == 64 and out.location.tiles == (1, 3, 5, 7)
    assert out.location.patterns[0].startswith("every other Q tile of 64 rows (tiles 1, 3, 5")
    m = rep.tile_map
    assert m.block_k == 64 and m.explained == ((1, 0), (3, 0), (5, 0), (7, 0))
    assert m.marks[1] == "#......." and m.marks[0] == "........"
    assert m.patterns == ("the first K/V tile of 64 rows explains the error",)


def test_last_tile_drop_located():
    q, k, v = qkv(256, 320, 64, heads=(2, 2), b=1, **BNHD)
    rep = _judge(planted("last_tile_drop"), q, k, v)
    assert not rep.passed
    assert rep.tile_map.patterns == ("the last K/V tile of 64 rows (tile 4) explains the error",)
    assert {j for _, j in rep.tile_map.explained} == {4}


def test_bf16_accumulation_fails_model_rule_only():
    """O accumulated in bf16 passes FlashAttention's rule and fails the model rule."""
    q, k, v = qkv(512, 512, 64, heads=(2, 2), b=1, **BNHD)
    assert _judge(planted("bf16_accumulation"), q, k, v, causal=True).passed
    rep = _judge(planted("bf16_accumulation"), q, k, v, causal=True, rule="model")
    out = _tensor(rep, "out")
    assert not out.passed and out.judged.err > 1.25 * rep.model_err
    assert out.rule == "model" and "1.25× osm's fa2 model" in out.judged.note


def test_model_rule_failure_counts_and_ranks_its_own_rows():
    """Under --rule model the FAIL line counts the rows over the model rule's bound (the
    JSON's and assert_attention_close's count), not FlashAttention's 0, and an LSE failing
    only the model rule ranks the worst rows by |LSE − ref|, as their title says."""
    from osm_cli.present.verdicts import check_report, fail_line

    q, k, v = qkv(512, 512, 64, heads=(2, 2), b=1, **BNHD)
    rep = _judge(planted("bf16_accumulation"), q, k, v, causal=True, rule="model")
    loc = _tensor(rep, "out").location
    assert rep.rows_over == 0 < loc.rows_over
    assert f"; {loc.rows_over} of 1024 rows over the bound; where: " in fail_line(rep)
    assert f"0 of 1024 (model rule: {loc.rows_over} of 1024)" in " ".join(
        as_text(check_report(rep, "out", 3)).split())
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    out, lse = flash(q, k, v, causal=True)
    lse = lse.copy()
    lse[0, 2, 77] += np.float32(1e-4)  # far inside FlashAttention's LSE bound, not the model's
    rep = check(out, q, k, v, "bf16", lse=lse, causal=True, layout="bnhd", rule="model", top=2)
    assert [t.tensor for t in rep.failures] == ["lse"] and _tensor(rep, "out").passed
    assert (rep.rows[0].head, rep.rows[0].query) == (2, 77)
    assert rep.rows[0].lse_err >= rep.rows[1].lse_err
    assert "worst 2 rows by |LSE − ref|" in as_text(check_report(rep, "out", 2))


def test_head_scale_flagged_and_fails_model_rule():
    """Head 1 × 1.001: the bias statistic flags exactly that head under both rules; the
    model rule fails it and says so."""
    q, k, v = qkv(512, 512, 64, heads=(4, 4), b=1, **BNHD)
    fa = _judge(planted("head_scale"), q, k, v, causal=True)
    assert fa.passed
    flagged = [(b.batch, b.head) for b in fa.bias if b.flagged]
    assert flagged == [(0, 1)]
    assert 0.0008 < fa.bias[0].bias < 0.0012
    rep = _judge(planted("head_scale"), q, k, v, causal=True, rule="model")
    out = _tensor(rep, "out")
    assert not out.passed
    assert out.reasons and out.reasons[0].startswith("head 1 of batch 0 biased +0.00099")
    assert out.location.patterns[-1] == "head 1 of 4"


def test_masked_rows_fail_every_rule():
    """Rows that see no key must be exactly 0: the mean of V fails under fa and model, located
    as those rows."""
    # bottom-right causal: the first 128 rows see no key
    q, k, v = qkv(256, 128, 64, heads=(4, 4), b=1, **BNHD)
    for rule in ("fa", "model"):
        rep = _judge(planted("masked_rows"), q, k, v, causal=True, rule=rule)
        out = _tensor(rep, "out")
        assert not out.passed
        assert out.reasons[0] == "512 of 512 rows that see no key are not exactly 0"
        assert out.location.patterns[0] == "rows that see no key (512 of 512 such rows)"
    assert rep.no_key_rows == 512


def test_dq_head_located():
    """dQ of head 0 × 1.1: dQ alone fails; head 0 named, and the factor found."""
    q, k, v = qkv(128, 128, 32, heads=(4, 4), b=1, **BNHD)
    kern = planted("dq_head")
    out, lse = kern(q, k, v, causal=True)
    dout = rand(*out.shape, seed=9, dtype=BF16)
    dq, dk, dv = kern.osm_backward(q, k, v, out, lse, dout, causal=True)
    rep = check(out, q, k, v, "bf16", lse=lse, do=dout, dq=dq, dk=dk, dv=dv, causal=True,
                layout="bnhd")
    assert [t.tensor for t in rep.failures] == ["dq"]
    dqv = _tensor(rep, "dq")
    assert dqv.location.patterns[-1] == "head 0 of 4"
    assert any("dQ in head 0 of batch 0 is 1.1" in advice(f) for f in dqv.findings)
    # the forward's own PASS says whose it is, not a bare "verdict PASS" above dQ's FAIL
    from osm_cli.present.verdicts import check_report

    text = " ".join(as_text(check_report(rep, "out", 3)).split())
    assert "verdict, out and LSE PASS" in text and "verdict, all FAIL" in text
    assert " verdict PASS" not in text


def test_varlen_shift_located_by_sequence():
    cu = np.array([0, 100, 180, 256], np.int32)
    q, k, v = qkv(256, 256, 32, heads=(2, 2), seed=4, **BNHD)  # packed (total, H, d)
    out, lse = planted("varlen_shift")(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    rep = check(out, q, k, v, "bf16", lse=lse, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    out_v = _tensor(rep, "out")
    assert not out_v.passed
    assert out_v.location.sequences[0] == 0 and rep.varlen
    assert out_v.location.patterns[0].startswith("sequences 0–2 of 3")
    assert rep.rows[0].batch in (0, 1, 2) and rep.rows[0].query < 100


def test_probe_never_passes_a_failure():
    """A convention found leaves the verdict FAIL: only the user's option changes it."""
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    rep = _judge(planted("scale_1_over_d"), q, k, v, causal=True)
    assert rep.probe.found and not rep.passed


def test_fail_text_names_rule_where_and_probe():
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    text = failures_text(_judge(planted("lse_base2"), q, k, v, causal=True))
    assert text.startswith("LSE fails FlashAttention's rule: max|lse − ref| = 2.81 > ")
    assert ("; 1024 of 1024 rows over the bound; where: every query row; every head (4); probe: "
            "the kernel's LSE matches osm's in base 2" in text)


def test_rules_table_numbers():
    """What the other projects' rules say of the same bf16 output: torch's defaults pass the
    correct kernel, atol 1e-2 too; the base-2 LSE fails them all."""
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    out, lse = flash(q, k, v, causal=True)
    rep = check(out, q, k, v, "bf16", lse=lse * np.float32(1 / math.log(2)), causal=True,
                layout="bnhd", rules_table=True)
    said = {(r.rule, r.tensor): r.passed for r in rep.other_rules}
    assert said[("atol 1e-2 (Triton's tutorial)", "out")] is True
    assert said[("KernelBench allclose (0.01)", "lse")] is False
    assert said[("flashinfer-bench matched ratio ≥ 0.95", "lse")] is False


LSE_BASE2 = ("check", "samples/planted/lse_base2_bf16.npz", "--causal", "--layout", "bnhd",
             "--dtype", "bf16")


def test_lse_only_failure_ranks_heads_by_lse(osm):
    """Only the LSE fails (base 2): the worst heads are ranked and counted by the LSE, as the
    worst rows are (they showed the output's errors and "rows over the bound 0")."""
    text = osm(*LSE_BASE2, code=1).stdout
    table = text.split("worst heads by |LSE − ref|\n")[1].strip().splitlines()
    assert [x.strip() for x in table[0].split("   ") if x.strip()] == [
        "batch", "head", "max |out − ref|", "max |LSE − ref|", "rows over (LSE)"]
    assert table[2].split() == ["0", "1", "1.53e-05", "2.47", "128"]
    assert table[3].split() == ["0", "0", "0", "2.44", "127"]
    doc = json.loads(osm(*LSE_BASE2, "--json", code=1).stdout)
    assert doc["worst_ranked_by"] == "lse"
    assert [(h["head"], h["rows_over"], round(h["lse_err"], 2)) for h in doc["worst_heads"]] == [
        (1, 128, 2.47), (0, 127, 2.44)]
    assert {"batch", "head", "err", "rows_over"} <= set(doc["worst_heads"][0])


@pytest.mark.parametrize("width", [72, 80, 100])
def test_varlen_lse_only_report_fits(tmp_path, osm, width):
    """A varlen bundle whose LSE is base 2 (out correct): the report's worst heads, ranked by the
    LSE, count the LSE's rows under a one-line header that fits 72 columns with the sequence
    column; the probe's advice is followed by a blank line before the worst rows' title."""
    from osm_cli import attention_reference

    cu = np.array([0, 100, 180, 256], np.int32)
    q, k, v = qkv(256, 256, 32, heads=(2, 2), seed=4, **BNHD)
    ref = attention_reference(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                              layout="bnhd")
    lse2 = (np.asarray(ref.lse, np.float64) * math.log2(math.e)).astype(np.float32)
    path = tmp_path / "varlen_lse2.npz"
    f32 = [np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32) for x in (q, k, v, ref.out)]
    np.savez(path, **dict(zip("qkv", f32[:3], strict=True)), out=f32[3], softmax_lse=lse2,
             cu_seqlens_q=cu, cu_seqlens_k=cu)
    text = osm("check", path, "--causal", "--layout", "bnhd", "--dtype", "bf16", width=width,
               code=1).stdout
    assert max(map(len, text.splitlines())) <= width
    heads = text.split("worst heads by |LSE − ref|\n\n")[1].splitlines()
    assert [x.strip() for x in heads[0].split("   ") if x.strip()] == [
        "sequence", "head", "max |out − ref|", "max |LSE − ref|", "rows over (LSE)"]
    assert set(heads[1].strip()) == {"─"}
    rows = [line.split() for line in heads[2:] if line.strip()]
    assert len(rows) == 5  # of 3 sequences × 2 heads
    for seq, _, out_err, _, count in rows:  # out is right; nearly every LSE row is over
        assert out_err == "0" and 0 <= cu[int(seq) + 1] - cu[int(seq)] - int(count) <= 1
    assert "convention\n\nworst 5 rows by |LSE − ref|\n" in text


def _varlen_shift(**kw):
    """The planted varlen bug (keys read one row late) on three sequences, judged."""
    cu = np.array([0, 100, 180, 256], np.int32)
    q, k, v = qkv(256, 256, 32, heads=(2, 2), seed=4, **BNHD)  # packed (total, H, d)
    out, lse = planted("varlen_shift")(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    return check(out, q, k, v, "bf16", lse=lse, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                 **kw)


def _table(text: str, title: str) -> list[list[str]]:
    """A table's header words and rows as words, from the report's text."""
    lines = text.split(f"\n{title}\n")[1].strip("\n").splitlines()
    return [lines[0].split()] + [line.split() for line in lines[2:] if line.strip()][:5]


def test_varlen_heads_and_bias_say_sequence():
    """A varlen batch's worst heads are a sequence's, under a `sequence` column as the worst
    rows are; the bias line pools every sequence of a head and says so, not "batch 0"; the JSON
    keeps `batch` and adds `sequence` (the same value) to each worst row and head."""
    from osm_cli.present.json import check_doc
    from osm_cli.present.verdicts import check_report

    rep = _varlen_shift()
    text = as_text(check_report(rep, "out", 5))
    heads = _table(text, "worst heads")
    assert heads[0][0] == "sequence"
    assert heads[1:4] == [["1", "0", "3.11", "71"], ["0", "1", "2.77", "74"],
                          ["1", "1", "2.69", "59"]]
    assert "per-head bias of (out − ref): largest head 0 (all sequences), -0.23" in text
    assert "of batch" not in text
    doc = check_doc(rep)
    assert [(r["sequence"], r["batch"], r["head"], r["query"]) for r in doc["worst_rows"][:2]] \
        == [(1, 1, 0, 2), (0, 0, 1, 0)]
    assert [(h["sequence"], h["batch"], h["rows_over"]) for h in doc["worst_heads"][:2]] == [
        (1, 1, 71), (0, 0, 74)]
    model = _varlen_shift(rule="model")
    assert "head 0 (all sequences) biased -0.23" in _tensor(model, "out").reasons[0]
    q, k, v = qkv(128, 128, 32, heads=(2, 2), b=1, **BNHD)
    dense = check_doc(check(*flash(q, k, v)[:1], q, k, v, "bf16", layout="bnhd"))
    assert "sequence" not in dense["worst_rows"][0] and "sequence" not in dense["worst_heads"][0]


def test_varlen_gradient_rows_are_sequence_and_query():
    """dQ of one sequence's head × 1.1 in a varlen batch: its worst rows and heads are given as
    (sequence, query), and the FAIL line names the sequence, not the packed batch 0."""
    from osm_cli import attention_backward
    from osm_cli.present.json import check_doc
    from osm_cli.present.verdicts import check_report, fail_line

    cu = np.array([0, 100, 180, 256], np.int32)
    q, k, v = qkv(256, 256, 32, heads=(2, 2), seed=4, **BNHD)
    out, lse = flash(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    do = rand(256, 2, 32, seed=9, dtype=BF16)
    f64 = [np.asarray(x, np.float64) for x in (q, k, v, do)]
    g = attention_backward(*f64[:3], None, f64[3], causal=True, cu_seqlens_q=cu,
                           cu_seqlens_k=cu, layout="bnhd")
    dq, dk, dv = (np.asarray(x).astype(BF16) for x in (g.dq, g.dk, g.dv))
    dq[100:180, 1] = (dq[100:180, 1].astype(np.float32) * 1.1).astype(BF16)
    rep = check(out, q, k, v, "bf16", lse=lse, do=do, dq=dq, dk=dk, dv=dv, causal=True,
                cu_seqlens_q=cu, cu_seqlens_k=cu)
    w = rep.worst_grad
    assert w.name == "dq" and w.varlen
    assert {(r.batch, r.head) for r in w.rows} == {(1, 1)} and max(r.query for r in w.rows) < 80
    assert (w.heads[0].batch, w.heads[0].head, w.heads[0].rows_over) == (1, 1, w.rows_over)
    text = as_text(check_report(rep, "out", 5))
    assert _table(text, "worst heads of dQ")[0][0] == "sequence"
    assert _table(text, "worst 5 rows of dQ (nearest its bound)")[0][0] == "sequence"
    assert "worst head 1 of sequence 1; where: sequence 1 of 3" in fail_line(rep)
    grad = check_doc(rep)["gradients"][0]
    assert grad["worst_rows"][0]["sequence"] == grad["worst_rows"][0]["batch"] == 1


def test_every_head_of_every_batch_counts_each():
    """Every head of two batches fails: the summary counts the heads and the batches each
    beside its own word (it read "every head of every batch (2)", as if 2 were the heads)."""
    from osm_cli.precision.locate import locate

    loc = locate(np.ones((2, 8, 128), dtype=bool), "out", block=64)
    assert loc.patterns[-1] == "every head (8) of every batch (2)"
    assert locate(np.ones((1, 8, 128), dtype=bool), "out").patterns[-1] == "every head (8)"
    q, k, v = qkv(128, 128, 32, heads=(4, 4), b=2, **BNHD)
    rep = _judge(planted("lse_base2"), q, k, v, causal=True)
    assert _tensor(rep, "lse").where == "every query row; every head (4) of every batch (2)"


def test_rows_that_see_no_key_have_no_ulps():
    """A row that sees no key has a reference of exactly 0, which has no ulp: its ulps read "—"
    with a legend under the table (JSON null), not 3.36e+39 (0.309 over bf16's least
    subnormal); a row whose error is 0 keeps 0 ulps."""
    from osm_cli.present.json import check_doc
    from osm_cli.present.verdicts import check_report

    q, k, v = qkv(256, 128, 64, heads=(4, 4), b=1, **BNHD)  # the first 128 rows see no key
    rep = _judge(planted("masked_rows"), q, k, v, causal=True)
    text = as_text(check_report(rep, "out", 3), width=72)
    assert _table(text, "worst 3 rows (ulp of bfloat16 at the row's largest |ref|)")[1] == [
        "0", "1", "0", "0.309", "—", "0"]
    assert "e+39" not in text
    assert ("ulps —: the row's reference is exactly 0 (a row that sees no key, or one whose V "
            "is 0), which has no ulp; its error is the absolute one beside" in " ".join(
                text.split()))
    assert [r["ulps"] for r in check_doc(rep)["worst_rows"]] == [None] * 5
    out, lse = flash(q, k, v, causal=True)
    ok = check(out, q, k, v, "bf16", lse=lse, causal=True, layout="bnhd")
    assert ok.passed and ok.rows[0].err > 0
    assert all(r.ulps is not None for r in ok.rows)
    assert "ulps —" not in as_text(check_report(ok, "out", 3))


def test_lse_base_2_said_of_a_natural_lse_probes_base_e(osm, tmp_path):
    """`lse_base` "2" on a kernel whose LSE is natural (FlashAttention's): the LSE fails, and
    the probe says base e with the flag that states it; the verdict stays FAIL."""
    q, k, v = qkv(256, 256, 64, heads=(4, 4), b=1, **BNHD)
    out, lse = flash(q, k, v, causal=True)
    rep = check(out, q, k, v, "bf16", lse=lse, causal=True, layout="bnhd", lse_base="2")
    assert not rep.passed and [t.tensor for t in rep.failures] == ["lse"]
    found = _tensor(rep, "lse").findings
    assert [f.probe for f in found] == ["lse-base-e"] and found[0].option == ("lse_base", "e")
    assert advice(found[0], flag).startswith("the kernel's LSE matches osm's in base e (max "
                                             "diff ")
    assert advice(found[0], flag).endswith("): pass --lse-base e if that is its convention")
    assert not [f for f in rep.probe.tried if f.probe == "lse-base-2"]
    path = tmp_path / "natural.npz"
    np.savez(path, out=out.astype(np.float32), softmax_lse=lse, q=q.astype(np.float32),
             k=k.astype(np.float32), v=v.astype(np.float32))
    r = osm("check", path, "--causal", "--layout", "bnhd", "--dtype", "bf16", "--lse-base", "2",
            code=1)
    assert "LSE: the kernel's LSE matches osm's in base e (max diff" in r.stdout
    assert "probe: the kernel's LSE matches osm's in base e" in r.stderr
    assert "pass --lse-base e if that is its convention" in r.stderr
