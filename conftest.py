"""Collection rules for the doctests of osm_cli/ (pyproject's testpaths): the compiled
tensor-core kernel's module imports numba, an optional speed-up, so where numba is missing it is
left out instead of failing to import (precision/mma.py then runs its numpy path)."""

import importlib.util

NUMBA = importlib.util.find_spec("numba") is not None
collect_ignore_glob = [] if NUMBA else ["osm_cli/precision/_mma_numba.py"]
