"""The algorithm in pure numpy: the state and its two update steps (state.py), the step record
(record.py), the fold over blocks (fold.py), the one-shot softmax references (reference.py)
and the merge of partial results (merge.py). Imports nothing else of osm but errors.

    >>> from osm_cli import core
    >>> core.merge_partials([[1.0], [3.0]], [0.0, 0.0])[0]
    array([2.])
"""

from .lazy import lazy as _lazy

# the names osm_cli.core offers, found on first use (module -> names)
_API = {
    "state": ("State", "combine", "initial_state", "merge_step", "rescale_step"),
    "record": ("GradStep", "Step"),
    "fold": ("Trace", "online_softmax"),
    "reference": ("logsumexp", "naive_softmax", "stable_softmax"),
    "merge": ("fold_merge", "merge_detail", "merge_partials", "tree_merge"),
}
__getattr__, __all__ = _lazy(__name__, _API)
