"""Read-only access to a sysfs (or procfs) tree under an explicit root.

:class:`SysfsReader` is the only way topology discovery touches files. Every failure
(missing file, unreadable file, text that does not parse, dangling symlink) is raised as
:class:`numa_pin.errors.SysfsError` carrying the *full* path of the file involved, so the
one line a user sees says which file to look at.

Text is read the way the kernel means it, not byte for byte: surrounding whitespace and NUL
bytes are dropped (some kernels end files with ``"\\n\\0"``: ARM 5.15 on most topology
files, older x86 on ``node/online``, ``possible``, ``has_cpu``, ``has_normal_memory``).
Relative roots are fine: a path is joined to the root once.

The parsing helpers at the bottom (:func:`parse_int`, :func:`parse_meminfo`, ...) are
pure functions over text; they raise :class:`ValueError` and the reader wraps that into a
``SysfsError`` naming the file.
"""

from __future__ import annotations

import errno as errno_mod
import os
import re
import string
from collections.abc import Callable
from pathlib import Path, PurePath

from numa_pin.base import cpuset
from numa_pin.errors import SysfsError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")

#: what callers may pass as a path: relative to the reader's root, or absolute
PathArg = str | PurePath

_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")
#: what surrounds a value in a sysfs file: whitespace and, on some kernels, NUL bytes
_BLANK = string.whitespace + "\0"
_MEMINFO_RE = re.compile(r"^(?:Node\s+\d+\s+)?([A-Za-z0-9_()]+):\s+(\d+)(?:\s+kB)?$")


