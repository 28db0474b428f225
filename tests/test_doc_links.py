"""Every link between the README and docs/ that names a heading (`FILE.md#anchor`, `#anchor`)
lands on one: docs/CI.md linked to FORMAT.md's golden section under the heading of its format
version 1 after the heading said version 2, a link that opened the top of the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^()\s]*?)#([^()\s]+)\)")


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation but hyphens and
    underscores dropped, spaces made hyphens, a repeated one numbered."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        numbered, n = slug, 0
        while numbered in found:
            n += 1
            numbered = f"{slug}-{n}"
        found.add(numbered)
    return found


def _links() -> list[tuple[str, Path, str]]:
    links = []
    for page in PAGES:
        for target, anchor in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            landing = page if not target else (page.parent / target).resolve()
            links.append((f"{page.relative_to(ROOT)} -> {target}#{anchor}", landing, anchor))
    return links


def test_the_pages_link_to_headings():
    assert len(_links()) >= 5  # the check reads links at all


@pytest.mark.parametrize(
    ("label", "landing", "anchor"), [pytest.param(*link, id=link[0]) for link in _links()]
)
def test_a_link_to_a_heading_lands_on_one(label, landing, anchor):
    assert landing.is_file(), label
    assert anchor in slugs(landing), f"{label}: no such heading in {landing.name}"
