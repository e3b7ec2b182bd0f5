"""`run(fn, …) -> BatteryReport`: the battery as a library call, and its report record.

Draws the cases the kernel declares (draw.py), fitted to its shape limits, judges each
(judge.py; an exception or a guard is that case's failure and the battery goes on; a refusal,
the kernel saying it does not take the shape, is counted apart from wrong numbers), groups the
failures by the tensors they fail and the features they use, shrinks the smallest of each group
(shrink.py; refusals are not shrunk) and gives the table of feature × case class.
`replay(fn, ID)` reruns one case with the full check report.
Leaves out: printing (present/battery.py), the command line (cli/battery.py).

Example: run(planted_kernel, features="causal,lse", budget="quick").passed
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from osm_cli.errors import InputError

from .adapters import declared_features, load
from .cases import CLASSES, ROWS, Case
from .draw import Declared, draw, head_dims_of, limits_of
from .judge import RULES, CaseResult, judge
from .kernel import ARRAYS, DEVICES, LAYOUTS, Target
from .probe import probe
from .shrink import shrink

SHRINK_GROUPS = {"quick": 6, "full": 12}  # failures shrunk per run (the rest are listed)


@dataclass(frozen=True)
class Failure:
    """One kind of failure: how many cases showed it, the first of them, and the smallest case
    shrinking found, with its replay ID."""

    tensors: tuple[str, ...]
    features: tuple[str, ...]
    count: int
    first: CaseResult
    smallest: CaseResult

    @property
    def replay_id(self) -> str:
        return self.smallest.case.id


@dataclass(frozen=True)
class BatteryReport:
    target: str
    declared: Declared
    rule: str
    budget: str
    seed: int
    results: tuple[CaseResult, ...]
    failures: tuple[Failure, ...]
    seconds: float
    kernel_seconds: float
    lse_base: str = "e"
    left_out: int = 0  # cases drawn that the kernel's declared limits left out
    stopped: str = ""  # why the battery stopped early: the case whose error lost the GPU
    not_run: int = 0  # cases not run after it stopped

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        """Cases that failed: wrong numbers, an error or a guard; refusals not counted."""
        return sum(not r.passed and not r.refused for r in self.results)

    @property
    def refused(self) -> int:
        """Cases the kernel refused as shapes or options it does not take."""
        return sum(r.refused for r in self.results)

    @property
    def osm_seconds(self) -> float:
        """osm's own work: drawing, reference, baseline, judgement, shrinking."""
        return self.seconds - self.kernel_seconds

    def cell(self, row: str, klass: str) -> tuple[str, int, int]:
        """(state, failed, cases) of one table cell: state PASS, FAIL, REFUSED (no case
        wrong, some refused by the kernel: failed counts those), skipped (the kernel does not
        declare the feature) or none (no case of that class uses it)."""
        if row != "dense" and row not in self.declared.shaping + ("lse", "grad") or \
                row in ("lse", "grad") and row not in self.declared.features:
            return "skipped", 0, 0
        mine = [r for r in self.results if r.case.klass == klass and _in_row(r, row)]
        if row in ("lse", "grad"):
            tensors = ("lse",) if row == "lse" else ("dq", "dk", "dv")
            bad = sum(bool(set(r.failed) & {*tensors, "kernel"}) for r in mine)
        else:
            bad = sum(not r.passed and not r.refused for r in mine)
        if not mine:
            return "none", 0, 0
        refused = sum(r.refused for r in mine)
        if not bad and refused:
            return "REFUSED", refused, len(mine)
        return ("FAIL" if bad else "PASS"), bad, len(mine)

    @property
    def rows(self) -> tuple[str, ...]:
        return ROWS

    @property
    def classes(self) -> tuple[str, ...]:
        return CLASSES

    @property
    def nondeterministic(self) -> dict:
        """tensor -> (cases where reruns differed bitwise, runs differing, largest difference)."""
        agg: dict = {}
        for r in self.results:
            for n in r.nondeterminism:
                c, runs, d = agg.get(n.tensor, (0, 0, 0.0))
                agg[n.tensor] = (c + 1, runs + n.runs_differing, max(d, n.max_diff))
        return agg


