"""FA1's I/O cost model as a namespace (studies/costmodel.py holds it): the HBM bytes of
standard and flash attention, FA1's block sizes for an SRAM of M bytes, a tile's bytes and
attention's FLOPs.

    >>> from osm_cli import costmodel
    >>> costmodel.fa1_blocks(100 * 1024, 64)
    (64, 400)

Leaves out: the sweep over block sizes that uses it (studies/sweep.py).
"""

from osm_cli.studies.costmodel import (
    attention_flops,
    cost,
    fa1_blocks,
    hbm_bytes_flash,
    hbm_bytes_standard,
    parse_size,
    tile_bytes,
)

__all__ = ["attention_flops", "cost", "fa1_blocks", "hbm_bytes_flash", "hbm_bytes_standard",
           "parse_size", "tile_bytes"]
