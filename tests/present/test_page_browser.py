"""The interactive page of `--html FILE` in a real browser (issue 21, item 7): Debian's chromium,
headless, driven by playwright with the system browser (never a browser playwright downloads).
For trace, attention and backward: the page loads from file:// with no console message and no
request but its own file, `#step=K` opens it at step K showing step K's numbers (those of the
records), the buttons and the arrow keys move it and the address follows, and the lit tile's
outline is drawn over the tile's cells.

Skipped, saying why, only where playwright or chromium is missing (.ci/run installs both).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import osm_cli
from conftest import osm
from osm_cli.reports.explain import attention_step_lines, backward_query_lines, g, trace_lines

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install '.[test]')")
expect = sync_api.expect
# Every wait is for a condition (the page showing step K, an element present), never a fixed
# sleep; on a loaded machine a condition may take long to come, so the waits are generous.
WAIT_MS = 60_000
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not "
                                "installed (apt-get install chromium)")
# headless, and nothing that reaches out: no updates, no sync, no QUIC, no first-run pages
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

TRACE = ["trace", "--values", "1,2,5,3,0,4", "-b", "2"]
ATTENTION = ["attention", "samples/causal.npz", "--causal", "--head", "1", "--query", "2",
             "--block-q", "4", "--block-k", "2"]
BACKWARD = ["backward", "samples/q.npy", "samples/k.npy", "samples/v.npy", "samples/do.npy",
            "--causal", "--block-q", "4", "--block-k", "2", "--key", "3", "--query", "5"]


def trace_lines_of_records() -> list[list[str]]:
    t = osm_cli.online_softmax(np.array([1.0, 2.0, 5.0, 3.0, 0.0, 4.0]), block=2)
    return [trace_lines(s) for s in t.steps]


def attention_lines_of_records() -> list[list[str]]:
    with np.load("samples/causal.npz") as z:
        q, k, v = z["q"], z["k"], z["v"]
    res = osm_cli.attention(q, k, v, causal=True, block_q=4, block_k=2, trace_at=(0, 1, 2))
    return [attention_step_lines(res.trace.steps, n) for n in range(len(res.trace.steps))]


def backward_lines_of_records() -> list[list[str]]:
    """The arithmetic of query 5 along each K/V tile (P, dP, D, dS = P∘(dP − D), dQ_i's
    update) and its ‖dQ_i‖ after the tile, from the query trace's records: the page's steps
    where query 5's Q tile (1) meets a K/V tile (the others are the key's)."""
    q, k, v, do = (np.load(f"samples/{n}.npy") for n in ("q", "k", "v", "do"))
    res = osm_cli.attention_backward(q, k, v, None, do, causal=True, block_q=4, block_k=2,
                                     trace_at=(0, 0, 5), trace_key=3)
    return [[*backward_query_lines(s, res.options.softmax_scale), f"‖dQ_i‖ = {g(s.dq_norm, 6)}"]
            for s in res.trace.steps]


# command, the page's steps, the records' lines per step (for backward, the page's steps
# where each query-trace record is shown)
CASES = {
    "trace": (TRACE, 3, trace_lines_of_records, [0, 1, 2]),
    "attention": (ATTENTION, 4, attention_lines_of_records, [0, 1, 2, 3]),
    "backward": (BACKWARD, 5, backward_lines_of_records, [0, 2, 3, 4]),
}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless chromium for the module, with a fresh profile of its own."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=ARGS, headless=True,
            viewport={"width": 1280, "height": 900})
        context.set_default_timeout(WAIT_MS)
        yield context
        context.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict:
    """Each command's page, made once by `osm … --html`."""
    folder = tmp_path_factory.mktemp("pages")
    made = {}
    for kind, (args, *_) in CASES.items():
        r = osm(*args, "--html", folder / f"{kind}.html")
        assert r.exit_code == 0, r.output
        made[kind] = folder / f"{kind}.html"
    return made


