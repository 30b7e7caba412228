"""Move a network device (an SR-IOV VF) into a container's netns, and bring it back.

The move is one ``RTM_NEWLINK`` carrying both ``IFLA_NET_NS_FD`` (an *int* fd of
``<proc_root>/<pid>/ns/net``; a string would be looked up in ``/var/run/netns`` and can
even create a netns) and ``IFLA_IFNAME``, as runc does for ``linux.netDevices``: the
device never appears under its container name in the host, nor under its host name in
a container where that name is taken. The kernel changes the netns first and renames
second, though, so when ``new_name`` is already taken in the container the device ends
up there under its host name and the request fails; :func:`move_netdev_to_netns` then
moves it straight back and says so in the error.

Before anything changes, :func:`move_netdev_to_netns` records what restoring needs in a
:class:`NetdevRecord` (:mod:`numa_pin.enforcer.netdev_record`; a JSON object in the ledger):
the BDF, the PF and VF index, the host name, MAC, MTU, up state, and the PF-side VF config
(admin MAC, VLAN, spoofchk, trust, link state) read from the PF's ``IFLA_VFINFO_LIST``
(:mod:`numa_pin.enforcer.vfsettings`, which also sets and restores it; the pyroute2 plumbing is
:mod:`numa_pin.enforcer.netlink`).

:func:`restore_netdev` works like sriov-cni's DEL: PF-side VF config first (some
drivers refuse netdev changes while trust is off), then the device is found (in the
container netns by name, or, once that netns is gone and the kernel has moved a physical
device back under its container name, by BDF in ``<sysfs_root>/bus/pci/devices/<bdf>/net``),
brought down, renamed to its host name as it moves back, and given its MAC and MTU
again.

pyroute2 is imported inside the functions that use it, never at module import (the
hook path must stay fast).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping

from numa_pin.enforcer import netdev_record as rec
from numa_pin.enforcer import netlink as nl
from numa_pin.enforcer import vfsettings as vfs
from numa_pin.enforcer.netdev_record import NetdevRecord
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

_IFF_UP = 0x1


# ---- move ----------------------------------------------------------------------------
def move_netdev_to_netns(
    ifname_or_bdf: str,
    pid: int | str,
    new_name: str,
    sysfs_root: str | os.PathLike[str],
    proc_root: str | os.PathLike[str],
    *,
    bring_up: bool = False,
    undo: UndoLog | None = None,
    vf_settings: Mapping[str, Any] | None = None,
    journal: Callable[[NetdevRecord], NetdevRecord] | None = None,
) -> NetdevRecord:
    """Move a host netdev (by name or VF BDF) into the netns of ``pid`` as ``new_name``.

    ``vf_settings`` (``numa-pin.io/vf-config``, :mod:`numa_pin.requests.vfconfig`) are set on
    the VF's PF first, once its PF-side state is saved, as sriov-cni does (a ``mac`` on the VF's
    netdev too); every failure after that puts the saved state back before it is raised.
    ``journal`` is given the record of a VF before anything changes, and returns the record to
    go on with: it keeps the saved state durably, so a crash at any later instant leaves it to
    put back (:mod:`numa_pin.resources.node.vfjournal`).

    Returns the record :func:`restore_netdev` needs; when ``undo`` is given, the restore
    is recorded there. With ``bring_up`` the device is set up inside the netns (if that
    fails it is moved back before the error is raised).

    Raises EnforcementError naming the device and netns when the device does not exist,
    the netns cannot be opened (the process is gone), the kernel refuses the move
    (``new_name`` taken in the container, a device that cannot change netns), or
    ``vf_settings`` cannot be set (not a VF, the PF does not report what they change, the driver
    refuses one).
    """
    rec.validate_ifname(new_name)
    host_name, bdf = rec.resolve_netdev(ifname_or_bdf, sysfs_root)
    pf, pf_name, vf_index = rec.sriov_identity(bdf, sysfs_root) if bdf else (None, None, None)
    ns_path = os.path.join(os.fspath(proc_root), str(pid), "ns", "net")
    nl_error = nl.netlink_error()
    with nl.iproute() as ipr:
        index = nl.lookup(ipr, host_name)
        if index is None:
            raise EnforcementError(f"no network interface {host_name!r} in this netns")
        try:
            link = nl.link(ipr, index)
        except nl_error as exc:
            raise EnforcementError(f"cannot read {host_name}: {nl.reason(exc)}") from exc
        vf_config: rec.VfConfig | None = None
        if pf_name is not None and vf_index is not None:
            try:
                vf_config = vfs.read_vf_config(ipr, pf_name, vf_index)
            except (nl_error, KeyError, AttributeError, TypeError, ValueError):
                # no snapshot: a restore skips the PF-side step (and VF settings, which
                # need one to be put back, are refused before anything is written)
                vf_config = None
        record = NetdevRecord(
            host_name=host_name,
            container_name=new_name,
            netns=ns_path,
            bdf=bdf,
            pf=pf,
            pf_name=pf_name,
            vf_index=vf_index,
            mac=link.get_attr("IFLA_ADDRESS"),
            mtu=link.get_attr("IFLA_MTU"),
            was_up=bool(link["flags"] & _IFF_UP),
            ifindex=index,
            vf_config=vf_config,
            vf_settings=tuple(k for k in rec.VF_SETTING_KEYS if k in (vf_settings or {})),
        )
        if journal is not None and record.pf_name is not None:
            record = journal(record)  # durable before the PF changes
        if vf_settings:
            vfs.apply_vf_settings(ipr, record, index, vf_settings)
        try:
            fd = nl.open_netns(ns_path)
        except EnforcementError as exc:
            raise EnforcementError(f"{exc}; {vfs.undo_vf_settings(ipr, record)}", path=ns_path) from exc
        try:
            ipr.link("set", index=index, net_ns_fd=fd, ifname=new_name)
        except nl_error as exc:
            reason = nl.reason(exc)
            if getattr(exc, "code", None) == errno.EEXIST:
                reason += f" (is {new_name} already taken in the container netns?)"
            outcome = _recover_failed_move(record, ipr, proc_root) + vfs.undo_vf_settings(ipr, record, "; ")
            raise EnforcementError(
                f"moving {host_name} into the netns of pid {pid} as {new_name} failed: "
                f"{reason}; {outcome}", path=ns_path) from exc
        finally:
            os.close(fd)
    if bring_up:
        try:
            with nl.iproute(ns_path) as ns:
                moved = nl.lookup(ns, new_name)
                if moved is None:
                    raise EnforcementError(f"{new_name} vanished from the container netns",
                                           path=ns_path)
                ns.link("set", index=moved, state="up")
        except (EnforcementError, nl_error) as exc:
            try:
                restore_netdev(record, pid, sysfs_root, proc_root)
                outcome = "moved back to the host"
            except EnforcementError as undo_exc:
                outcome = f"moving it back failed too: {undo_exc}"
            raise EnforcementError(f"bringing {new_name} up in the netns of pid {pid} "
                                   f"failed: {nl.reason(exc)}; {outcome}",
                                   path=ns_path) from exc
    if undo is not None:
        def back() -> None:
            restore_netdev(record, pid, sysfs_root, proc_root)

        undo.record(f"netdev {host_name} moved into {ns_path} as {new_name}", back)
    return record


def _recover_failed_move(record: NetdevRecord, ipr: Any, proc_root: str | os.PathLike[str]) -> str:
    """After a refused move: bring the device home if the kernel moved it anyway.

    The kernel changes the netns first and renames afterwards; when ``new_name`` is
    taken in the container, the move has happened under the host name and only the
    rename failed. Returns a phrase for the error message.
    """
    if nl.lookup(ipr, record.host_name) is not None:
        return "the device stayed in the host netns"
    nl_error = nl.netlink_error()
    host_ns = os.path.join(os.fspath(proc_root), "self", "ns", "net")
    try:
        with nl.iproute(record.netns) as ns:
            index = nl.lookup(ns, record.host_name)
            if index is None:
                return f"{record.host_name} is in neither netns"
            fd = nl.open_netns(host_ns)
            try:
                ns.link("set", index=index, net_ns_fd=fd)
            finally:
                os.close(fd)
    except (EnforcementError, nl_error) as exc:
        return f"moving it back to the host failed too: {nl.reason(exc)}"
    return "it was moved back to the host netns"


# ---- restore -------------------------------------------------------------------------
def restore_netdev(
    record: NetdevRecord,
    pid: int | str | None,
    sysfs_root: str | os.PathLike[str],
    proc_root: str | os.PathLike[str],
    *,
    host_netns: str | None = None,
) -> str:
    """Give a moved netdev back to the host; return its host-side name.

    ``pid`` is the container process whose netns may still hold the device, or None
    when it is gone. ``host_netns`` is the netns file to move it to (default: the
    caller's, ``<proc_root>/self/ns/net``; the hook runs in the host netns). Idempotent:
    a device already home under its host name only gets MAC/MTU/up state restored.

    Raises EnforcementError when the device is found nowhere, or listing what failed
    (PF-side VF config, rename, MAC, MTU) after trying every step.
    """
    nl_error = nl.netlink_error()
    errors: list[str] = []
    host_ns = host_netns or os.path.join(os.fspath(proc_root), "self", "ns", "net")
    with nl.iproute() as ipr:
        request = record.restore_request
        if request is not None and record.pf_name:
            try:
                pf_index = nl.lookup(ipr, record.pf_name)
                if pf_index is None:
                    errors.append(f"PF {record.pf_name} not found; VF config not restored")
                else:
                    ipr.link("set", index=pf_index, vf=request)
            except nl_error as exc:
                errors.append(f"restoring VF {record.vf_index} config on {record.pf_name}: "
                              f"{nl.reason(exc)}")
        index: int | None = None
        if pid is not None:
            index = _pull_from_container(record, pid, proc_root, host_ns, ipr, errors)
        if index is None:
            index = _find_at_home(record, sysfs_root, ipr)
        if index is None:
            raise EnforcementError(
                f"cannot find network interface {record.host_name} (container name "
                f"{record.container_name}, PCI {record.bdf or 'none'}) to restore"
                + (f"; {'; '.join(errors)}" if errors else ""), path=record.netns)
        _restore_host_side(record, index, ipr, errors, nl_error)
    if errors:
        raise EnforcementError(f"restoring {record.host_name}: {'; '.join(errors)}")
    return record.host_name


def _pull_from_container(record: NetdevRecord, pid: int | str, proc_root: str | os.PathLike[str],
                         host_ns: str, ipr: Any, errors: list[str]) -> int | None:
    """Move the device from the container netns home, renamed; its host index, or None
    when the netns or the device is not there."""
    ns_path = os.path.join(os.fspath(proc_root), str(pid), "ns", "net")
    try:
        os.close(nl.open_netns(ns_path))
    except EnforcementError:
        return None  # the netns is gone; a physical device is already home
    nl_error = nl.netlink_error()
    with nl.iproute(ns_path) as ns:
        index = nl.lookup(ns, record.container_name)
        if index is None:
            return None
        try:
            link = nl.link(ns, index)
            parent = link.get_attr("IFLA_PARENT_DEV_NAME")
            if record.bdf and parent and parent.lower() != record.bdf:
                errors.append(f"{record.container_name} in {ns_path} belongs to PCI {parent}, "
                              f"not {record.bdf}; left alone")
                return None
            ns.link("set", index=index, state="down")
            fd = nl.open_netns(host_ns)
            try:
                ns.link("set", index=index, net_ns_fd=fd, ifname=record.host_name)
            finally:
                os.close(fd)
        except nl_error as exc:
            # the kernel moves first and renames second: a taken host name leaves the
            # device home under its container name, which the host side renames again
            arrived = nl.lookup(ipr, record.container_name)
            if arrived is not None:
                return arrived
            raise EnforcementError(
                f"moving {record.container_name} back to the host as {record.host_name} "
                f"failed: {nl.reason(exc)}", path=ns_path) from exc
    return nl.lookup(ipr, record.host_name)


def _find_at_home(record: NetdevRecord, sysfs_root: str | os.PathLike[str], ipr: Any) -> int | None:
    """The device's index in the host netns: by BDF, then container name, then host name."""
    names: list[str] = []
    if record.bdf:
        names.extend(rec.netdevs_of(record.bdf, sysfs_root))
    names.extend([record.container_name, record.host_name])
    for name in names:
        index = nl.lookup(ipr, name)
        if index is not None:
            if record.bdf is None and name == record.container_name and name != record.host_name:
                # a virtual device with the container name in the host: only trust it when
                # the host name is free, the state a dead netns leaves behind
                if nl.lookup(ipr, record.host_name) is not None:
                    continue
            return index
    return None


def _restore_host_side(record: NetdevRecord, index: int, ipr: Any, errors: list[str],
                       nl_error: type[Exception]) -> None:
    try:
        link = nl.link(ipr, index)
    except nl_error as exc:
        errors.append(f"reading interface {index}: {nl.reason(exc)}")
        return
    steps: list[tuple[str, dict[str, Any]]] = []
    if link.get_attr("IFLA_IFNAME") != record.host_name:
        steps.append(("bring down", {"state": "down"}))
        steps.append((f"rename to {record.host_name}", {"ifname": record.host_name}))
    if record.mtu is not None and link.get_attr("IFLA_MTU") != record.mtu:
        steps.append((f"set MTU {record.mtu}", {"mtu": record.mtu}))
    current_mac = (link.get_attr("IFLA_ADDRESS") or "").lower()
    if record.mac is not None and current_mac != record.mac.lower():
        steps.append((f"set MAC {record.mac}", {"address": record.mac}))
    if record.was_up:
        steps.append(("bring up", {"state": "up"}))
    for what, args in steps:
        try:
            ipr.link("set", index=index, **args)
        except nl_error as exc:
            errors.append(f"{what}: {nl.reason(exc)}")


__all__ = [
    "NetdevRecord",
    "move_netdev_to_netns",
    "restore_netdev",
]
