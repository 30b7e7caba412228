"""Text that reaches a terminal, a log or a reason file: one line, no control characters (pure).

Container ids, pod ids, annotation values and ``PCIDEVICE_*`` values come from whoever starts a
container. Printed as they are, a newline in one forges a second ``numa-pin: admitted ...`` line
in the runtime's log or in syslog, and an escape sequence reaches the operator's terminal.
:func:`one_line` makes any text safe to print as (part of) one line: it escapes

* the C0 controls, DEL and the C1 controls (``\\n``, ``\\r``, ``\\t``, else ``\\xNN``);
* the Unicode line and paragraph separators (U+2028, U+2029) and the bidirectional
  formatting characters (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069), which can make
  a line read differently from what it says (``\\uNNNN``).

Backslashes are left alone, so escaping is idempotent (``one_line(one_line(s)) ==
one_line(s)``) and paths stay readable. :func:`quote` and :func:`cut` bound what a message
quotes and the message itself. Nothing here imports anything: the hook calls it on
every report.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_UNSAFE = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0x061C, 0x200E, 0x200F,
           *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_TABLE = {code: _escape(code) for code in _UNSAFE}


def one_line(text: object) -> str:
    """``str(text)`` with every control, line-separator and bidi character escaped (pure)."""
    return str(text).translate(_TABLE)


def is_one_line(text: str) -> bool:
    """True when :func:`one_line` would leave ``text`` unchanged (pure)."""
    return not any(ord(c) in _TABLE for c in text)


#: a value quoted in a message (an annotation, an environment variable, a name) is cut to this
#: many characters: whoever starts a container chooses them, and a 1 MB value must not become a
#: 1 MB line on stderr, in syslog or in a reason file
MAX_QUOTED = 200
#: a message line (stderr, syslog, a reason file) is cut to this many characters
MAX_LINE = 4096


def cut(text: object, limit: int = MAX_LINE) -> str:
    """``str(text)``, cut to ``limit`` characters with a note of how many were left out (pure)."""
    s = str(text)
    if len(s) <= limit:
        return s
    return f"{s[:limit]}... [{len(s) - limit} more characters]"


def quote(value: object, limit: int = MAX_QUOTED) -> str:
    """``repr(value)`` for a message, a string cut to ``limit`` characters first (pure)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... [{len(value)} characters]"
    return cut(repr(value), limit + 2)


#: the longest id or name (a container's, a pod's) and path (a cgroup's, a bundle's) numa-pin takes
#: from a runtime: kubelet's ids are 64 characters and its names at most 253; Linux's PATH_MAX
MAX_NAME, MAX_PATH = 1024, 4096
_CONTROL = frozenset(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)))


def unfit(value: str, limit: int = MAX_NAME) -> str | None:
    """Why ``value``, an id, name or path a runtime handed over, is not usable as one (a NUL or
    another control character, more than ``limit`` characters), or None when it is (pure). Such
    a value reaches file names, cgroup paths and the ledger, so it is refused where it comes in."""
    if len(value) > limit:
        return f"is {len(value)} characters long (at most {limit})"
    if not _CONTROL.isdisjoint(value):
        return "holds a control character" if "\0" not in value else "holds a NUL"
    return None


__all__ = ["MAX_LINE", "MAX_NAME", "MAX_PATH", "MAX_QUOTED", "cut", "is_one_line", "one_line", "quote", "unfit"]
