"""osm: a numerical explorer for the online softmax at the heart of FlashAttention.

The Python API speaks FlashAttention's words (tensors first, every keyword explicit, the LSE as
(B, H, N)) and returns the same records the tables show:

    >>> import numpy as np
    >>> from osm_cli import online_softmax
    >>> t = online_softmax(np.array([2., 4., 1., 3.]), block=2)
    >>> round(float(t.steps[1].l), 7)
    1.5530018

The top level holds the few names a user starts from: `attention`, `attention_backward`,
`attention_reference`, `check`, `online_softmax`, their records and the errors. The rest lives
in namespaces: `osm_cli.kernels` (kernel presets and precision models), `osm_cli.core` (the
state, its update steps, the merge), `osm_cli.studies` (lazy rescale, block order, overflow),
`osm_cli.costmodel` (FA1's I/O model), `osm_cli.testing` (assert_attention_close).

The package is layered; each layer imports only those below it (pyproject.toml's import-linter
contract, checked in CI):

    cli/        typer: options, commands, "Error: …" lines and exit codes
    testing.py  assert_attention_close, for a kernel's own pytest suite
    api/        the public functions above, in FlashAttention's names (kernels.py, costmodel.py)
    present/    rich tables, JSON, CSV, plots, step mode: records in, renderables out
    io/         reading inputs, writing outputs atomically
    reports/    what each command reports, computed once
    studies/    lazy rescale, block order, sweep, cost model, tile maps, overflow demo
    precision/  dtypes and rounding, the kernel model, FlashAttention's test rule, check
    flash/      shapes, masks, scores, the tiled forward, the one-shot reference, split-KV
    core/       the state (m, l, O), the two update steps, the fold, references, merge

Names are imported on first use (PEP 562 __getattr__), so `osm` does not pay at every start for
modules a command may not need (`osm --help` loads neither numpy nor rich).
"""

from importlib import import_module

# module -> the names it exports here
_API = {
    "api.forward": ("attention", "attention_reference", "Reference"),
    "api.backward": ("attention_backward",),
    "api.check": ("check",),
    "flash.records": ("Attention", "Backward"),
    "precision.check": ("CheckReport",),
    "core.record": ("Step",),
    "core.fold": ("Trace", "online_softmax"),
    "errors": ("InputError", "OsmError", "ShapeError"),
}
_WHERE = {name: (module, name) for module, names in _API.items() for name in names}


def __getattr__(name: str):
    try:
        module, attr = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(import_module(f".{module}", __name__), attr)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__():
    return sorted({*globals(), *__all__})


__all__ = [*_WHERE]
__version__ = "0.3.0"