def _in_row(r: CaseResult, row: str) -> bool:
    feats = r.case.features
    if row == "dense":
        return not feats
    if row == "lse":
        return r.report is None or r.report.verdict.lse is not None
    if row == "grad":
        return r.report is None or bool(r.report.grads)
    return row in feats


def target_of(fn: Callable | str, *, features=None, head_dims=None, dtypes="bf16",
              lse_base: str = "e", layout: str = "bnhd", arrays: str | None = None,
              device: str = "cpu", backend: str | None = None, seqlens: str | None = None,
              min_seqlen: int | None = None, seqlen_multiple: int | None = None) -> Target:
    """A Target from a function (or TARGET text) and the options; the one place they are
    checked. features: "causal,gqa" text or a collection; None: fn.osm_features. seqlens
    ("any", "equal": N_q = N_k), min_seqlen, seqlen_multiple: the shapes the kernel takes
    (None: its osm_constraints, else any)."""
    name = fn if isinstance(fn, str) else getattr(fn, "__name__", repr(fn))
    if isinstance(fn, str):
        fn = load(fn, backend)
    elif backend is not None:
        raise InputError("`backend` applies to the sdpa and flex targets only")
    feats = (declared_features(fn) or frozenset()) if features is None else \
        parse_list(features)
    dims = head_dims_of(head_dims) if head_dims is None or isinstance(head_dims, str) \
        else tuple(head_dims)
    declared = Declared(feats, dims, tuple(parse_list(dtypes, ordered=True)),
                        limits_of(fn, seqlens, min_seqlen, seqlen_multiple))
    for value, allowed, what in ((lse_base, ("e", "2"), "LSE base"),
                                 (layout, LAYOUTS, "layout"), (device, DEVICES, "device")):
        if value not in allowed:
            raise InputError(f"{what} must be one of {', '.join(allowed)}, not {value!r}")
    arrays = arrays or getattr(fn, "osm_arrays", None) or _default_arrays()
    if arrays not in ARRAYS:
        raise InputError(f"arrays must be one of {', '.join(ARRAYS)}, not {arrays!r}")
    if arrays == "torch" and not _has_torch():
        raise InputError("torch is not installed: give arrays='numpy' (--arrays numpy)")
    if device == "cuda" and arrays == "numpy":
        raise InputError("numpy arrays live on the CPU; --device cuda needs torch tensors")
    return Target(fn, name, declared, lse_base, layout, arrays, device)


def parse_list(x, ordered: bool = False):
    """"causal,gqa" (or a collection) as a frozenset, or with ordered a tuple in order."""
    items = [s.strip() for s in x.split(",")] if isinstance(x, str) else list(x)
    items = [s for s in items if s]
    return tuple(dict.fromkeys(items)) if ordered else frozenset(items)


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _default_arrays() -> str:
    return "torch" if _has_torch() else "numpy"


