"""`osm battery`: drive an attention kernel through the cases where real kernels break, judge
each against osm's float64 reference by osm check's rule, shrink what fails, name why.

`run(fn, **options) -> BatteryReport` and `replay(fn, case_id)`; the modules: cases.py (a
case, its ID and inputs), draw.py (the case lists), kernel.py (the contract and the guards),
adapters.py (targets and built-in adapters), judge.py, shrink.py, runner.py. Nothing heavy is
imported until used. Leaves out: printing (present/battery.py), the command (cli/battery.py).

Example: from osm_cli.battery import run; run("osm:fa2", arrays="numpy").passed
"""

from __future__ import annotations

_EXPORTS = {"run": "runner", "replay": "runner", "BatteryReport": "runner", "Failure": "runner",
            "target_of": "runner", "Case": "cases", "CaseResult": "judge", "FEATURES": "cases"}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
