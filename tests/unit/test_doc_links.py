"""README.md and docs/*.md: every relative link resolves, the README stays short, and it links every
docs page. A link is `[text](target)` outside fenced code blocks and code spans; a target with a
scheme (http, https, mailto) is not checked. A `#fragment` must be the anchor of a heading in the
target file, made as GitHub makes it: lowercase, punctuation dropped except `-` and `_`, spaces
to hyphens, and `-1`, `-2` ... on repeats."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
SKIPPED_SCHEMES = ("http://", "https://", "mailto:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        found = FENCE.match(line)
        if fence is None:
            if found:
                fence = found.group(1)
                continue
            out.append((number, line))
        elif _closes(found, fence, line):
            fence = None
    return out


def _closes(found: re.Match[str] | None, fence: str, line: str) -> bool:
    """A closing fence: the opening's character, at least as long, and no info string."""
    marks = found.group(1) if found else ""
    return marks[:1] == fence[0] and len(marks) >= len(fence) and not line.strip().strip(fence[0])


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and `_`, as GitHub does
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of a markdown file produce."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if not heading:
            continue
        slug = _slug(heading.group(2) or "")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str, str]]:
    """(line number, text, target) of every markdown link outside code."""
    out = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for found in LINK.finditer(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)):
            out.append((number, found.group(1), found.group(2)))
    return out


def _name(path: Path) -> str:
    """A path as the failure message shows it: relative to the checkout where it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def problems(page: Path) -> list[str]:
    """One line per broken link of a page: the file, the line, the link and what is wrong."""
    out = []
    for number, text, target in links(page):
        where = f"{_name(page)}:{number}: [{text}]({target})"
        if target.startswith(SKIPPED_SCHEMES):
            continue
        if not target:
            out.append(f"{where}: the link has no target")
            continue
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            out.append(f"{where}: a scheme other than http(s) or mailto: use a relative path")
            continue
        file_part, _, fragment = target.partition("#")
        if file_part.startswith("/"):
            out.append(f"{where}: an absolute path; link relative to {_name(page)}")
            continue
        resolved = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not resolved.exists():
            out.append(f"{where}: no such file {_name(resolved)}")
            continue
        if fragment and resolved.suffix == ".md":
            have = anchors(resolved)
            if unquote(fragment) not in have:
                close = sorted(a for a in have if fragment.split("-")[0] in a)[:5]
                hint = f" (close: {', '.join('#' + a for a in close)})" if close else ""
                out.append(f"{where}: no heading in {_name(resolved)} makes the anchor #{fragment}{hint}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves(page: Path) -> None:
    found = problems(page)
    assert not found, "broken links:\n" + "\n".join(found)


def test_the_readme_is_short() -> None:
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, (
        f"README.md has {count} lines, over {README_MAX_LINES}: move a topic to a docs/ page"
    )


def test_the_readme_links_every_docs_page() -> None:
    linked = set()
    for _, _, target in links(README):
        file_part = target.partition("#")[0]
        if file_part and not target.startswith(SKIPPED_SCHEMES):
            linked.add((ROOT / unquote(file_part)).resolve())
    missing = [_name(page) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"README.md links no [text](docs/PAGE.md) to: {', '.join(missing)}"


#: A table cell is a phrase, not a paragraph: what more it has to say goes in prose below the table.
CELL_MAX = 160
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def long_cells(page: Path) -> list[str]:
    """`file:line: N characters` for each table cell, outside code blocks, longer than CELL_MAX."""
    found = []
    for number, line in _prose_lines(page.read_text()):
        if line.lstrip().startswith("|"):
            for cell in CELL_SPLIT.split(line.strip())[1:-1]:
                if len(cell.strip()) > CELL_MAX:
                    found.append(f"{_name(page)}:{number}: {len(cell.strip())} characters")
    return found


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_table_cells_are_phrases(page: Path) -> None:
    assert not long_cells(page), f"cells over {CELL_MAX} characters: move the detail below the table"


def test_a_paragraph_in_a_cell_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"| a | b |\n|---|---|\n| short | {'x' * 161} |\n\n```\n| {'y' * 200} |\n```\n")
    assert long_cells(page) == [f"{page}:3: 161 characters"]


def test_anchors_follow_githubs_rules(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n## Behind SGLang's gateway: rollouts that drain\n## `deploy --check`, step by step\n"
        "## Title\n## Title\n## A [link](x.md) and snake_case\n```\n## not a heading\n```\n"
    )
    assert anchors(page) == {
        "title",
        "behind-sglangs-gateway-rollouts-that-drain",
        "deploy---check-step-by-step",
        "title-1",
        "title-2",
        "a-link-and-snake_case",
    }
    page.write_text("[a](#title) `[b](x.md)`\n```\n[c](x.md)\n```\n[d](https://x.org) [e](y.md#z)\n")
    found = [(text, target) for _, text, target in links(page)]
    assert found == [("a", "#title"), ("d", "https://x.org"), ("e", "y.md#z")]
