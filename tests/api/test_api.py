"""The public Python API (osm_cli/__init__.py): every name in __all__ is there, is the object its
module defines, and is imported only when first used."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import osm_cli
from osm_cli import attention, check, online_softmax

ROOT = Path(__file__).resolve().parents[2]


def test_every_name_in_all_is_the_object_its_module_defines():
    assert len(osm_cli.__all__) == len(set(osm_cli.__all__))
    assert len(osm_cli.__all__) <= 14  # a small top level; the rest in namespaces
    for name in osm_cli.__all__:
        value = getattr(osm_cli, name)
        module = f"osm_cli.{osm_cli._WHERE[name][0]}"
        assert value is getattr(sys.modules[module], name), name
    assert osm_cli.attention_reference.__module__ == "osm_cli.api.forward"


def test_the_0_1_aliases_are_gone():
    """TileStep, schedule= and SCHEDULES were 0.1's names (CHANGELOG, 0.3.0)."""
    for name in ("TileStep", "SCHEDULES", "ScoreOptions", "run_flash", "sweep"):
        assert not hasattr(osm_cli, name), name
    import osm_cli.precision.kernels as k

    assert not hasattr(k, "SCHEDULES")
    assert "schedule" not in inspect.signature(k.run_flash).parameters


def test_namespaces_hold_the_rest():
    from osm_cli import core, costmodel, kernels, studies

    assert kernels.run_kernel.__module__ == "osm_cli.kernels"
    assert kernels.PRESETS["fa2"].name == "fa2"
    assert core.merge_partials is sys.modules["osm_cli.core.merge"].merge_partials
    assert core.Step is osm_cli.Step
    assert costmodel.fa1_blocks(100 * 1024, 64) == (64, 400)
    assert studies.block_order is sys.modules["osm_cli.studies.order"].block_order
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        studies.nope  # noqa: B018


def test_from_imports_and_star_import():
    """attention is the function (the algorithms live in flash/: no subpackage shadows it)."""
    assert (type(attention) is types.FunctionType
            and attention.__module__ == "osm_cli.api.forward")
    assert check is sys.modules["osm_cli.api.check"].check
    assert online_softmax is sys.modules["osm_cli.core.fold"].online_softmax
    space: dict = {}
    exec("from osm_cli import *", space)
    assert set(osm_cli.__all__) <= set(space)
    assert set(osm_cli.__all__) <= set(dir(osm_cli))


def test_unknown_names_fail_as_usual():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        osm_cli.nope  # noqa: B018
    with pytest.raises(ImportError):
        exec("from osm_cli import nope", {})


def test_names_load_on_first_use():
    """`osm` (osm_cli.cli) starts without precision/'s dtypes and ml_dtypes; asking for a name
    loads its module, and attention stays the function after the CLI imported its modules."""
    code = (
        "import sys, types, osm_cli.cli\n"
        "print('ml_dtypes' in sys.modules, 'osm_cli.precision.dtypes' in sys.modules)\n"
        "from osm_cli import attention, check\n"
        "print(type(attention) is types.FunctionType, 'ml_dtypes' in sys.modules, "
        "check.__module__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          check=True, timeout=60)
    assert proc.stdout.splitlines() == ["False False", "True True osm_cli.api.check"]


def test_help_loads_neither_numpy_nor_rich():
    """`osm --help` and every command's --help build the options from cli/ and the layers'
    names.py alone (issue 13: --help within 0.3 s; benchmarks/bench_startup.py measures it): a
    command imports numpy, rich and the layers below when it runs, in its body."""
    code = (
        "import sys\n"
        "from osm_cli.cli import app\n"
        "for args in (['--help'], *([c.name or c.callback.__name__, '--help']\n"
        "             for c in app.registered_commands)):\n"
        "    try:\n"
        "        app(args, prog_name='osm')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'rich', 'ml_dtypes'})\n"
        "sys.stderr.write(' '.join(heavy) or 'none')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert proc.stderr == "none"
    assert "Commands:" in proc.stdout and "--causal" in proc.stdout
