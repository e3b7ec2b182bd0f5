"""--svg FILE and --html FILE (issue 13, item 6): what trace, attention and backward print, exported
through rich's recording console, written with the command's other files all or none, and the
one-line `exports` decorator any command (the backward pass's) takes them from. The three
commands' --html is their interactive page (tests/present/test_page.py), with the printed screen
at its foot; a command that offers no page gets rich's own HTML copy of the screen."""

from __future__ import annotations

import errno
import os
import re

import typer
from typer.testing import CliRunner

from conftest import osm
from osm_cli.cli.common import exports, guarded, out
from osm_cli.io.save import TEMP_TAG

ATTENTION = ["attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
             "--block-q", "4", "--block-k", "2"]


def _svg_text(svg: str) -> str:
    """The characters of an SVG rich exported (one <text> per run of a line; &#160; spaces)."""
    runs = re.findall(r"<text[^>]*>(.*?)</text>", svg)
    return " ".join(r.replace("&#160;", " ") for r in runs)


def test_trace_exports_what_it_prints(tmp_path):
    svg, html = tmp_path / "t.svg", tmp_path / "t.html"
    plain = osm("trace", "samples/scores.txt", "-b", "2")
    r = osm("trace", "samples/scores.txt", "-b", "2", "--svg", str(svg),
            "--html", str(html))
    assert r.exit_code == 0, r.output
    assert r.stdout == plain.stdout  # the screen is unchanged, shown once the files are written
    assert r.stderr == f"wrote {html} (interactive page, HTML)\nwrote {svg} (the screen, SVG)\n"
    text = svg.read_text(encoding="utf-8")
    assert text.startswith("<svg") and "osm trace" in _svg_text(text)  # its title
    assert "1.1353353 → 1.5530018" in _svg_text(text)
    page = html.read_text(encoding="utf-8")
    screen = page[page.index('<pre class="screen"'):page.index("</pre>")]  # what was printed
    assert "1.1353353 → 1.5530018" in screen and "online vs one-shot stabilized" in screen


def test_attention_exports_with_its_other_files(tmp_path):
    paths = {n: tmp_path / n for n in ("o.npy", "tiles.csv", "a.svg", "a.html")}
    r = osm(*ATTENTION, "--out", str(paths["o.npy"]), "--csv",
            str(paths["tiles.csv"]), "--svg", str(paths["a.svg"]), "--html",
            str(paths["a.html"]))
    assert r.exit_code == 0, r.output
    assert all(p.exists() for p in paths.values())
    assert "‖O‖" in paths["a.html"].read_text(encoding="utf-8")
    assert "2.088986" in _svg_text(paths["a.svg"].read_text(encoding="utf-8"))
    assert sorted(os.listdir(tmp_path)) == sorted(paths)  # no temporaries


def test_backward_exports_with_its_gradients(tmp_path):
    """osm backward took the export with its one line: the traces and the dQ it writes."""
    r = osm("backward", "samples/q.npy", "samples/k.npy", "samples/v.npy",
            "samples/do.npy", "--causal", "--dq", str(tmp_path / "dq.npy"),
            "--svg", str(tmp_path / "b.svg"))
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path)) == ["b.svg", "dq.npy"]
    assert "dQ_i over the K/V tiles" in _svg_text((tmp_path / "b.svg").read_text())


def test_export_refuses_json_and_step(tmp_path):
    for flag in ("--json", "--step"):
        r = osm("trace", "samples/scores.txt", flag, "--svg",
                str(tmp_path / "t.svg"))
        assert r.exit_code == 1 and r.stdout == ""
        assert r.stderr == (f"Error: --svg and --html export the printed screen; {flag} does "
                            "not combine with them\n")
    assert os.listdir(tmp_path) == []


def test_export_is_all_or_none_with_the_other_files(tmp_path, monkeypatch):
    """The SVG's rename fails: the CSV written before it is taken back, nothing is shown."""
    real = os.replace

    def flaky(src, dst, *args, **kw):
        if str(dst).endswith(".svg") and TEMP_TAG in os.path.basename(src):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, *args, **kw)

    monkeypatch.setattr(os, "replace", flaky)
    r = osm(*ATTENTION, "--csv", str(tmp_path / "t.csv"), "--svg",
            str(tmp_path / "t.svg"))
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("Error: ") and "cannot be replaced" in r.stderr
    assert os.listdir(tmp_path) == []


def test_export_checks_its_destinations_first(tmp_path):
    r = osm(*ATTENTION, "--svg", str(tmp_path / "no" / "a.svg"))
    assert r.exit_code == 1 and r.stdout == ""
    where = tmp_path / "no"
    assert r.stderr == f"Error: {where / 'a.svg'}: folder {where} does not exist\n"


def test_one_line_gives_a_command_the_export(tmp_path):
    """What `osm backward` does: @exports under @guarded, and it has --svg and --html."""
    demo = typer.Typer()

    @demo.command()
    @guarded
    @exports
    def show(n: int = 3, as_json: bool = typer.Option(False, "--json")):
        """Print a line."""
        out.print(f"n = {n}")

    help_text = CliRunner().invoke(demo, ["--help"]).stdout
    assert "--svg" in help_text and "--html" in help_text
    r = CliRunner().invoke(demo, ["--n", "7", "--html", str(tmp_path / "s.html")])
    assert r.exit_code == 0, r.output
    assert r.stdout == "n = 7\n" and "n = 7" in (tmp_path / "s.html").read_text()
