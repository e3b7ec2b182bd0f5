"""The algorithm in pure numpy: the state and its two update steps (state.py), the step record
(record.py), the fold over blocks (fold.py), the one-shot softmax references (reference.py)
and the merge of partial results (merge.py). Imports nothing else of osm but errors."""
