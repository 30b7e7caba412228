"""Every module under src/numa_pin reads in one sitting: at most 450 lines.

DEVELOPERS.md states the rule and names the data modules it exempts; the exemptions are read
from that paragraph, so the document and the check cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "numa_pin"
LIMIT = 450


def rule_paragraph(text: str) -> str:
    """The conventions bullet that states the module-size rule, up to the next bullet."""
    match = re.search(r"^\* Modules read in one sitting:.*?(?=^\*|^#|\Z)", text, re.M | re.S)
    assert match, "DEVELOPERS.md no longer states the module-size rule"
    return match.group(0)


RULE = rule_paragraph((ROOT / "DEVELOPERS.md").read_text())
EXEMPT = frozenset(re.findall(r"`([\w/]+\.py)`", RULE))


def too_long(package: Path, limit: int, exempt: frozenset[str]) -> dict[str, int]:
    """``{relative path: lines}`` of the modules under ``package`` over ``limit`` lines."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > limit and rel not in exempt:
            out[rel] = lines
    return out


def test_the_rule_is_read():
    assert f"{LIMIT} lines" in RULE
    assert EXEMPT == {"testing/shapes.py"}
    assert all((PACKAGE / rel).is_file() for rel in EXEMPT), EXEMPT


@pytest.mark.parametrize(
    ("lines", "exempt", "flagged"),
    [
        pytest.param(LIMIT, frozenset(), False, id="at-the-limit"),
        pytest.param(LIMIT + 1, frozenset(), True, id="one-over"),
        pytest.param(LIMIT + 1, frozenset({"big.py"}), False, id="exempt-data-module"),
    ],
)
def test_the_check_flags_a_long_module(tmp_path, lines, exempt, flagged):
    (tmp_path / "big.py").write_text("x = 1\n" * lines)
    assert (too_long(tmp_path, LIMIT, exempt) == {"big.py": lines}) is flagged


def test_no_module_is_over_the_limit():
    over = too_long(PACKAGE, LIMIT, EXEMPT)
    assert not over, f"split these along a seam (DEVELOPERS.md, Conventions): {over}"
