"""What osm studies beside the algorithm: lazy rescale (lazy.py), block order (order.py), block
size against the FA1 cost model (sweep.py, costmodel.py), tile maps (tilemap.py) and the overflow
demo (overflow.py)."""

from osm_cli.core.lazy import lazy as _lazy

# the names osm_cli.studies offers, found on first use (module -> names); the sweep is
# osm_cli.studies.sweep.sweep (its module's name)
_API = {
    "lazy": ("LazyReport", "lazy_report"),
    "order": ("block_order", "order_check"),
    "overflow": ("overflow_demo",),
}
__getattr__, __all__ = _lazy(__name__, _API)
