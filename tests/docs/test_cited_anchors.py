"""The project's own documents: every anchor of docs/numerics.md that code, tests, benchmarks and
the README cite exists, so a reader can follow each citation."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_cited_anchor_exists():
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', (ROOT / "docs/numerics.md").read_text()))
    cited = {}
    files = [*ROOT.glob("osm_cli/**/*.py"), *ROOT.glob("tests/**/*.py"),
             *ROOT.glob("benchmarks/*.py"), ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
    for path in files:
        text = path.read_text()
        for anchor in re.findall(r"numerics\.md#([a-z0-9-]+)", text):
            cited.setdefault(anchor, path.relative_to(ROOT))
        # "#a, #b" after a first citation cites more anchors of the same page
        for run in re.findall(r"numerics\.md#[a-z0-9-]+((?:, #[a-z0-9-]+)+)", text):
            for anchor in re.findall(r"#([a-z0-9-]+)", run):
                cited.setdefault(anchor, path.relative_to(ROOT))
    missing = {a: str(p) for a, p in cited.items() if a not in anchors}
    assert not missing, missing
    assert {"backward", "backward-precision", "grad-rule"} <= anchors
