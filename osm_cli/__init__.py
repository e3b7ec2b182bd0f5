"""osm: a numerical explorer for the online softmax at the heart of FlashAttention.

The Python API returns the same records the tables show:

    from osm_cli import online_softmax
    t = online_softmax(np.array([2., 4., 1., 3.]), block=2)
    t.steps[1].l  # 1.5530018...

The package is layered; each layer imports only those below it (pyproject.toml's import-linter
contract, checked in CI):

    cli/        typer: options, commands, "Error: …" lines and exit codes
    present/    rich tables, JSON, CSV, plots, step mode: records in, renderables out
    io/         reading inputs, writing outputs atomically
    reports/    what each command reports, computed once
    studies/    lazy rescale, block order, sweep, cost model, tile maps, overflow demo
    precision/  dtypes and rounding, the kernel model, FlashAttention's test rule, check
    flash/  shapes, masks, scores, the tiled forward, the one-shot reference, split-KV
    core/       the state (m, l, O), the two update steps, the fold, references, merge

Names are imported on first use (PEP 562 __getattr__), so `osm` does not pay at every start for
modules a command may not need (`osm --help` loads neither numpy nor rich). The attention
algorithms live in the subpackage `flash/`, so that no subpackage shadows the function
`osm_cli.attention`.
"""

from importlib import import_module

# module -> the names it exports here
_API = {
    "flash.forward": ("attention", "Attention", "ScoreOptions", "Tiling", "Hooks"),
    "flash.backward": ("Backward", "attention_backward"),
    "flash.split": ("split_kv",),
    "core.record": ("GradStep", "Step"),
    "core.state": ("State", "combine", "initial_state", "merge_step", "rescale_step"),
    "core.fold": ("Trace", "online_softmax"),
    "core.reference": ("logsumexp", "naive_softmax", "stable_softmax"),
    "core.merge": ("fold_merge", "merge_detail", "merge_partials", "tree_merge"),
    "errors": ("InputError", "OsmError", "ShapeError"),
    "precision.check": ("check",),
    "precision.dtypes": ("limits", "round_to", "ulp"),
    "precision.model": ("model",),
    "precision.emulate": ("Descale", "run_kernel"),
    "precision.kernels": ("run_flash",),
    "precision.presets": ("PRESETS", "Preset", "preset"),
    "precision.rule": ("fa_rule", "judge"),
    "studies.costmodel": ("fa1_blocks", "hbm_bytes_flash", "hbm_bytes_standard", "parse_size",
                          "tile_bytes"),
    "studies.lazy": ("LazyReport", "lazy_report"),
    "studies.order": ("block_order", "order_check"),
    "studies.overflow": ("overflow_demo",),
    "studies.sweep": ("sweep",),
}
_WHERE = {name: (module, name) for module, names in _API.items() for name in names}
_WHERE["attention_reference"] = ("flash.reference", "reference")  # apart from core's
_WHERE["attention_reference_backward"] = ("flash.reference", "reference_backward")
_WHERE["TileStep"] = ("core.record", "Step")  # one record for blocks and tiles since 0.2


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
__version__ = "0.2.0"
