"""``one_line``: nothing that moves the cursor, ends a line or reorders text survives (pure).

The oracle is :mod:`unicodedata`: after escaping, no character of category Cc (controls),
Zl/Zp (line and paragraph separators) or a bidirectional embedding/override/isolate/mark is
left, the text without those characters is unchanged, and escaping twice changes nothing.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base import text
from numa_pin.base.text import is_one_line, one_line

BIDI = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}
MARKS = {"LEFT-TO-RIGHT MARK", "RIGHT-TO-LEFT MARK", "ARABIC LETTER MARK"}


def unsafe(char: str) -> bool:
    return (
        unicodedata.category(char) in ("Cc", "Zl", "Zp")
        or unicodedata.bidirectional(char) in BIDI
        or unicodedata.name(char, "") in MARKS
    )


@given(st.text())
def test_nothing_unsafe_is_left_and_safe_text_is_unchanged(text):
    out = one_line(text)
    assert not any(unsafe(c) for c in out)
    assert one_line(out) == out
    assert is_one_line(out)
    assert is_one_line(text) == (out == text)
    if not any(unsafe(c) for c in text):
        assert out == text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ctr-1", "ctr-1"),
        ("a\nnuma-pin: admitted forged", "a\\nnuma-pin: admitted forged"),
        ("\x1b[2J\x07", "\\x1b[2J\\x07"),
        ("tab\there\r", "tab\\there\\r"),
        ("\x7f\x85\x9b", "\\x7f\\x85\\x9b"),
        ("line\u2028sep\u2029", "line\\u2028sep\\u2029"),
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),
        ("path\\with\\backslash", "path\\with\\backslash"),
        ("caf\u00e9 \u4e2d", "caf\u00e9 \u4e2d"),
    ],
    ids=["plain", "newline", "escape-bell", "tab-cr", "del-c1", "separators", "bidi-override", "backslash",
         "printable-unicode"],
)
def test_examples(text, expected):
    assert one_line(text) == expected


def test_every_unsafe_code_point_is_escaped():
    """Exhaustive over the BMP: the escape table and the unicodedata oracle agree."""
    for code in range(0x10000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        assert (one_line(char) != char) == unsafe(char), hex(code)


@pytest.mark.parametrize(
    "value, limit, kept, note",
    [("short", 10, "'short'", ""), ("x" * 50, 10, "'xxxxxxxxxx'", "... [50 characters]"),
     (["a" * 50], 10, "['aaaaaaaaa", " more characters]"), (7, 10, "7", "")],
    ids=["short-string", "long-string", "long-list", "int"],
)
def test_quote_cuts_long_values(value, limit, kept, note):
    quoted = text.quote(value, limit)
    assert quoted.startswith(kept) and quoted.endswith(note or kept)
    assert len(quoted) <= limit + 2 + len(f"... [{len(repr(value))} more characters]")


def test_cut_keeps_short_text_and_says_what_it_left_out():
    assert text.cut("abc", 3) == "abc"
    assert text.cut("abcdef", 3) == "abc... [3 more characters]"