class Opened:
    """A page opened in the browser, with what it said (console, errors) and asked for."""

    def __init__(self, browser, path, fragment: str = ""):
        self.url = path.as_uri()
        self.problems: list[str] = []
        self.tab = browser.new_page()
        self.tab.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}"))
        self.tab.on("pageerror", lambda e: self.problems.append(f"error: {e}"))
        self.tab.on("request", lambda r: r.url.split("#")[0] != self.url
                    and self.problems.append(f"request: {r.url}"))
        self.tab.goto(self.url + fragment)
        self.tab.wait_for_selector("#where:not(:empty)")

    def where(self) -> str:
        return self.tab.inner_text("#where")

    def at(self, k: int, n: int) -> bool:
        """Waits until the page shows step k of n, with the address following (#step=k);
        fails with what it shows instead."""
        expect(self.tab.locator("#where")).to_have_text(f"step {k} of {n}", timeout=WAIT_MS)
        self.tab.wait_for_function(f"location.hash.startsWith('#step={k}')", timeout=WAIT_MS)
        return True

    def lines(self) -> list[str]:
        return self.tab.eval_on_selector_all("#lines .line", "els => els.map(e => e.textContent)")

    def state(self) -> dict[str, str]:
        rows = self.tab.eval_on_selector_all(
            "#state-table tr", "rows => rows.map(r => [r.cells[0].textContent, "
            "r.cells[1].textContent])")
        return dict(rows)

    def fragment(self) -> str:
        return self.tab.evaluate("location.hash")

    def close(self) -> list[str]:
        self.tab.close()
        return self.problems


@pytest.mark.parametrize("kind", CASES)
def test_step_k_opens_at_k_with_its_numbers(browser, pages, kind):
    _, n, records, shown = CASES[kind]
    expected = records()
    for at, record in zip(shown, expected, strict=True):
        page = Opened(browser, pages[kind], f"#step={at + 1}")
        assert page.at(at + 1, n)
        assert page.fragment() == f"#step={at + 1}"
        lines = page.lines()
        if kind == "backward":  # query 5's section: its arithmetic, then its norm after
            *arithmetic, norm = record
            start = lines.index(arithmetic[0])
            assert lines[start:start + len(arithmetic)] == arithmetic
            after = lines[start + len(arithmetic)]
            assert "‖dQ_i‖" in after and after.endswith(norm.split("= ")[-1]), lines
        else:
            assert lines == record
        assert page.close() == []


def test_trace_page_shows_the_worked_numbers(browser, pages):
    page = Opened(browser, pages["trace"], "#step=2")
    assert page.tab.inner_text("#step-title") == "block 1, keys 2:4, scores [5, 3]"
    assert page.state() == {"block max": "5", "m": "2 → 5", "α": "0.049787068",
                            "l": "1.3678794 → 1.203438"}
    assert page.lines()[1] == "α = exp(2 − 5) = 0.049787068"
    lit = page.tab.eval_on_selector_all(".group.lit .value", "els => els.map(e => e.textContent)")
    assert lit == ["5", "3"]
    assert page.tab.inner_text("#bytes li:first-child") == "read from HBM so far: 32 B"
    assert page.close() == []


@pytest.mark.parametrize("kind", CASES)
def test_buttons_and_keys_move_it(browser, pages, kind):
    n = CASES[kind][1]
    page = Opened(browser, pages[kind])
    tab = page.tab
    assert page.at(1, n) and tab.is_disabled("#back")
    tab.keyboard.press("ArrowRight")
    assert page.at(2, n) and page.fragment() == "#step=2"
    tab.click("#next")
    assert page.at(3, n) and page.fragment() == "#step=3"
    tab.keyboard.press("ArrowLeft")
    assert page.at(2, n)
    tab.click("#back")
    assert page.at(1, n) and page.fragment() == "#step=1"
    tab.keyboard.press("End")
    assert page.at(n, n) and tab.is_disabled("#next")
    tab.keyboard.press("ArrowRight")  # nothing after the last
    tab.keyboard.press("Home")  # (each key is handled before the next is sent)
    assert page.at(1, n)
    tab.keyboard.press("End")
    tab.keyboard.press("ArrowRight")
    assert page.at(n, n) and page.fragment() == f"#step={n}"
    tab.click("#first")
    assert page.at(1, n)
    tab.click("#last")
    assert page.at(n, n)
    tab.click("#first")
    assert page.at(1, n)
    tab.evaluate("location.hash = '#step=2'")  # the address, edited by hand
    tab.wait_for_function("document.body.dataset.step === '2'")
    assert page.at(2, n)
    assert page.close() == []


