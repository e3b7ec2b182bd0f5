"""osm: a numerical explorer for the online softmax at the heart of FlashAttention.

The Python API returns the same records the tables show:

    from osm_cli import online_softmax
    t = online_softmax(np.array([2., 4., 1., 3.]), block=2)
    t.steps[1].l  # 1.5530018...
"""

from .attention import Attention, TileStep, attention
from .errors import InputError, OsmError, ShapeError
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
from .reference import logsumexp, naive_softmax, stable_softmax

__all__ = [
    "Attention", "TileStep", "attention",
    "InputError", "OsmError", "ShapeError", "State", "Step", "Trace", "combine",
    "initial_state", "logsumexp", "merge_step", "naive_softmax", "online_softmax",
    "rescale_step", "stable_softmax",
]
__version__ = "0.1.0"
