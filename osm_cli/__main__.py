"""python -m osm_cli: the same as the `osm` command."""

from .cli import app

if __name__ == "__main__":  # not when imported (the docs' API reference inspects every module)
    app(prog_name="osm")
