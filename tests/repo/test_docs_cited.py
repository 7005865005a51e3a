"""The repository explains itself: what the code cites is in the repository.

Docstrings and comments in ``src/`` cite the method specifications (``docs/spec/*.md``) and the design
(``docs/design.md``), often with a quoted section heading, e.g. ``docs/spec/baselines.md "Policy loss"``
or ``docs/design.md, "Engines"``. Every citation is found by regular expressions over the sources (no
list of them is kept here), and:

- every ``docs/...md`` path a source file names exists;
- every quoted section cited after ``docs/spec/X.md`` or ``docs/design.md`` (in ``src/``, ``docs/`` and
  ``README.md``) is a Markdown heading of that page: the heading itself, or the heading's first words
  (``"Metrics"`` names ``## Metrics the paper reports``);
- nothing in ``src/``, ``docs/`` or ``README.md`` points outside the repository (``../shared``, the papers'
  text files) or at a specification or design file without its ``docs/`` prefix (``spec/X.md``,
  ``DESIGN.md``, a bare ``baselines.md``).

Fast: reads text files only.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "horizonrl"
DOCS = REPO / "docs"

#: ``docs/...md`` paths in ``src/`` that name another project's documentation, not this repository's
#: (each must still be cited, so an entry cannot go stale).
FOREIGN_DOCS = {
    "docs/algo/rollout_corr.md": "verl's rollout-correction page (src/horizonrl/losses/mismatch.py)",
}

#: The method specification pages (``docs/spec/<name>.md``) besides their README.
SPEC_PAGES = ("baselines", "mosaic", "rtpo", "ccpo", "echo")

_DOC_PATH = re.compile(r"(?<![\w/.-])(docs/[A-Za-z0-9_./<>-]+?\.md)\b")
# A cited page, optionally in backticks or as a Markdown link, then one or more quoted headings (in double
# quotes, or as an RST literal) separated by commas: `docs/spec/echo.md "Loss"`, `docs/design.md, "Rows"`,
# `docs/design.md ``train/```, `` `docs/spec/rtpo.md`: "A", "B" ``,
# `[docs/spec/baselines.md](spec/baselines.md) ("Policy loss", "KL penalty")`.
_Q = r"(?:\"[^\"]{1,200}\"|``[^`]{1,200}``)"
_SECTION_CITE = re.compile(
    r"(?<![\w/.-])(docs/spec/[\w-]+\.md|docs/design\.md)`*(?:\]\([^)\s]*\))?"
    rf"[ \t]*[,:(]?[ \t]*\n?[ \t]*((?:{_Q}(?:[ \t]*,[ \t]*\n?[ \t]*(?=[\"`]))?)+)"
)
_QUOTED = re.compile(r"\"([^\"]+)\"|``([^`]+)``")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _python_sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _markdown_sources() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


@cache
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(REPO)}:{text.count(chr(10), 0, pos) + 1}"


def _norm(heading: str) -> str:
    """A heading or a cited section, compared without Markdown code marks and with single spaces."""
    return " ".join(heading.replace("`", "").split())


@cache
def _headings(page: str) -> tuple[str, ...]:
    """The Markdown headings (any level) of ``page`` (a repository path), fenced code blocks skipped."""
    text = _FENCE.sub("", _text(REPO / page))
    return tuple(_norm(h) for h in _HEADING.findall(text))


def _names_heading(section: str, headings: tuple[str, ...]) -> bool:
    """``section`` is a heading, or its first words (the next character of the heading is no letter or
    digit: ``"Algorithm"`` names ``Algorithm (RTPO Algorithm 1)``, ``"Rollout"`` not ``Rollouts``)."""
    return any(h == section or (h.startswith(section) and not h[len(section)].isalnum()) for h in headings)


def _section_citations() -> list[tuple[str, str, str]]:
    """``(where, page, section)`` for every quoted section cited after a spec or design page."""
    out = []
    for path in [*_python_sources(), *_markdown_sources()]:
        text = _text(path)
        for m in _SECTION_CITE.finditer(text):
            for q in _QUOTED.finditer(m.group(2)):
                out.append((_where(path, text, m.start()), m.group(1), _norm(q.group(1) or q.group(2))))
    return out


def test_the_citations_are_found() -> None:
    """The scans see the citations they are meant to check (a broken regex would pass everything)."""
    cites = _section_citations()
    pages = {page for _, page, _ in cites}
    assert {"docs/design.md", "docs/spec/baselines.md", "docs/spec/echo.md"} <= pages, pages
    assert len(cites) >= 20, cites
    paths = {m.group(1) for p in _python_sources() for m in _DOC_PATH.finditer(_text(p))}
    assert {"docs/design.md", "docs/spec/mosaic.md", "docs/spec/rtpo.md", "docs/spec/ccpo.md"} <= paths


def test_the_spec_and_design_pages_exist() -> None:
    for name in ("README", *SPEC_PAGES):
        assert (DOCS / "spec" / f"{name}.md").is_file(), f"docs/spec/{name}.md is missing"
    assert (DOCS / "design.md").is_file()


def _placeholder(part: str) -> bool:
    """A path segment that stands for any name: ``NAME.md``, ``<paper>``."""
    stem = part.split(".")[0]
    return "<" in part or (stem.isupper() and len(stem) > 1)


def test_every_cited_docs_page_exists() -> None:
    """Every ``docs/...md`` path in ``src/`` is a file of the repository (a placeholder segment such as
    ``docs/results/NAME.md`` needs its folder); :data:`FOREIGN_DOCS` are other projects' pages."""
    missing, seen = [], set()
    for path in _python_sources():
        text = _text(path)
        for m in _DOC_PATH.finditer(text):
            cited = m.group(1)
            seen.add(cited)
            if cited in FOREIGN_DOCS:
                continue
            parts = cited.split("/")
            if any(_placeholder(p) for p in parts):  # a template: docs/results/NAME.md
                ok = REPO.joinpath(*[p for p in parts[:-1] if not _placeholder(p)]).is_dir()
            else:
                ok = (REPO / cited).is_file()
            if not ok:
                missing.append(f"{_where(path, text, m.start())}: {cited}")
    assert not missing, "cited docs pages that do not exist:\n" + "\n".join(missing)
    stale = sorted(set(FOREIGN_DOCS) - seen)
    assert not stale, f"FOREIGN_DOCS entries no longer cited: {stale}"


