"""Every relative link in the Markdown documentation leads somewhere.

A link ``[text](path)`` or ``[text](path#anchor)`` in README.md, CHANGELOG.md or docs/**/*.md
must name a file that exists (relative to the linking file), and its anchor, when it has one and
the file is Markdown, must be the slug of a heading in that file, as GitHub makes them:
lowercase, punctuation other than ``-`` and ``_`` dropped, spaces turned into ``-``, and
``-1``, ``-2``... appended to repeated slugs. ``#anchor`` alone points into the linking file.
Links inside code (fenced blocks, inline spans) are text, not links, and are not checked;
absolute URLs (``https:``, ``mailto:``) are not fetched.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_TAG = re.compile(r"<[^>]*>")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)=[\"']([^\"']+)[\"']", re.IGNORECASE)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files() -> list[Path]:
    """The files whose links are checked: README.md, CHANGELOG.md and docs/**/*.md."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines, fence = [], ""
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = ""
            continue
        if match:
            fence = match.group(1)
            continue
        lines.append((number, line))
    return lines


def slugify(heading: str) -> str:
    """The GitHub anchor of a heading's text, before the suffix for repeats."""
    parts = []
    # Code spans keep their text (even ``<name>``); outside them links become their text and
    # HTML tags vanish, as in the rendered heading GitHub slugs.
    for i, piece in enumerate(CODE_SPAN.split(heading)):
        if i % 3 == 1:  # the backtick run of a code span
            continue
        if i % 3 == 0:
            piece = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", piece)
            piece = HTML_TAG.sub("", piece)
        parts.append(piece)
    text = "".join(parts).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file defines: heading slugs, with -1, -2 for repeats, and
    explicit ``<a id=...>`` / ``<a name=...>`` anchors."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    previous = ""
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        result.update(HTML_ANCHOR.findall(line))
        heading = None
        atx = ATX_HEADING.match(line)
        if atx:
            heading = atx.group(2)
        elif SETEXT_UNDERLINE.match(line) and previous.strip() and "|" not in previous:
            heading = previous.strip()
        previous = "" if atx else line
        if heading is None:
            continue
        slug = slugify(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the file's prose, code spans left out."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub("", line)
        found += [(number, target) for target in INLINE_LINK.findall(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            found.append((number, definition.group(1)))
    return found


def broken_links(path: Path) -> list[str]:
    """One message per relative link of ``path`` that leads to no file or no heading."""
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: link {target!r}"
        if not destination.exists():
            problems.append(f"{where}: expected a file at {destination}, found none")
            continue
        if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(
                f"{where}: expected a heading with anchor #{anchor} in "
                f"{destination.relative_to(ROOT)}, found none; fix the link or the heading"
            )
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    problems = broken_links(path)
    assert not problems, "\n".join(problems)


def test_docs_have_links_to_check() -> None:
    """Guards the extraction itself: the guide's index links to every page of the guide."""
    targets = {target.partition("#")[0] for _, target in links(ROOT / "docs" / "guide.md")}
    pages = {f"guide/{p.name}" for p in (ROOT / "docs" / "guide").glob("*.md")}
    assert pages, "expected the guide's pages under docs/guide/"
    assert pages <= targets, f"pages the index does not link: {sorted(pages - targets)}"


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Sweeps: one computation per fingerprint", "sweeps-one-computation-per-fingerprint"),
        ("Input files: `snapstore.files()`", "input-files-snapstorefiles"),
        ("Varying-shape fields in workers: `ragged=`", "varying-shape-fields-in-workers-ragged"),
        ("Epochs: `set_epoch`", "epochs-set_epoch"),
        ("TensorFlow (tf.data)", "tensorflow-tfdata"),
        ("12.9 Resume state", "129-resume-state"),
        ("`<name>_valid` columns", "name_valid-columns"),
        ("A [linked](other.md) heading", "a-linked-heading"),
    ],
)
def test_slugify_follows_github(heading: str, slug: str) -> None:
    assert slugify(heading) == slug


def test_a_broken_link_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text(
        "# Title\n\n## Twice\n\n## Twice\n\n```\n# not a heading\n```\n"
    )
    (tmp_path / "page.md").write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#twice) [ok](other.md#twice-1) [ok](#page)\n"
        "[file](missing.md) [anchor](other.md#twice-2) [code](other.md#not-a-heading)\n"
        "`[in code](missing.md)` [web](https://example.com/x.md)\n\n"
        "```\n[in a fence](missing.md)\n```\n"
    )
    problems = broken_links(tmp_path / "page.md")
    assert len(problems) == 3, problems
    assert "'missing.md'" in problems[0] and "found none" in problems[0]
    assert "#twice-2" in problems[1]
    assert "#not-a-heading" in problems[2]
