"""README.md and docs/ link only to files and headings inside the repository, and cite nothing outside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# What a page may not cite: the design folder beside the repository, its sections, tracker issues.
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|\bspec/|\bissues? #?\d+|\bsection \d+", re.I)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_links_resolve_inside_the_repository(page):
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        assert "://" not in target and not target.startswith("mailto:"), f"{target}: link outside the repository"
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        assert linked.is_relative_to(ROOT), f"{target}: leaves the repository"
        assert linked.exists(), f"{target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{target}: no heading with that anchor in {linked.name}"


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_pages_cite_nothing_outside_the_repository(page):
    found = OUTSIDE.findall(page.read_text())
    assert not found, f"{_ids(page)} cites {found}: say it in the page's own words"


def test_every_docs_page_is_reachable_from_the_readme():
    linked = set()
    queue = [ROOT / "README.md"]
    while queue:
        page = queue.pop()
        if page in linked:
            continue
        linked.add(page)
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            path = (page.parent / target.partition("#")[0]).resolve()
            if path.suffix == ".md" and path.is_relative_to(ROOT / "docs"):
                queue.append(path)
    orphans = [_ids(p) for p in PAGES if p not in linked]
    assert not orphans, f"pages no link leads to: {orphans}"
