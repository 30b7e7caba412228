"""The PF-side state of VFs numa-pin moves with settings, journaled before the PF changes.

``numa-pin.io/vf-config`` changes a VF's VLAN, trust, spoofchk, MAC, link state and rates on its
PF, and the :class:`~numa_pin.enforcer.netdev_record.NetdevRecord` that says how to put them back
reaches the ledger only with the commit. So before the first PF write of a move the record goes
into the saved node settings (:class:`~numa_pin.enforcer.saved.Saved`, ``isolation.json``,
written durably: the journal the isolation knobs keep their originals in), one entry per VF,
``{<sysfs>/bus/pci/devices/<vf>: {"knob": "sriov-vf", "record": ..., "container": id, "boot": id}}``.
The entry goes when the VF's state is back:

* a release or a garbage collection that gives the VF back forgets it (:func:`forget`);
* a rollback puts the saved state back on the PF, then forgets it (the undo step
  :func:`journaler` records);
* after a crash at any point between the journal and the commit, or a container whose VF the
  ledger no longer records, ``numa-pin reconcile`` finds an entry whose VF no grant or pod record
  holds, puts the saved state back and brings the netdev home where it can (:func:`give_back_orphans`);
* a VF granted again while such an entry remains gets the saved state back before it is moved,
  so the next tenant never starts from the crashed one's VLAN and trust.

An entry of an earlier boot is forgotten, never written back: the VFs were made again at boot.
Every call runs under the ledger's lock (an admission, a release, a reconcile).
"""

from __future__ import annotations

import os

from numa_pin.base.record import asdict, replace
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError, NumaPinError
from numa_pin.resources.node.base import Node

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numa_pin.enforcer.netdev_record import NetdevRecord
    from numa_pin.enforcer.saved import Saved
    from numa_pin.ledger.model import LedgerState

#: the knob name of VF entries in the saved node settings
KNOB = "sriov-vf"


def _saved(node: Node) -> Saved:
    from numa_pin.enforcer.saved import Saved

    return Saved(node.config.state_dir)


def entry_path(node: Node, bdf: str) -> str:
    """The key of VF ``bdf``'s entry: its PCI device directory under the sysfs root."""
    return os.path.join(node.config.sysfs_root, "bus", "pci", "devices", bdf)


def _record(entry: dict[str, Any]) -> NetdevRecord:
    from numa_pin.enforcer.netdev_record import NetdevRecord

    data = entry.get("record")
    if not isinstance(data, dict):
        raise EnforcementError("a saved VF entry without its record")
    return NetdevRecord.from_dict(data)


def _describe(record: NetdevRecord) -> str:
    """``vf 0 of ens2f0: vlan 5, qos 1, ...``: what ``status`` shows as the saved value."""
    saved = asdict(record.vf_config) if record.vf_config is not None else {}
    shown = ", ".join(f"{k} {v}" for k, v in saved.items() if v is not None)
    return f"vf {record.vf_index} of {record.pf_name}: {shown or 'nothing saved'}"


def journaler(node: Node, container_id: str, undo: UndoLog) -> Callable[[NetdevRecord], NetdevRecord]:
    """The ``journal`` of :func:`~numa_pin.enforcer.netdev.move_netdev_to_netns` for one
    admission: called with a VF's record before anything changes, it first gives the VF the
    state an entry left by a crash saved (the record then carries that state as the one to
    restore), and for a move with settings saves the record durably, recording in ``undo`` the
    step that puts the state back and forgets it. Raises EnforcementError (nothing changed yet)
    when the journal cannot be written or the left state cannot be put back."""

    def journal(record: NetdevRecord) -> NetdevRecord:
        if record.bdf is None:
            return record
        saved, path = _saved(node), entry_path(node, record.bdf)
        left = saved.get(path)
        if left is not None:
            record = _reclaim(node, record, left)
        if not record.vf_settings:
            if left is not None:
                saved.forget(path, UndoLog())
            return record
        saved.save(path, {"knob": KNOB, "value": _describe(record), "container": container_id,
                          "boot": node.boot_id, "record": record.to_dict()}, UndoLog())
        undo.record(f"saved PF-side state of VF {record.bdf}", lambda: _settle(node, record))
        return record

    return journal


def _reclaim(node: Node, record: NetdevRecord, left: dict[str, Any]) -> NetdevRecord:
    """``record`` of a VF a crashed move (or a container whose release never ran) left with
    changed settings: the saved state is put back on the PF first, and the netdev (at home: it is
    about to move) gets its host name and MAC back; the saved state becomes the record's."""
    from numa_pin.enforcer.netdev import restore_netdev
    from numa_pin.enforcer.saved import of_earlier_boot
    from numa_pin.enforcer.vfsettings import restore_vf_config

    if of_earlier_boot(left, node.boot_id):
        return record
    former = _record(left)
    restore_vf_config(former)
    try:
        restore_netdev(former, None, node.config.sysfs_root, node.config.proc_root)
    except NumaPinError:
        pass  # the name and MAC come back with the new record's release (it carries the saved MAC)
    return replace(record, vf_config=former.vf_config, mac=former.mac or record.mac, host_name=former.host_name)


def _settle(node: Node, record: NetdevRecord) -> None:
    """A rollback: the VF's saved state back on the PF, then its entry forgotten (a failure
    keeps the entry for ``reconcile``)."""
    from numa_pin.enforcer.vfsettings import restore_vf_config

    restore_vf_config(record)
    forget(node, record.bdf)


def forget(node: Node, bdf: str | None) -> None:
    """VF ``bdf`` is home with its saved state (a release): its entry goes."""
    if bdf is not None:
        _saved(node).forget(entry_path(node, bdf), UndoLog())


def _held(state: LedgerState) -> set[str]:
    """The VFs ``state`` records as moved: by a grant, or into a pod's network namespace."""
    held = {str(e["record"].get("bdf")) for g in state.grants.values() for e in g.netdevs if "record" in e}
    return held | {vf.address for pod in state.pods.values() for vf in pod.netdevs}


def give_back_orphans(node: Node, state: LedgerState) -> tuple[list[str], list[str]]:
    """Put back the saved state of every journaled VF that ``state`` no longer records (a crash
    between the journal and the commit, a container dropped without its release), bring its
    netdev home where it is found there (one still in a namespace comes back when the namespace
    goes), and forget the entries. Returns (the containers whose VFs were given back, problems);
    an entry whose state could not be put back stays for the next ``reconcile``."""
    from numa_pin.enforcer.netdev import restore_netdev
    from numa_pin.enforcer.saved import of_earlier_boot
    from numa_pin.enforcer.vfsettings import restore_vf_config

    saved = _saved(node)
    entries = saved.of_knob(KNOB)
    if not entries:
        return [], []
    held, done, problems = _held(state), [], []
    cfg = node.config
    for path, entry in sorted(entries.items()):
        if of_earlier_boot(entry, node.boot_id):
            saved.forget(path, UndoLog())
            continue
        try:
            record = _record(entry)
            if record.bdf in held:
                continue
            restore_vf_config(record)
        except (NumaPinError, KeyError, ValueError) as exc:
            problems.append(f"VF {os.path.basename(path)}: saved PF-side state not put back: {exc}")
            continue
        try:
            restore_netdev(record, None, cfg.sysfs_root, cfg.proc_root)
        except NumaPinError:
            pass  # still in a network namespace: the kernel brings it home when that one goes
        saved.forget(path, UndoLog())
        done.append(str(entry.get("container") or os.path.basename(path)))
    return done, problems


__all__ = ["KNOB", "entry_path", "forget", "give_back_orphans", "journaler"]
