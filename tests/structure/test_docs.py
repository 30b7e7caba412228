"""The README stays a front door, and every relative link of the user docs leads somewhere.

Links are read from the markdown itself (outside fenced code blocks and inline code); a link
with an anchor must name a heading of its target, slugged as GitHub slugs headings.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 300
DOCS = sorted([README, ROOT / "DEVELOPERS.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str, *, keep_code: bool = False) -> list[str]:
    """The lines of a markdown text outside fenced code blocks, inline code removed unless kept."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line if keep_code else _CODE.sub("", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.replace("`", "").strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor the headings of a markdown file give, repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(path.read_text(), keep_code=True):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def relative_links(path: Path) -> list[str]:
    """The link targets of a markdown file that point inside the repository."""
    targets: list[str] = []
    for line in prose_lines(path.read_text()):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) is None:
                targets.append(target)
    return targets


def broken(path: Path, target: str, root: Path = ROOT) -> str | None:
    """Why ``target`` (a link in ``path``) leads nowhere (or out of ``root``), or None."""
    file_part, _, anchor = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
        return f"{target}: no such file"
    if root not in dest.parents and dest != root:
        return f"{target}: outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading #{anchor} in {dest.name}"
    return None


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    block = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert block is not None, "README.md lost its first command block"
    first = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert first == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"the README's `make {target}` has no Makefile target"


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path):
    bad = [why for target in relative_links(path) if (why := broken(path, target)) is not None]
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Low latency: isolating exclusive CPUs", "low-latency-isolating-exclusive-cpus"),
        ("`numa-pin topology --json` schema", "numa-pin-topology---json-schema"),
        ("NodeResourceTopology: telling the scheduler", "noderesourcetopology-telling-the-scheduler"),
        ("Exact prefer-closest (`policy/closest.py`)", "exact-prefer-closest-policyclosestpy"),
    ],
    ids=["colon", "code-and-flag", "camel-case", "code-with-slash"],
)
def test_slug_matches_github(heading, anchor):
    assert slug(heading) == anchor


def test_a_broken_link_is_found(tmp_path):
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Here\n\n## Twice\n\n## Twice\n")
    doc.write_text("[ok](b.md#twice-1) [gone](c.md) [bad](b.md#there) `[code](x.md)`\n```\n[f](y.md)\n```\n")
    targets = relative_links(doc)
    assert targets == ["b.md#twice-1", "c.md", "b.md#there"]
    assert [broken(doc, t, tmp_path) is None for t in targets] == [True, False, False]
