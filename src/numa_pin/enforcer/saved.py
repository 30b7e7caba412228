"""The original values of node settings numa-pin changed for its grants (``isolation.json``).

An isolation knob writes settings that outlive any one undo log: a CPU's resume latency, a
cpufreq policy's governor, a container's CFS quota, a host cgroup's cpuset. Before the first
write to a setting its original value goes into this file, durably; while any live grant wants
the setting it stays changed, and when the last one goes (a release, a rollback, a reconcile
after a crash) the original is written back and the entry dropped. So the file is the shared
settings' reference count's other half: the count is the grants in the ledger that want the
setting (computed, never stored), the file holds what to put back when it reaches zero.

Every call happens under the ledger's lock (an admission, a release or a reconcile), so the
file has one writer at a time. It lives in the state directory beside the ledger; entries are
``{path: {"knob": name, "value": original, "boot": boot id, ...}}``, bounded in number and size.
An entry of an earlier boot (:func:`of_earlier_boot`) counts as absent: the first change of
this boot saves this boot's value over it (:meth:`Saved.original`), and one no grant of this
boot changed is forgotten, never written back: that boot's settings went with it, and the new
boot's own may differ. So after a crash and a reboot the last release of this boot puts back
what this boot had, not nothing.
"""

from __future__ import annotations

import os

from numa_pin.base import safefs
from numa_pin.base.boundedio import UnsafeInput, json_loads_bounded, read_regular_file
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

FILE = "isolation.json"
#: at most this many saved settings (a 4096-CPU node with every knob stays far below it)
MAX_ENTRIES = 65536
MAX_BYTES = 16 << 20


def of_earlier_boot(entry: dict[str, Any], boot_id: str | None) -> bool:
    """Whether ``entry`` was saved in another boot than ``boot_id`` (both known)."""
    saved = entry.get("boot")
    return isinstance(saved, str) and boot_id is not None and saved != boot_id


class Saved:
    """The saved originals under ``state_dir``. Every call reads the file again: several knobs
    (and their undo steps) change it in one transaction, and none may write back a stale copy."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, FILE)

    def entries(self) -> dict[str, dict[str, Any]]:
        """``{path: entry}``; a missing file is none. Raises EnforcementError for a damaged file."""
        try:
            raw = read_regular_file(self.path, MAX_BYTES)
        except FileNotFoundError:
            return {}
        except (OSError, UnsafeInput) as exc:
            raise EnforcementError(f"cannot read the saved node settings: {exc}", path=self.path) from exc
        try:
            doc = json_loads_bounded(raw, 4)
        except ValueError as exc:
            raise EnforcementError(f"the saved node settings are damaged: {exc}", path=self.path) from exc
        if not isinstance(doc, dict) or not all(isinstance(v, dict) and isinstance(v.get("knob"), str)
                                               for v in doc.values()):
            raise EnforcementError("the saved node settings are damaged: not {path: {knob, value}}",
                                   path=self.path)
        return doc

    def of_knob(self, knob: str) -> dict[str, dict[str, Any]]:
        return {path: e for path, e in self.entries().items() if e.get("knob") == knob}

    def get(self, path: str) -> dict[str, Any] | None:
        return self.entries().get(path)

    def original(self, path: str, boot_id: str | None) -> dict[str, Any] | None:
        """The entry of ``path`` saved in boot ``boot_id``; None when there is none, or only one of
        an earlier boot (this boot's value is then to be saved over it before the first change)."""
        entry = self.get(path)
        return None if entry is None or of_earlier_boot(entry, boot_id) else entry

    def _store(self, entries: dict[str, dict[str, Any]]) -> None:
        if len(entries) > MAX_ENTRIES:
            raise EnforcementError(f"more than {MAX_ENTRIES} saved node settings", path=self.path)
        import json  # only where a setting is saved or restored

        payload = json.dumps(entries, sort_keys=True, indent=1).encode()
        try:
            safefs.ensure_dir(self.state_dir)
            safefs.replace_private(self.state_dir, self.path, payload, durable=True)
        except OSError as exc:
            raise EnforcementError(f"cannot save the original node settings: {exc}", path=self.path) from exc

    def save(self, path: str, entry: dict[str, Any], undo: UndoLog) -> None:
        """Record ``entry`` (the original of ``path``) before it is changed; undone by dropping it.
        The undo is recorded first: a store that fails after its rename (the directory's fsync)
        left the entry in the file, and a rollback drops it too."""
        entries = {**self.entries(), path: entry}
        undo.record(f"saved original of {path}", lambda: self._drop(path))
        self._store(entries)

    def forget(self, path: str, undo: UndoLog) -> None:
        """Drop the entry of ``path`` (its original is back); undone by saving it again (recorded
        first, as in :meth:`save`)."""
        entry = self.entries().get(path)
        if entry is None:
            return
        undo.record(f"forgot original of {path}", lambda: self._store({**self.entries(), path: entry}))
        self._drop(path)

    def _drop(self, path: str) -> None:
        entries = dict(self.entries())
        if entries.pop(path, None) is not None:
            self._store(entries)


__all__ = ["FILE", "Saved", "of_earlier_boot"]
