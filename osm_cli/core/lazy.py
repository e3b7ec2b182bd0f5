"""Names a package offers, imported on first use (PEP 562): `lazy(package, api)` gives the
package's `__getattr__` and `__all__` for a table {module: names}, so that `import osm_cli`
or one of its namespaces loads no numpy until a name is asked for.

Leaves out: which names each package offers (its own `_API` table).

Example: __getattr__, __all__ = lazy(__name__, {"fold": ("online_softmax",)})
"""

from __future__ import annotations

from importlib import import_module


def lazy(package: str, api: dict[str, tuple[str, ...]]):
    """(__getattr__, __all__) for `package`, each name found in its module (relative to the
    package) when first asked for, then kept in the package's namespace."""
    where = {name: module for module, names in api.items() for name in names}

    def getattr_(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{where[name]}", package), name)
        setattr(import_module(package), name, value)  # found once
        return value

    return getattr_, list(where)


__all__ = ["lazy"]
