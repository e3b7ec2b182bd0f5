"""osm: a numerical explorer for the online softmax at the heart of FlashAttention.

The Python API returns the same records the tables show:

    from osm_cli import online_softmax
    t = online_softmax(np.array([2., 4., 1., 3.]), block=2)
    t.steps[1].l  # 1.5530018...

Names are imported on first use (PEP 562 __getattr__), so `osm` does not pay at every start for
modules a command may not need (precision.py and ml_dtypes). `attention` and `sweep` are the
exception: each is also the name of a submodule, and importing that submodule (as the CLI does)
would bind the module to the package's name in place of the function, unless the function is
bound here after it.
"""

from importlib import import_module

from .attention import attention
from .sweep import sweep

# module -> the names it exports here
_API = {
    "attention": ("Attention", "TileStep", "split_kv"),
    "costmodel": ("fa1_blocks", "hbm_bytes_flash", "hbm_bytes_standard", "parse_size",
                  "tile_bytes"),
    "errors": ("InputError", "OsmError", "ShapeError"),
    "lazy": ("LazyReport", "lazy_report"),
    "merge": ("block_order", "fold_merge", "merge_detail", "merge_partials", "order_check",
              "tree_merge"),
    "online": ("State", "Step", "Trace", "combine", "initial_state", "merge_step",
               "online_softmax", "rescale_step"),
    "precision": ("check", "fa_rule", "judge", "limits", "model", "overflow_demo", "round_to",
                  "ulp"),
    "reference": ("logsumexp", "naive_softmax", "stable_softmax"),
}
_WHERE = {name: (module, name) for module, names in _API.items() for name in names}
_WHERE["attention_reference"] = ("attention", "reference")  # named apart from reference.py


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


__all__ = [
    "Attention", "TileStep", "attention", "attention_reference", "split_kv",
    "check", "fa_rule", "judge", "limits", "model", "overflow_demo", "round_to", "ulp",
    "InputError", "OsmError", "ShapeError", "State", "Step", "Trace", "combine",
    "initial_state", "logsumexp", "merge_step", "naive_softmax", "online_softmax",
    "rescale_step", "stable_softmax",
    "LazyReport", "block_order", "fa1_blocks", "fold_merge", "hbm_bytes_flash",
    "hbm_bytes_standard", "lazy_report", "merge_detail", "merge_partials", "order_check",
    "parse_size", "sweep", "tile_bytes", "tree_merge",
]
__version__ = "0.1.0"
