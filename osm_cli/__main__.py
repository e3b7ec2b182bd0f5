"""python -m osm_cli: the same as the `osm` command."""

from .cli import app

app(prog_name="osm")
