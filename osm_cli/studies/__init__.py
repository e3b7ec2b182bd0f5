"""What osm studies beside the algorithm: lazy rescale (lazy.py), block order (order.py), block
size against the FA1 cost model (sweep.py, costmodel.py), tile maps (tilemap.py) and the overflow
demo (overflow.py)."""

from importlib import import_module

# the names osm_cli.studies offers, found on first use (module -> names); the sweep is
# osm_cli.studies.sweep.sweep (its module's name)
_API = {
    "lazy": ("LazyReport", "lazy_report"),
    "order": ("block_order", "order_check"),
    "overflow": ("overflow_demo",),
}
_WHERE = {name: module for module, names in _API.items() for name in names}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [*_WHERE]
