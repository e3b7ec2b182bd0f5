"""What osm studies beside the algorithm: lazy rescale (lazy.py), block order (order.py), block
size against the FA1 cost model (sweep.py, costmodel.py), tile maps (tilemap.py) and the overflow
demo (overflow.py)."""