def test_every_cited_section_is_a_heading() -> None:
    bad = [
        f'{where}: {page} "{section}" (headings: {list(_headings(page))})'
        for where, page, section in _section_citations()
        if not (REPO / page).is_file() or not _names_heading(section, _headings(page))
    ]
    assert not bad, "cited sections that are not headings of their page:\n" + "\n".join(bad)


# What must not appear in src/ (Python), docs/ and README.md: places outside the repository, and spec or
# design files named without their docs/ prefix.
_OUTSIDE = re.compile(r"\.\./shared|(?<![\w/.-])papers/\w+\.txt|\.\./papers/")
_DESIGN = re.compile(r"DESIGN\.md")
_SPEC = re.compile(r"(?<![\w.-])spec/")
_BARE_PAGE = re.compile(rf"(?<![\w/.-])(?:{'|'.join(SPEC_PAGES)})\.md")
_LINK_TARGET = re.compile(r"\]\(([^)\s#]+)")


def _spec_reference_ok(path: Path, text: str, pos: int) -> bool:
    """A ``spec/`` at ``pos`` is fine with its ``docs/`` prefix, or as a Markdown link target inside
    ``docs/`` that resolves to a file under ``docs/spec/`` (``[docs/spec/echo.md](spec/echo.md)``)."""
    if text[max(0, pos - 5) : pos] == "docs/":
        return True
    if path.suffix == ".md" and text[max(0, pos - 2) : pos] == "](":
        m = _LINK_TARGET.match(text, pos - 2)
        target = (path.parent / m.group(1)).resolve() if m else None
        return target is not None and target.is_file() and (DOCS / "spec") in target.parents
    return False


@pytest.mark.parametrize("kind", ["src", "docs"])
def test_nothing_points_outside_the_repository(kind: str) -> None:
    files = _python_sources() if kind == "src" else _markdown_sources()
    bad = []
    for path in files:
        text = _text(path)
        for rx, what in ((_OUTSIDE, "outside the repository"), (_DESIGN, "DESIGN.md: use docs/design.md")):
            bad += [f"{_where(path, text, m.start())}: {m.group(0)!r} ({what})" for m in rx.finditer(text)]
        for m in _SPEC.finditer(text):
            if not _spec_reference_ok(path, text, m.start()):
                bad.append(f"{_where(path, text, m.start())}: 'spec/' without 'docs/'")
        if path.suffix == ".py":  # a spec page by its bare name
            for m in _BARE_PAGE.finditer(text):
                bad.append(f"{_where(path, text, m.start())}: {m.group(0)!r} (use docs/spec/{m.group(0)})")
    assert not bad, "references to write as docs/spec/... or docs/design.md:\n" + "\n".join(bad)


def test_spec_and_design_links_resolve() -> None:
    """The relative links of the spec and design pages lead to files of the repository."""
    bad = []
    for path in [DOCS / "design.md", *sorted((DOCS / "spec").glob("*.md"))]:
        text = _text(path)
        for m in _LINK_TARGET.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not (path.parent / target).resolve().exists():
                bad.append(f"{_where(path, text, m.start())}: {target}")
    assert not bad, "broken links:\n" + "\n".join(bad)
