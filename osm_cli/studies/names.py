"""The studies' choices as plain tuples, importable without numpy, so that the command line can
declare its options at start-up (`osm --help` loads no numpy): the orders to visit blocks in.

Leaves out: what the choices do (order.py).

Example: "shuffle" in ORDERS
"""

from __future__ import annotations

ORDERS = ("forward", "reverse", "shuffle")  # docs/numerics.md#order

__all__ = ["ORDERS"]
