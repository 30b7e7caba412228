"""The IRQ and partition journal: what the IRQ and load-balancing knobs must put back.

Some of what those knobs change belongs to the whole node, not to one grant: an IRQ's
affinity before any grant asked to keep IRQs off its CPUs (the *baseline*), irqbalance's banned
list, the ``cpuset.cpus.exclusive`` numa-pin added to a shared ancestor cgroup. Those records
live in one small JSON file, ``<state_dir>/irq-partitions.json`` (beside, and apart from, the
saved originals of the other knobs' settings), written only under the ledger's
lock (every caller runs inside a ledger transaction) and *before* the machine is changed, so
a crash at any instant leaves a record of what to put back: ``numa-pin reconcile`` compares it
with the ledger's live grants and undoes what no grant holds any more.

Each write of the journal goes into the caller's undo log first (its previous text), so a
failed admission or commit puts the journal back with the machine. A journal of an earlier
boot is ignored: that boot's affinities and cgroups are gone.
"""

from __future__ import annotations

import json
import os

from numa_pin.base.boundedio import json_loads_bounded, read_regular_file
from numa_pin.base.safefs import ensure_dir, replace_private
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.enforcer.undo import UndoLog

FILE = "irq-partitions.json"
#: a journal larger than this is refused (a node's IRQs and partitions fit in far less)
MAX_BYTES = 4 << 20


def path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE)


def _read_text(state_dir: str) -> bytes | None:
    try:
        return read_regular_file(path(state_dir), MAX_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: not a regular file, or too large
        raise EnforcementError(f"cannot read the IRQ and partition journal: {getattr(exc, 'strerror', None) or exc}",
                               path=path(state_dir)) from exc


def read(state_dir: str, boot_id: str | None) -> dict[str, Any]:
    """The journal (``{}`` when there is none, or it is of another boot). Raises
    EnforcementError naming the file when it cannot be read or is not a JSON object."""
    raw = _read_text(state_dir)
    if raw is None:
        return {}
    try:
        doc = json_loads_bounded(raw)
    except ValueError as exc:
        raise EnforcementError(f"the IRQ and partition journal is not JSON ({exc}); remove it once nothing "
                               "is isolated", path=path(state_dir)) from exc
    if not isinstance(doc, dict):
        raise EnforcementError("the IRQ and partition journal is not a JSON object", path=path(state_dir))
    if boot_id is not None and doc.get("boot_id") not in (None, boot_id):
        return {}
    return doc


def drop_earlier_boot(state_dir: str, boot_id: str | None) -> bool:
    """Remove a journal recorded under another boot than ``boot_id`` (both known): its IRQs and
    cgroups went with that boot, so nothing in it is ever put back. True when one was removed."""
    raw = _read_text(state_dir)
    if raw is None or boot_id is None:
        return False
    try:
        doc = json_loads_bounded(raw)
    except ValueError:
        return False  # a damaged journal is for the operator (read says so), not dropped unseen
    if not isinstance(doc, dict) or doc.get("boot_id") in (None, boot_id):
        return False
    _put(state_dir, None)
    return True


def write(state_dir: str, boot_id: str | None, doc: dict[str, Any], undo: UndoLog) -> None:
    """Replace the journal with ``doc`` (removed when ``doc`` holds nothing), recording in
    ``undo`` how to put the previous one back. Raises EnforcementError naming the file."""
    before = _read_text(state_dir)
    body = {k: v for k, v in doc.items() if v and k != "boot_id"}
    target = path(state_dir)
    undo.record(f"IRQ and partition journal {target}", lambda: _put(state_dir, before))
    try:
        if not body:
            if before is not None:
                os.unlink(target)
            return
        payload = json.dumps({"boot_id": boot_id, **body}, sort_keys=True, indent=1).encode() + b"\n"
        _put(state_dir, payload)
    except OSError as exc:
        raise EnforcementError(f"cannot write the IRQ and partition journal: {exc.strerror or exc}",
                               path=target) from exc


def _put(state_dir: str, payload: bytes | None) -> None:
    target = path(state_dir)
    if payload is None:
        try:
            os.unlink(target)
        except FileNotFoundError:
            pass
        return
    ensure_dir(state_dir)
    replace_private(state_dir, target, payload, durable=True)


__all__ = ["FILE", "MAX_BYTES", "drop_earlier_boot", "path", "read", "write"]
