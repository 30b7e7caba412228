"""Writing files, directories and relative symlinks below one tree (the kit's only I/O)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path


class TreeFiles:
    """Creates entries of a sysfs/proc tree; parent directories are made on demand.

    ``nul_after(path)`` true makes a text file that ends with a newline end with
    ``"\\n\\0"`` instead, as some kernels print. Raises :class:`OSError` for write failures
    and :class:`FileExistsError` when a link already exists.
    """

    def __init__(self, nul_after: Callable[[Path], bool] | None = None) -> None:
        self._made: set[Path] = set()
        self._nul_after = nul_after

    def mkdir(self, path: Path) -> None:
        """``path`` and its parents (each made once)."""
        if path not in self._made:
            path.mkdir(parents=True, exist_ok=True)
            self._made.update((path, *path.parents))

    def write(self, path: Path, text: str | bytes) -> None:
        """``path`` holding exactly ``text`` (UTF-8) or the given bytes, mode 0644."""
        self.mkdir(path.parent)
        if isinstance(text, str):
            if self._nul_after is not None and text.endswith("\n") and self._nul_after(path):
                text += "\0"
            data = text.encode()
        else:
            data = text
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def attributes(self, directory: Path, values: Mapping[str, object]) -> None:
        """One sysfs attribute file per entry of ``values`` in ``directory``: the value and a newline."""
        for name, value in values.items():
            self.write(directory / name, f"{value}\n")

    def link(self, link: Path, target: Path) -> None:
        """``link`` as a relative symlink to ``target`` (both absolute paths)."""
        self.mkdir(link.parent)
        os.symlink(os.path.relpath(target, link.parent), link)


__all__ = ["TreeFiles"]
