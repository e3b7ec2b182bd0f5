"""The battery's cases: one frozen `Case` per problem (shape, dtype, features, edge kind, seed),
its replayable ID, the seeded inputs it stands for, and the lists `--budget quick|full` draws.

Where real kernels break (issue 23): FlashAttention's own (seqlen_q, seqlen_k) pairs and head
dims; GQA and MQA ratios; causal bottom-right with t ≠ s both ways; windows; softcap; ALiBi;
sinks; varlen with zero-length sequences; paged caches with a partial last page and keys past
seqused_k poisoned with large finite values; and the edge kinds of EDGES. Plus shapes drawn at
random from the declared space. A case's inputs come from its own seed alone, so its ID replays
it exactly. Leaves out: calling a kernel (kernel.py), judging (runner.py), shrinking (shrink.py).

Example: Case.parse("b1h2g1-q65k128-d64-bf16-causal-s7").nq -> 65
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from osm_cli.errors import InputError

from .modcases import check_spec

# what a kernel may declare (--features): SHAPING shape the cases (score_mod and mask_mod are
# FlexAttention's functions, modcases.py); block_mask hands the mask over as FlexAttention's
# BlockMask instead of mask_mod=; lse and grad are tensors the kernel returns
SHAPING = ("causal", "gqa", "window", "softcap", "alibi", "sink", "varlen", "paged",
           "score_mod", "mask_mod")
FEATURES = (*SHAPING, "block_mask", "lse", "grad")
CLASSES = ("fa-shapes", "edge", "random")  # the report's columns
ROWS = ("dense", *SHAPING, "lse", "grad")  # the report's rows: dense = a case with no feature
EDGES = {
    "nokey": "rows that see no key",
    "big": "scores of large magnitude, both signs",
    "mod64": "lengths ≡ 64 (mod 128)",
    "rise": "a row max rising by less than τ per tile",
    "ties": "tied scores",
    "n1": "one key (N_k = 1)",
    "q1": "one query (N_q = 1)",
}
# FlashAttention's tests/test_flash_attn.py (seqlen_q, seqlen_k): the output tests' pairs, then
# the KV-cache tests' short-query ones
FA_PAIRS = ((113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256),
            (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048))
FA_DECODE_PAIRS = ((1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048))
FA_HEAD_DIMS = (32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256)
DTYPES = ("bf16", "fp16")
POISON = 1.0e4  # the value of a cache row past seqused_k: finite in bf16 and fp16, fatal if read


@dataclass(frozen=True)
class Case:
    """One problem: B sequences, H query heads over Hkv K/V heads, N_q queries, N_k keys, head
    dim d; lens: per-sequence (N_q, N_k) of a varlen batch or (N_q, seqused_k) of a paged one."""

    b: int
    h: int
    hkv: int
    nq: int
    nk: int
    d: int
    dtype: str = "bf16"
    causal: bool = False
    window: tuple[int, int] | None = None
    softcap: float | None = None
    alibi: bool = False
    sink: bool = False
    varlen: bool = False
    page: int = 0  # a paged cache's page size (0: not paged)
    lens: tuple[tuple[int, int], ...] | None = None
    score_mod: str = ""  # a modcases spec ("softcap.20", "alibi", …); "" none
    mask_mod: str = ""  # modcases specs joined by + ("doc.1.120+causal"); "" none
    edge: str = ""
    seed: int = 0
    klass: str = "random"  # not part of the ID

    def __str__(self) -> str:
        return self.id

    @property
    def features(self) -> tuple[str, ...]:
        """The shaping features this case exercises."""
        on = {"causal": self.causal, "gqa": self.hkv != self.h, "window": self.window is not None,
              "softcap": self.softcap is not None, "alibi": self.alibi, "sink": self.sink,
              "varlen": self.varlen, "paged": self.page > 0,
              "score_mod": bool(self.score_mod), "mask_mod": bool(self.mask_mod)}
        return tuple(f for f in SHAPING if on[f])

    @property
    def size(self) -> int:
        """Scores computed: what shrinking makes small."""
        if self.lens:
            return self.h * sum(a * b for a, b in self.lens) + self.d
        return self.b * self.h * self.nq * self.nk + self.d

    @property
    def id(self) -> str:
        parts = [f"b{self.b}h{self.h}g{self.hkv}", f"q{self.nq}k{self.nk}", f"d{self.d}",
                 self.dtype]
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"w{self.window[0]}.{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi:
            parts.append("alibi")
        if self.sink:
            parts.append("sink")
        if self.lens is not None:
            tag = f"p{self.page}" if self.page else "v"
            parts.append(tag + "_" + "_".join(f"{a}.{b}" for a, b in self.lens))
        if self.score_mod:
            parts.append(f"sm.{self.score_mod}")
        if self.mask_mod:
            parts.append(f"mm.{self.mask_mod}")
        if self.edge:
            parts.append(f"e{self.edge}")
        parts.append(f"s{self.seed}")
        return "-".join(parts)

    @classmethod
    def parse(cls, text: str) -> Case:
        """The case an ID names (Case.id's inverse); an InputError for anything else."""
        parts = text.strip().split("-")
        bad = InputError(f"{text!r} is not a battery case ID (such as "
                         "b1h2g1-q65k128-d64-bf16-causal-s7)")
        try:
            m1 = re.fullmatch(r"b(\d+)h(\d+)g(\d+)", parts[0])
            m2 = re.fullmatch(r"q(\d+)k(\d+)", parts[1])
            m3 = re.fullmatch(r"d(\d+)", parts[2])
            if not (m1 and m2 and m3) or parts[3] not in DTYPES:
                raise bad
            kw: dict = {"dtype": parts[3]}
            for p in parts[4:]:
                if p in ("causal", "alibi", "sink"):
                    kw[p] = True
                elif m := re.fullmatch(r"w(\d+)\.(\d+)", p):
                    kw["window"] = (int(m[1]), int(m[2]))
                elif p.startswith("cap"):
                    kw["softcap"] = float(p[3:])
                elif m := re.fullmatch(r"(v|p\d+)((?:_\d+\.\d+)+)", p):
                    kw["lens"] = tuple(tuple(int(x) for x in pair.split("."))
                                       for pair in m[2][1:].split("_"))
                    if m[1] == "v":
                        kw["varlen"] = True
                    else:
                        kw["page"] = int(m[1][1:])
                elif p.startswith(("sm.", "mm.")):
                    kind = "score" if p[0] == "s" else "mask"
                    kw[f"{kind}_mod"] = check_spec(p[3:], kind)
                elif p.startswith("e") and p[1:] in EDGES:
                    kw["edge"] = p[1:]
                elif re.fullmatch(r"s\d+", p):
                    kw["seed"] = int(p[1:])
                else:
                    raise bad
            case = cls(*(int(x) for x in (*m1.groups(), *m2.groups(), m3[1])), **kw)
        except (IndexError, ValueError) as exc:
            raise bad from exc
        return case.checked()

    def checked(self) -> Case:
        """self, or an InputError saying which field cannot be."""
        if min(self.b, self.h, self.hkv, self.d) < 1 or self.nq < 0 or self.nk < 0:
            raise InputError(f"case {self.id}: B, H, Hkv and d must be positive")
        if self.h % self.hkv:
            raise InputError(f"case {self.id}: H = {self.h} is not a multiple of Hkv = "
                             f"{self.hkv}")
        if self.lens is not None and len(self.lens) != self.b:
            raise InputError(f"case {self.id}: {len(self.lens)} lengths for B = {self.b}")
        return self


def scale_of(case: Case) -> float:
    return 1.0 / math.sqrt(case.d)


def _with_lens(case: Case, rng: np.random.Generator) -> Case:
    """A varlen or paged case gets per-sequence lengths: one sequence of N_q × N_k, the others
    drawn, one with zero keys (and for varlen one with zero queries) when B allows."""
    if not (case.varlen or case.page):
        return case
    lens = [(case.nq, case.nk)]
    for i in range(1, case.b):
        a = case.nq if case.page else int(rng.integers(0, case.nq + 1))
        kk = int(rng.integers(0, case.nk + 1))
        if i == 1:
            kk = 0
        if i == 2 and case.varlen:
            a = 0
        lens.append((a, kk))
    return replace(case, lens=tuple(lens))


def _draw(rng, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def inputs(case: Case) -> dict:
    """The case's tensors as numpy arrays in float32 holding values of its dtype: q, k, v, dout;
    and its keyword arrays in FlashAttention's names (alibi_slopes, learnable_sink,
    cu_seqlens_q/_k, seqused_k, page_table) as int32 / float32."""
    from osm_cli.precision.dtypes import DTYPES as NP_DTYPES

    dt = NP_DTYPES["bfloat16" if case.dtype == "bf16" else "float16"]
    rng = np.random.default_rng(case.seed)
    qn = [a for a, _ in case.lens] if case.lens else [case.nq] * case.b
    kn = [c for _, c in case.lens] if case.lens else [case.nk] * case.b
    sigma = 16.0 if case.edge == "big" else 1.0
    qs = [_values(rng, (n, case.h, case.d), sigma, case.edge, "q") for n in qn]
    ks = [_values(rng, (n, case.hkv, case.d), sigma, case.edge, "k") for n in kn]
    vs = [rng.standard_normal((n, case.hkv, case.d), dtype=np.float32) for n in kn]
    extra: dict = {}
    if case.varlen:
        q = np.concatenate(qs)
        k, v = np.concatenate(ks), np.concatenate(vs)
        extra["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(qn)]).astype(np.int32)
        extra["cu_seqlens_k"] = np.concatenate([[0], np.cumsum(kn)]).astype(np.int32)
        extra["max_seqlen_q"], extra["max_seqlen_k"] = max(qn), max(kn)
    else:
        q = np.stack(qs)
        if case.page:
            k, v, extra = _paged(case, ks, vs, kn, rng)
        else:
            k, v = np.stack(ks), np.stack(vs)
    if case.alibi:
        extra["alibi_slopes"] = (rng.random((case.b, case.h)) * 0.3).astype(np.float32)
    if case.sink:
        extra["learnable_sink"] = rng.uniform(-2.0, 2.0, case.h).astype(np.float32)
    rounded = {n: x.astype(dt).astype(np.float32) for n, x in
               (("q", q), ("k", k), ("v", v),
                ("dout", rng.standard_normal(q.shape, dtype=np.float32)))}
    return {**rounded, **extra}


def _values(rng, shape, sigma: float, edge: str, which: str) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(sigma)
    n = shape[0]
    if edge == "ties" and which == "k" and n:
        x[:] = x[:1]  # every key alike: each row's scores all tie
    if edge == "rise" and n:
        x *= 0.05
        if which == "q":
            x[..., 0] = 4.0
        else:  # scores rise by 1.5 over the whole row: far below τ per tile
            x[..., 0] = np.linspace(0.0, 3.0, n, dtype=np.float32)[:, None]
    return x


def _paged(case: Case, ks, vs, kn, rng):
    """A paged cache: each sequence's pages in a shuffled pool, a partial last page, every row
    past seqused_k (and one spare page) poisoned with ±POISON."""
    ps = case.page
    need = [max(1, -(-n // ps)) for n in kn]
    width = max(need)
    pool = sum(need) + 1
    order = rng.permutation(pool)
    shape = (pool, ps, case.hkv, case.d)
    k = rng.choice(np.float32([-POISON, POISON]), size=shape)
    v = rng.choice(np.float32([-POISON, POISON]), size=shape)
    table = np.zeros((case.b, width), dtype=np.int32)
    at = 0
    for b, n in enumerate(kn):
        pages = order[at:at + need[b]]
        at += need[b]
        table[b, :need[b]] = pages
        table[b, need[b]:] = pages[-1]
        for j in range(n):
            k[pages[j // ps], j % ps] = ks[b][j]
            v[pages[j // ps], j % ps] = vs[b][j]
    return k, v, {"page_table": table, "seqused_k": np.asarray(kn, dtype=np.int32)}
