"""Every relative link in the README and the guides points at a file that exists, and every anchor at a heading.

A fast, dependency-free check (no mkdocs): ``make docs`` runs ``mkdocs build --strict`` for the site, and
this keeps the same links right as GitHub renders them. Anchors follow GitHub's slugs (lower case, marks
other than ``-`` and ``_`` dropped, each space a hyphen); ``mkdocs.yml`` configures the same slugs.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']|\{\s*#([\w-]+)\s*\}""")


def _prose(text: str) -> str:
    """The page without fenced code blocks (links and headings inside them are not real)."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor of ``page``: heading slugs (GitHub numbers repeats ``-1``, ``-2``) and explicit ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    prose = _prose(page.read_text(encoding="utf-8"))
    for match in _HEADING.finditer(prose):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    for match in _EXPLICIT_ID.finditer(prose):
        found.add(match.group(1) or match.group(2))
    return frozenset(found)


def links(page: Path) -> list[str]:
    """The targets of ``page``'s markdown links, outside code."""
    prose = _INLINE_CODE.sub("", _prose(page.read_text(encoding="utf-8")))
    return [m.group(1) for m in _LINK.finditer(prose)]


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None or target.startswith("//")


def problems(page: Path, root: Path = ROOT) -> list[str]:
    """Why each relative link of ``page`` does not resolve (empty when all do); links may not leave ``root``."""
    out = []
    for target in links(page):
        if _is_external(target):
            continue
        path_part, _, fragment = target.partition("#")
        destination = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not destination.is_relative_to(root):
            out.append(f"{target}: leaves the repository")
        elif not destination.exists():
            out.append(f"{target}: no file {destination.relative_to(root)}")
        elif fragment and destination.suffix == ".md" and unquote(fragment) not in anchors(destination):
            out.append(f"{target}: no heading #{fragment} in {destination.relative_to(root)}")
    return out


def test_the_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    for required in ("README.md", "CHANGELOG.md", "docs/usage.md", "docs/demo.md", "docs/redis.md"):
        assert required in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert problems(page) == []


def test_the_checker_catches_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Saturation or failure?\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#saturation-or-failure) [ok](#local-heading) [web](https://example.org/x)\n"
        "[missing](nope.md) [bad anchor](other.md#saturation) `[in code](nope2.md)`\n"
        "```\n[in a block](nope3.md)\n```\n## Local heading\n",
        encoding="utf-8",
    )
    found = problems(page, root=tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("nope.md") and found[1].startswith("other.md#saturation")


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        (
            "5. Health checks: liveness, readiness and why saturation fails neither",
            "5-health-checks-liveness-readiness-and-why-saturation-fails-neither",
        ),
        ("Gauges under `PROMETHEUS_MULTIPROC_DIR`", "gauges-under-prometheus_multiproc_dir"),
        ("`ratelimiters` — `get_rate_limiter(name, key=None)`", "ratelimiters--get_rate_limitername-keynone"),
        ("Redis backend with decorators", "redis-backend-with-decorators"),
    ],
)
def test_slugs_follow_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected
