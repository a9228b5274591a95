"""Every relative link of README.md and docs/ (pages, figures, headings) leads somewhere: the pages were
split and moved, and a reader following a link must not land on nothing."""

from __future__ import annotations

import re

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md",
         ROOT / "experiments" / "README.md"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def broken_links() -> list[str]:
    bad = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in _LINK.findall(text):
            if re.match(r"\w+://|mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return bad


def test_every_relative_link_resolves():
    assert broken_links() == []


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [gone](missing.md) [no heading](#nowhere)\n")
    monkeypatch.setattr("tests.docs.test_links.PAGES", [page])
    monkeypatch.setattr("tests.docs.test_links.ROOT", tmp_path)
    assert broken_links() == ["page.md: missing.md (no such file)", "page.md: #nowhere (no such heading)"]
