"""Where a command's tensors come from: files, or seeded standard-normal ones (`random`
"B,H,N,d"); for the backward a seeded dO when none is given and the forward's saved O and
LSE. What was made up is said in lines worded in parameter names (the command line prints
each `parameter` as its flag).

Leaves out: the file formats (load.py, bundles.py, tensorfile.py), the tensors' use.

Example: qkv_source([], random="1,1,4,2")[3] -> ["`random` 1,1,4,2 `seed` 0"]
"""

from __future__ import annotations

from pathlib import Path

from osm_cli.errors import InputError

from .bundles import load_backward, load_qkv
from .load import check_real, load_array


def _random(files, random: str | None, what: str) -> None:
    if random is not None and files:
        raise InputError(f"give {what} files or `random` B,H,N,d, not both")


def qkv_source(files, random: str | None = None, seed: int = 0, raw_as: str | None = None):
    """(q, k, v, names): the files (one bundle or three), or `random`'s seeded Q, K, V, named
    as the options that made them."""
    from osm_cli.studies.inputs import parse_shape, random_qkv

    _random(files, random, "Q K V")
    if random is not None:
        q, k, v = random_qkv(parse_shape(random), seed)
        return q, k, v, [f"`random` {random} `seed` {seed}"]
    q, k, v = load_qkv(files, raw_as)
    return q, k, v, list(files)


def backward_source(files, random: str | None = None, seed: int = 0,
                    raw_as: str | None = None, o: str | None = None, lse: str | None = None):
    """(q, k, v, do and the rest as load_backward gives them, with the forward's saved out and
    lse where given; lines saying what was made up): the files (Q K V DO, Q K V, or a bundle
    with or without do), or `random`'s Q, K, V; without a dO, a seeded one."""
    from osm_cli.studies.inputs import parse_shape, random_qkv, seeded_do

    _random(files, random, "Q K V (DO)")
    made: list[str] = []
    if random is not None:
        q, k, v = random_qkv(parse_shape(random), seed)
        given = {"q": q, "k": k, "v": v}
        made.append(f"Q, K, V: standard normal, shape {q.shape}, seed {seed} (`random`)")
    elif len(files) == 3:
        given = dict(zip("qkv", load_qkv(files, raw_as), strict=True))
    else:
        try:
            given = load_backward(files, raw_as)
        except InputError as e:
            if len(files) != 1 or "has no array 'do'" not in str(e):
                raise
            given = dict(zip("qkv", load_qkv(files, raw_as), strict=True))
    if "do" not in given:
        given["do"] = seeded_do(given["q"], given["v"], seed)
        made.append(f"dO: none given, so a seeded standard-normal one (seed {seed}; `seed` "
                    "picks another, or give DO as a file)")
    for name, path in (("out", o), ("lse", lse)):
        if path is not None:
            given[name] = load_array(Path(path), raw_as=raw_as)
            check_real(given[name], path)
    return given, made


__all__ = ["backward_source", "qkv_source"]
