"""The README's and docs/'s links work in a clone of the repository and nowhere else.

A relative link must stay inside the repository (a clone has nothing beside it, so a link to
``../shared/...`` is dead for every user) and name a file that exists; a ``#fragment`` must name a
heading of its target (GitHub's anchors: lowercase, punctuation dropped, spaces as hyphens).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _links(page: Path) -> list[str]:
    """Link targets of ``page`` outside code blocks and inline code."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:, ...


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_stay_in_the_repository_and_resolve(page: Path) -> None:
    broken = []
    for target in filter(_relative, _links(page)):
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    assert broken == []


def test_the_pages_have_links_to_check() -> None:
    assert (ROOT / "docs" / "spec.md") in PAGES
    readme = _links(ROOT / "README.md")
    assert "docs/spec.md" in readme and "docs/performance.md" in readme