class SysfsReader:
    """Typed reads below ``root`` (for example ``/sys``, ``/proc`` or a test tree).

    Paths given to the methods are relative to ``root``; an absolute path (such as one
    returned by :meth:`read_link`) is used as it is. Every method raises
    :class:`~numa_pin.errors.SysfsError` naming the full path when the file is missing,
    unreadable or does not parse.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"SysfsReader({str(self.root)!r})"

    # ---- paths ---------------------------------------------------------------------
    def path(self, rel: PathArg) -> Path:
        """The full path of ``rel`` (``root / rel``; absolute paths are returned unchanged)."""
        p = PurePath(rel)
        return Path(p) if p.is_absolute() else self.root / p

    def exists(self, rel: PathArg) -> bool:
        """True when ``rel`` exists *as a directory entry*; a dangling symlink counts.

        Callers test optional files with this and then read them, so a dangling link
        is reported by :meth:`read_link` instead of being mistaken for an absent one.
        """
        return os.path.lexists(self.path(rel))

    def is_dir(self, rel: PathArg) -> bool:
        """True when ``rel`` is a directory (following symlinks)."""
        return self.path(rel).is_dir()

    def listdir(self, rel: PathArg = "") -> list[str]:
        """Sorted entry names of directory ``rel``.

        Raises SysfsError when it is missing, not a directory or unreadable.
        """
        full = self.path(rel)
        try:
            return sorted(os.listdir(full))
        except OSError as exc:
            raise _os_error(full, exc) from exc

    # ---- reads ---------------------------------------------------------------------
    def read_str(self, rel: PathArg) -> str:
        """The file's text with surrounding whitespace and NUL bytes removed.

        Raises SysfsError when missing, unreadable, a directory, or not UTF-8 text.
        """
        return _read_text(self.path(rel))

    def read_int(self, rel: PathArg, base: int = 10) -> int:
        """The file's content as one integer (``base`` 10, or 16 / 0 for ``0x`` values).

        Raises SysfsError when the file cannot be read or is not exactly one integer.
        """
        full = self.path(rel)
        return _parsed(full, lambda t: parse_int(t, base), _read_text(full))

    def read_list(self, rel: PathArg) -> frozenset[int]:
        """The file's kernel list (``"0-3,8"``); an empty file is the empty set.

        Raises SysfsError when the file cannot be read or the list does not parse.
        """
        full = self.path(rel)
        return _parsed(full, _expecting(cpuset.parse_list, "a list like '0-3,8'"), _read_text(full))

    def read_mask(self, rel: PathArg) -> frozenset[int]:
        """The file's comma-grouped hex mask (``"ff,ffffffff"``).

        Raises SysfsError when the file cannot be read or the mask does not parse.
        """
        full = self.path(rel)
        return _parsed(
            full, _expecting(cpuset.parse_mask, "a mask like 'ff,00000001'"), _read_text(full)
        )

    def read_hex_str(self, rel: PathArg) -> str:
        """A ``0x``-prefixed hex string kept as text (PCI ``vendor``, ``device``, ``class``).

        Raises SysfsError when the file cannot be read or does not hold ``0x<hex>``.
        """
        full = self.path(rel)
        text = _read_text(full)
        if not _HEX_RE.fullmatch(text):
            raise SysfsError(full, f"garbage content: expected 0x<hex>, got {_show(text)}")
        return text.lower()

    def read_link(self, rel: PathArg) -> Path:
        """Resolve symlink ``rel`` to the absolute path of its (existing) target.

        Raises SysfsError when ``rel`` is missing, is not a symlink, or dangles.
        """
        full = self.path(rel)
        try:
            os.readlink(full)
        except OSError as exc:
            if exc.errno == errno_mod.EINVAL:
                raise SysfsError(full, "not a symlink", exc.errno) from exc
            raise _os_error(full, exc) from exc
        target = Path(os.path.realpath(full))
        if not target.exists():
            raise SysfsError(full, f"dangling symlink (target {target} does not exist)")
        return target

    def read_link_name(self, rel: PathArg) -> str:
        """The basename of the resolved target of symlink ``rel`` (see :meth:`read_link`)."""
        return self.read_link(rel).name


# ---- pure parsing helpers --------------------------------------------------------------
def parse_int(text: str, base: int = 10) -> int:
    """Parse one integer; raises ValueError naming the text when it is not one."""
    stripped = text.strip()
    try:
        return int(stripped, base)
    except ValueError:
        raise ValueError(f"expected an integer, got {_show(stripped)}") from None


def parse_int_row(text: str) -> tuple[int, ...]:
    """Parse a whitespace separated row of integers (``"10 21 21"``).

    Raises ValueError when a field is not an integer or the row is empty.
    """
    fields = text.split()
    if not fields:
        raise ValueError("expected a row of integers, got an empty file")
    try:
        return tuple(int(f, 10) for f in fields)
    except ValueError:
        raise ValueError(f"expected a row of integers, got {_show(text)}") from None


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse ``/proc/meminfo`` or ``nodeN/meminfo`` into ``{"MemTotal": kB, ...}``.

    The ``Node N`` prefix of the per-node file is dropped. Raises ValueError on a line
    that is not ``[Node N] Key: value [kB]``.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        m = _MEMINFO_RE.match(line)
        if m is None:
            raise ValueError(f"unexpected meminfo line {_show(line)}")
        out[m.group(1)] = int(m.group(2))
    return out


def parse_key_values(text: str, *, strict: bool = True) -> dict[str, str]:
    """Parse ``Key: value`` lines (``/proc/driver/nvidia/gpus/*/information``).

    Keys and values are stripped; only the first colon separates them. Blank lines are
    skipped. A line without a colon raises ValueError, or is skipped when ``strict`` is
    False.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            if not strict:
                continue
            raise ValueError(f"expected 'Key: value', got {_show(line)}")
        out[key.strip()] = value.strip()
    return out


def _read_text(full: Path) -> str:
    try:
        data = full.read_bytes()
    except OSError as exc:
        raise _os_error(full, exc) from exc
    try:
        return data.decode("utf-8").strip(_BLANK)
    except UnicodeDecodeError as exc:
        raise SysfsError(full, "garbage content: not UTF-8 text") from exc


def _expecting(parse: Callable[[str], T], expected: str) -> Callable[[str], T]:
    """``parse`` whose ValueError also says what the file should have held."""

    def checked(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise ValueError(f"{exc} (expected {expected})") from exc

    return checked


def _parsed(full: Path, parse: Callable[[str], T], text: str) -> T:
    try:
        return parse(text)
    except ValueError as exc:
        raise SysfsError(full, f"garbage content: {exc}") from exc


def _os_error(full: Path, exc: OSError) -> SysfsError:
    if isinstance(exc, FileNotFoundError):
        reason = "missing"
    elif isinstance(exc, NotADirectoryError):
        reason = "not a directory (or a path component is not one)"
    elif isinstance(exc, IsADirectoryError):
        reason = "is a directory, expected a file"
    elif isinstance(exc, PermissionError):
        reason = "unreadable: permission denied"
    else:
        reason = f"unreadable: {exc.strerror or exc}"
    return SysfsError(full, reason, exc.errno)


def _show(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


__all__ = [
    "SysfsReader",
    "parse_int",
    "parse_int_row",
    "parse_key_values",
    "parse_meminfo",
]
