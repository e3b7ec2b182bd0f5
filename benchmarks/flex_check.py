"""osm check on PyTorch FlexAttention's captures (samples/flex/, issue 24): each case judged with
the score_mod and mask_mod its meta describes, forward (out, LSE) and gradients (dQ, dK, dV) by
FlashAttention's rules against osm's float64 reference, and the block mask flex ran with judged
against the mask_mod (check --block-mask). Prints one table; `--write` also saves it to
benchmarks/results/flex_h200.txt.

`case_options(meta)` turns a capture's meta into osm's mods and the command-line specs that
say the same (tests/precision/test_flex.py uses it too). The captures' sliding window is
`q − kv < W` (FlexAttention's documented example), osm's `sliding:W` attention-gym's
`q − kv ≤ W`: the case runs `sliding:W−1`.

Usage: python benchmarks/flex_check.py [FOLDER] [--write]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from osm_cli.flash import mods
from osm_cli.flash.blockmask import judge_block_mask
from osm_cli.flash.options import ScoreOptions
from osm_cli.precision.check import check

ROOT = Path(__file__).resolve().parent.parent
BLOCK_ARRAYS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def case_options(meta: dict) -> tuple[ScoreOptions, list[str]]:
    """The capture's mods as osm's ScoreOptions, and as --score-mod / --mask-mod specs."""
    m = meta["mods"]
    score, mask, specs = None, None, []
    if m.get("score_mod") == "softcap":
        score = mods.softcap(m["softcap"])
        specs += ["--score-mod", f"softcap:{m['softcap']:g}"]
    elif m.get("score_mod") == "alibi":
        score = mods.alibi(m["alibi_slopes"])
        specs += ["--score-mod", "alibi"]  # the standard slopes 2^(−8(h+1)/H), as captured
    elif m.get("score_mod"):
        raise ValueError(f"unknown score_mod {m['score_mod']!r}")
    kind = m.get("mask_mod")
    if kind == "causal":
        mask, spec = mods.causal(), "causal"
    elif kind == "sliding":  # q − kv < W here, q − kv ≤ W in osm's sliding:W
        mask, spec = mods.sliding(m["window"] - 1), f"sliding:{m['window'] - 1}"
    elif kind == "document":
        mask, spec = mods.document(np.asarray(m["doc_ids"])), "document:DOC_IDS.npy"
    elif kind == "prefix_lm":
        mask, spec = mods.prefix_lm(m["prefix"]), f"prefix-lm:{m['prefix']}"
    elif kind:
        raise ValueError(f"unknown mask_mod {kind!r}")
    if mask is not None:
        specs += ["--mask-mod", spec]
    scale = meta.get("scale")
    return ScoreOptions(scale=scale, score_mod=score, mask_mod=mask), specs


def judge_case(path: Path) -> dict:
    """One capture judged: the verdicts and errors of out, LSE, the gradients, the block mask."""
    with np.load(path) as z:
        a = {n: z[n] for n in z.files}
    meta = json.loads(str(a.pop("meta")))
    opts, specs = case_options(meta)
    q, k, v, do = (a[n] for n in ("q", "k", "v", "do"))
    rep = check(a["out"], q, k, v, "bf16", lse=a["lse"], do=do, dq=a["dq"], dk=a["dk"],
                dv=a["dv"], opts=opts, with_model=False)
    row = {"case": path.stem.removeprefix("flex_"), "specs": " ".join(specs),
           "out": rep.verdict.passed, "out_err": rep.verdict.err,
           "lse_err": rep.verdict.lse_err,
           "grads": {g.name: (g.rule.passed, g.err64) for g in rep.grads}, "block": None}
    if opts.mask_mod is not None and all(n in a for n in BLOCK_ARRAYS):
        b, h, t, _ = q.shape
        bm = judge_block_mask(opts.mask_mod, b, h, t, k.shape[2],
                              {n: a[n] for n in BLOCK_ARRAYS}, meta.get("block_size", (128, 128)))
        row["block"] = (bm.passed, bm.wrong[0] if bm.wrong else "")
    return row


def table(rows: list[dict]) -> str:
    """The results as text: one line per case, then the wrong tiles named."""
    lines = [f"{'case':<28} {'out':>4} {'max|out-ref|':>12} {'LSE err':>8} {'dQ dK dV':>8} "
             f"{'block mask':>10}  osm check's mods"]
    for r in rows:
        grads = " ".join("P" if r["grads"][g][0] else "F" for g in ("dq", "dk", "dv"))
        block = "-" if r["block"] is None else "PASS" if r["block"][0] else "FAIL"
        lse = "-" if r["lse_err"] is None else f"{r['lse_err']:.1e}"
        lines.append(f"{r['case']:<28} {'PASS' if r['out'] else 'FAIL':>4} "
                     f"{r['out_err']:>12.2e} {lse:>8} {grads:>8} {block:>10}  {r['specs']}")
    named = [f"  {r['case']}: {r['block'][1]}" for r in rows if r["block"] and r["block"][1]]
    if named:
        lines += ["", "wrong block-mask tiles named:", *named]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    folder = Path(next((a for a in argv if not a.startswith("--")), ROOT / "samples" / "flex"))
    rows = [judge_case(p) for p in sorted(folder.glob("flex_*.npz"))]
    text = ("osm check on FlexAttention (torch.compile, bf16, an H200; samples/flex/), forward\n"
            "and gradients by FlashAttention's rules against osm's float64 reference with the\n"
            "same mods (P/F per gradient), the block mask judged against the mask_mod\n\n"
            + table(rows))
    print(text, end="")
    if "--write" in argv:
        (ROOT / "benchmarks" / "results" / "flex_h200.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
