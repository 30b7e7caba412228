"""Reading files someone else wrote: only regular files, never blocking, bounded in size and depth.

Every document numa-pin parses (the OCI ``config.json``, the config file, the topology cache,
the ledger) may have been replaced by something hostile or broken:

* a FIFO or a device blocks ``open(2)`` or ``read(2)`` forever. :func:`read_regular_file`
  opens with ``O_NONBLOCK`` (so opening a FIFO returns at once), checks ``S_ISREG`` with
  ``fstat`` before reading a byte, and reads at most ``limit + 1`` bytes;
* a symlink planted in a directory others can write redirects the open. ``follow=False``
  adds ``O_NOFOLLOW`` (``ELOOP`` for a symlink as the last component);
* deeply nested JSON makes the decoder raise :class:`RecursionError` and a tree walker
  exhaust the stack. :func:`json_loads_bounded` turns both into :class:`UnsafeInput` and
  refuses documents nested deeper than ``max_depth``.

Nothing here knows which file it reads: :class:`UnsafeInput` (a ``ValueError``) and
:class:`OSError` reach the caller, which wraps them in its own error naming the file.
"""

from __future__ import annotations

import json
import os
import stat

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

#: how deep a JSON document may nest (a real OCI config.json nests about 6 levels)
DEFAULT_MAX_DEPTH = 64

_CHUNK = 1 << 16


class UnsafeInput(ValueError):
    """The file is not a regular file, is too large, or its content is nested too deeply."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], *, follow: bool = True) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only without blocking and make sure it is a regular file.

    Returns the descriptor (close-on-exec, blocking again) and its ``fstat``.

    Raises:
        UnsafeInput: ``path`` is a FIFO, device, socket or directory.
        OSError: it cannot be opened (``ELOOP`` for a symlink when ``follow`` is False).
    """
    flags = os.O_RDONLY | os.O_NOCTTY
    if not follow:
        flags |= os.O_NOFOLLOW
    return open_checked(path, flags, _regular)


def _regular(fd: int) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        raise UnsafeInput(kind if kind.startswith("not ") else f"{kind}, not a regular file")
    return st


def open_checked(path: str | os.PathLike[str], flags: int, check: Callable[[int], T],
                 mode: int = 0o777) -> tuple[int, T]:
    """``os.open(path, flags | O_NONBLOCK | O_CLOEXEC, mode)``, then ``check(fd)``, which raises
    to refuse the file, then the descriptor made blocking again: ``(fd, what check returned)``.

    ``O_NONBLOCK`` makes opening a FIFO return at once, so ``check`` sees what was opened before
    anything waits on it. The descriptor is closed when anything after the open fails.
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        checked = check(fd)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, checked


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd`` until end of file.

    Raises:
        UnsafeInput: there are more than ``limit`` bytes.
        OSError: from ``read(2)``.
    """
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, min(_CHUNK, limit + 1 - size)):
        size += len(chunk)
        if size > limit:
            raise UnsafeInput(f"larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def read_regular_file(path: str | os.PathLike[str], limit: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises:
        UnsafeInput: not a regular file, or larger than ``limit`` bytes.
        OSError: the file cannot be opened or read.
    """
    fd, _ = open_regular(path, follow=follow)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def json_depth_exceeds(doc: Any, max_depth: int) -> bool:
    """True when ``doc`` nests lists and objects more than ``max_depth`` levels (iterative)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def json_loads_bounded(text: str | bytes, max_depth: int = DEFAULT_MAX_DEPTH, **kwargs: Any) -> Any:
    """:func:`json.loads` that refuses documents nested deeper than ``max_depth``.

    ``kwargs`` go to :func:`json.loads` (``parse_constant``, ...).

    Raises:
        UnsafeInput: nested too deeply (including deep enough to exhaust the decoder's stack).
        ValueError: not JSON (:class:`json.JSONDecodeError`), or not UTF-8.
    """
    try:
        doc = json.loads(text, **kwargs)
    except RecursionError:
        raise UnsafeInput(f"nested more than {max_depth} levels deep") from None
    if json_depth_exceeds(doc, max_depth):
        raise UnsafeInput(f"nested more than {max_depth} levels deep")
    return doc


__all__ = [
    "DEFAULT_MAX_DEPTH",
    "UnsafeInput",
    "json_depth_exceeds",
    "json_loads_bounded",
    "open_regular",
    "read_fd",
    "read_regular_file",
]