def test_large_type_and_the_address(browser, pages):
    page = Opened(browser, pages["attention"], "#step=2&large")
    tab = page.tab
    assert tab.evaluate("document.documentElement.classList.contains('large')")
    assert tab.get_attribute("#large", "aria-pressed") == "true"
    tab.keyboard.press("-")
    tab.wait_for_function("location.hash === '#step=2'")
    tab.click("#large")
    tab.wait_for_function("location.hash === '#step=2&large'")
    size = tab.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)")
    assert size > 20  # 26px, against 17 without
    assert page.close() == []


def test_the_outline_covers_the_lit_tile(browser, pages):
    """Tile 1 of attention's traced row: rows 0:4, keys 2:4 of the matrix, outlined."""
    page = Opened(browser, pages["attention"], "#step=2")
    tab = page.tab
    tab.wait_for_selector("#drawing .outline", state="visible")
    box = tab.locator("#drawing .outline").bounding_box()
    first = tab.locator("table.matrix tr:nth-child(2) td:nth-child(4)").bounding_box()  # (0, 2)
    last = tab.locator("table.matrix tr:nth-child(5) td:nth-child(5)").bounding_box()  # (3, 3)
    assert abs(box["x"] - first["x"]) <= 3 and abs(box["y"] - first["y"]) <= 3
    assert abs(box["x"] + box["width"] - last["x"] - last["width"]) <= 3
    assert abs(box["y"] + box["height"] - last["y"] - last["height"]) <= 3
    lit = tab.eval_on_selector_all("td.lit", "els => els.length")
    assert lit == 8  # 4 rows × 2 keys
    assert page.close() == []


def test_several_rows_side_by_side(browser, tmp_path):
    """--query 0:4: the state is a line a row (the m, l, O vectors of Q tile 0), each row's
    arithmetic under its query, the four traced rows marked in the matrix."""
    path = tmp_path / "rows.html"
    r = osm(*ATTENTION[:5], "--query", "0:4", *ATTENTION[7:], "--html", path)
    assert r.exit_code == 0, r.output
    page = Opened(browser, path, "#step=2")
    tab = page.tab
    assert page.at(2, 4)
    head = tab.eval_on_selector_all("#state-table tr:first-child th",
                                    "els => els.map(e => e.textContent)")
    assert head == ["query", "tile max", "m", "α", "l", "O[:3]", "‖O‖"]
    rows = tab.eval_on_selector_all("#state-table tr", "rows => rows.slice(1).map(r => "
                                    "Array.from(r.cells).map(c => c.textContent))")
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert rows[2][2:5] == ["1.792688", "1", "1.147522 → 1.265359"]
    titles = tab.eval_on_selector_all("#lines .section-title", "els => els.map(e => "
                                      "e.textContent)")
    assert titles == ["query 0", "query 1", "query 2", "query 3"]
    marked = tab.eval_on_selector_all("table.matrix th.traced", "els => els.map(e => "
                                      "e.textContent)")
    assert marked == ["0", "1", "2", "3"]
    tab.keyboard.press("ArrowRight")
    assert page.at(3, 4)
    assert page.lines() == ["skipped for every traced row: the mask hides these keys; m, l, O "
                            "unchanged"]
    assert page.close() == []