def run(fn: Callable | str, *, features=None, head_dims=None, dtypes="bf16",
        lse_base: str = "e", layout: str = "bnhd", arrays: str | None = None,
        device: str = "cpu", backend: str | None = None, budget: str = "quick",
        cases: int | None = None, seed: int = 0, rule: str = "fa", repeat: int = 1,
        shrinking: bool = True, max_failures: int | None = None,
        progress: Callable | None = None, seqlens: str | None = None,
        min_seqlen: int | None = None, seqlen_multiple: int | None = None,
        reference: str = "auto") -> BatteryReport:
    """Drive `fn` through the battery; the report says what passed, what failed and the
    smallest case of each failure. max_failures: stop after that many failing cases (the rest
    are not run); progress(done, total), if given, is called per case. seqlens, min_seqlen,
    seqlen_multiple: the kernel's shape limits (target_of). reference: where osm computes its
    float64 reference and plain baseline: "numpy" (on the CPU), "torch" (with torch on the
    kernel's device), "auto" (torch when the kernel's device is cuda, else numpy)."""
    if rule not in RULES:
        raise InputError(f"rule must be one of {', '.join(RULES)}, not {rule!r}")
    if repeat < 1:
        raise InputError(f"repeat must be 1 or more, not {repeat}")
    if max_failures is not None and max_failures < 1:
        raise InputError(f"max failures must be 1 or more, not {max_failures}")
    target = target_of(fn, features=features, head_dims=head_dims, dtypes=dtypes,
                       lse_base=lse_base, layout=layout, arrays=arrays, device=device,
                       backend=backend, seqlens=seqlens, min_seqlen=min_seqlen,
                       seqlen_multiple=seqlen_multiple)
    target = with_reference(target, reference)
    t0 = time.perf_counter()
    decl = target.declared
    todo = [c for c in draw(decl, budget, cases, seed) if decl.allows(c)]
    left_out = len([c for c in draw(decl, budget, cases, seed, fit=False)
                    if decl.allows(c)]) - len(todo)
    results = []
    stopped = ""
    for i, case in enumerate(todo):
        results.append(judge(target, case, rule, repeat))
        if progress is not None:
            progress(i + 1, len(todo))
        if results[-1].lost:  # a sticky CUDA error: no later call can run in this process
            stopped = f"case {case.id} left the GPU unusable ({results[-1].message})"
            break
        if max_failures is not None and sum(not r.passed for r in results) >= max_failures:
            break
    # shrinking reruns the kernel: not on a GPU that is gone
    failures = _failures(target, results, rule, budget if shrinking and not stopped else None)
    spent = time.perf_counter() - t0
    kernel_s = sum(r.kernel_seconds for r in results) + sum(
        f.smallest.kernel_seconds for f in failures)
    return BatteryReport(target.name, target.declared, rule, budget, seed, tuple(results),
                         tuple(failures), spent, kernel_s, lse_base, max(left_out, 0),
                         stopped, len(todo) - len(results) if stopped else 0)


def with_reference(target: Target, reference: str) -> Target:
    """target with where osm computes its reference: "numpy", "torch" or "auto"."""
    from dataclasses import replace

    if reference not in REFERENCES:
        raise InputError(f"reference must be one of {', '.join(REFERENCES)}, not "
                         f"{reference!r}")
    if reference == "auto":
        reference = "torch" if target.device == "cuda" and target.arrays == "torch" \
            else "numpy"
    if reference == "torch" and not _has_torch():
        raise InputError("reference torch needs torch installed")
    return replace(target, reference=reference)


REFERENCES = ("auto", "numpy", "torch")


def _failures(target: Target, results: list, rule: str, budget: str | None) -> list[Failure]:
    groups: dict = {}
    for r in results:
        if not r.passed:
            groups.setdefault((_kind(r), r.case.features), []).append(r)
    found: dict = {}  # a shrunk case but for its seed -> [Failure fields]
    shrunk = 0
    for rs in sorted(groups.values(), key=len, reverse=True):
        first = min(rs, key=lambda r: r.case.size)
        small = first
        # a refusal is not shrunk: the smallest refused case drawn says what the kernel refuses
        if budget is not None and shrunk < SHRINK_GROUPS[budget] and not first.refused:
            shrunk += 1
            small = shrink(target, first, rule)
            small = probe(target, small)
        key = small.case.id.rsplit("-s", 1)[0]  # the same case but for its seed: one failure
        if key in found:
            found[key][2] += len(rs)
            continue
        found[key] = [small.failed, small.case.features, len(rs), first, small]
    return [Failure(t, f, c, first, small) for t, f, c, first, small in found.values()]


def _kind(r: CaseResult) -> str:
    """What a failure is: its worst tensor, or for a kernel failure its message's head (the
    exception's type, or the guard that tripped)."""
    if r.failed[0] in ("kernel", "refused"):
        return r.failed[0] + ": " + r.message.split(":")[0]
    return r.failed[0]


def replay(fn: Callable | str, case_id: str, *, rule: str = "fa", repeat: int = 1,
           reference: str = "auto", **options) -> CaseResult:
    """Rerun exactly the case `case_id` (a replay line's ID) with its full check report."""
    case = Case.parse(case_id)
    target = with_reference(target_of(fn, **options), reference)
    res = judge(target, case, rule, repeat, top=5)
    return probe(target, res)


__all__ = ["BatteryReport", "Failure", "replay", "run", "target_of"]
