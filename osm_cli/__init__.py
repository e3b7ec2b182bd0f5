"""osm: a numerical explorer for the online softmax at the heart of FlashAttention.

The Python API returns the same records the tables show:

    from osm_cli import online_softmax
    t = online_softmax(np.array([2., 4., 1., 3.]), block=2)
    t.steps[1].l  # 1.5530018...
"""

from .attention import Attention, TileStep, attention, split_kv
from .attention import reference as attention_reference
from .costmodel import fa1_blocks, hbm_bytes_flash, hbm_bytes_standard, parse_size, tile_bytes
from .errors import InputError, OsmError, ShapeError
from .lazy import LazyReport, lazy_report
from .merge import block_order, fold_merge, merge_detail, merge_partials, order_check, tree_merge
from .online import (
    State,
    Step,
    Trace,
    combine,
    initial_state,
    merge_step,
    online_softmax,
    rescale_step,
)
from .precision import check, fa_rule, judge, limits, model, overflow_demo, round_to, ulp
from .reference import logsumexp, naive_softmax, stable_softmax
from .sweep import sweep

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
