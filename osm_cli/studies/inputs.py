"""Inputs a learner has without writing Python: seeded standard-normal Q, K, V (`--random
B,H,N,d`) and, for the backward, a seeded upstream gradient dO when none is given.

The same seed gives the same tensors on every machine (numpy's PCG64 through
`np.random.default_rng`). Leaves out: reading files (io/), what is done with the tensors.
"""

from __future__ import annotations

import numpy as np

from osm_cli.errors import InputError


def parse_shape(spec: str) -> tuple[int, int, int, int]:
    """'B,H,N,d' as four positive integers, e.g. '1,2,8,4' -> (1, 2, 8, 4)."""
    parts = [p.strip() for p in spec.split(",")]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise InputError(f"`random` {spec!r}: give the shape as B,H,N,d, four positive integers "
                         "(batch, heads, sequence length, head dim), e.g. 1,2,8,4")
    if np.prod(dims, dtype=np.int64) * 3 > 2**27:
        raise InputError(f"`random` {spec}: {np.prod(dims) * 3:,} values are more than a demo "
                         "needs (at most 2^27); save real tensors to .npy instead")
    return dims  # type: ignore[return-value]


def random_qkv(shape: tuple[int, int, int, int], seed: int = 0):
    """Q, K, V of shape (B, H, N, d), standard normal, float64, from one seeded generator."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape) for _ in range(3))


def seeded_do(q: np.ndarray, v: np.ndarray, seed: int = 0) -> np.ndarray:
    """A standard-normal dO shaped like the output O (Q's shape with V's head dim), float64."""
    rng = np.random.default_rng([seed, 1])  # not the stream that made Q, K, V
    return rng.standard_normal((*q.shape[:-1], v.shape[-1]))


__all__ = ["parse_shape", "random_qkv", "seeded_do"]
