"""mkdocs hook: pages that are files from elsewhere in the repository, with their links rebased.

``docs/index.md`` is the README, ``docs/benchmarks.md`` is ``benchmarks/README.md`` and ``docs/changelog.md``
is ``CHANGELOG.md``: each holds one ``--8<-- "path"`` line (path from the repository root). The file is
inlined here rather than by a Markdown extension so that its relative links, written for GitHub from the
file's own folder, can be rewritten for the site: ``docs/usage.md`` in the README becomes ``usage.md``, and
a link to another inlined file points at its page. A link to anything the site does not have is left as it
is, so ``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

_INCLUDE = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.M)
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
_EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//|#)", re.I)


def _pages(docs_dir: Path) -> dict[str, str]:
    """Repository path of each inlined file -> the site page that shows it."""
    out = {}
    for page in docs_dir.glob("*.md"):
        match = _INCLUDE.search(page.read_text(encoding="utf-8"))
        if match:
            out[match.group(1)] = page.name
    return out


def _rebase(text: str, source: str, pages: dict[str, str]) -> str:
    """Rewrite the relative links of ``source`` (a repository path) as seen from the docs folder."""
    folder = posixpath.dirname(source)

    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if _EXTERNAL.match(target):
            return match.group(0)
        path = posixpath.normpath(posixpath.join(folder, target))
        if path in pages:
            new = pages[path]
        elif path.startswith("docs/"):
            new = path[len("docs/") :]
        else:
            return match.group(0)
        return f"{match.group(1)}{new}{match.group(3) or ''}{match.group(4)}"

    return _LINK.sub(fix, text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace an include line with the file it names, its links rebased."""
    match = _INCLUDE.search(markdown)
    if match is None:
        return markdown
    docs_dir = Path(config["docs_dir"])
    root = docs_dir.parent
    source = match.group(1)
    text = (root / source).read_text(encoding="utf-8")
    return markdown[: match.start()] + _rebase(text, source, _pages(docs_dir)) + markdown[match.end() :]
