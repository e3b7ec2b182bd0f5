"""mkdocs hooks: the pages that are generated, never written by hand.

- docs/cli.md: the `<!-- osm:cli -->` marker becomes `osm --help` and every command's `--help`,
  run through typer's own runner when the site is built, at 100 columns.
- docs/api.md: the `<!-- osm:api -->` marker becomes one mkdocstrings `:::` entry for each name
  that `osm_cli` exports (its `_API` table), grouped by module, so a renamed or added name is
  documented from its docstring without touching the page.
- The nav: any docs/*.md page that mkdocs.yml does not list is added under "More", so a page a
  colleague adds is in the site (and in the strict build) at once.

This file is configuration of the site, not part of the package (it is not installed).
"""

from __future__ import annotations

import os
from pathlib import Path


def _help(args: list[str]) -> str:
    from typer.testing import CliRunner

    from osm_cli.cli import app

    os.environ["COLUMNS"] = "100"
    os.environ.pop("FORCE_COLOR", None)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100", "NO_COLOR": "1"})
    if result.exit_code != 0:
        raise RuntimeError(f"osm {' '.join(args)} exited {result.exit_code}: {result.output}")
    return result.stdout.rstrip()


def cli_reference() -> str:
    import typer

    from osm_cli.cli import app

    names = sorted(typer.main.get_command(app).commands)
    parts = ["## osm", "", "```text", "$ osm --help", _help(["--help"]), "```", ""]
    for name in names:
        parts += [f"## osm {name}", "", "```text", f"$ osm {name} --help",
                  _help([name, "--help"]), "```", ""]
    return "\n".join(parts)


def api_reference() -> str:
    import osm_cli

    by_module: dict[str, list[str]] = {}
    for name, (module, attr) in osm_cli._WHERE.items():
        if name != attr:
            continue  # an alias: documented under its own name
        by_module.setdefault(module, []).append(attr)
    parts = []
    for module in sorted(by_module):
        parts += [f"## `osm_cli.{module}`", ""]
        for attr in sorted(by_module[module], key=str.lower):
            parts += [f"::: osm_cli.{module}.{attr}", "    options:", "      heading_level: 3", ""]
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    if "<!-- osm:cli -->" in markdown:
        markdown = markdown.replace("<!-- osm:cli -->", cli_reference())
    if "<!-- osm:api -->" in markdown:
        markdown = markdown.replace("<!-- osm:api -->", api_reference())
    return markdown


def _listed(nav) -> set[str]:
    found = set()
    for item in nav or []:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            found |= _listed(value)
        elif isinstance(value, str):
            found.add(value)
    return found


def on_config(config):
    docs = Path(config["docs_dir"])
    listed = _listed(config["nav"])
    more = sorted(str(p.relative_to(docs)) for p in docs.glob("**/*.md")
                  if str(p.relative_to(docs)) not in listed and "hooks" not in p.parts)
    if more and config["nav"] is not None:
        config["nav"].append({"More": more})
    return config
