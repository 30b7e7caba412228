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
(admin MAC, VLAN, spoofchk, trust, link state) read from the PF's ``IFLA_VFINFO_LIST``.

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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from numa_pin.enforcer import netdev_record as rec
from numa_pin.enforcer.netdev_record import NetdevRecord, VfConfig
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

_IFF_UP = 0x1


# ---- pyroute2 plumbing ---------------------------------------------------------------
def _netlink_error() -> type[Exception]:
    from pyroute2.netlink.exceptions import NetlinkError

    return NetlinkError


def _reason(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:
        return os.strerror(code)
    return str(exc) or type(exc).__name__


@contextmanager
def _iproute(netns: str | None = None) -> Iterator[Any]:
    """An IPRoute in the current netns, or in the netns file ``netns`` (never created)."""
    from pyroute2 import IPRoute

    nl_error = _netlink_error()
    try:
        ipr = IPRoute() if netns is None else IPRoute(netns=netns, flags=0)
    except (nl_error, OSError) as exc:
        raise EnforcementError(f"cannot open a netlink socket: {_reason(exc)}",
                               path=netns) from exc
    try:
        yield ipr
    finally:
        ipr.close()


def _open_netns(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise EnforcementError(f"cannot open the network namespace: {exc.strerror or exc}",
                               path=path) from exc


def _lookup(ipr: Any, name: str) -> int | None:
    try:
        found = ipr.link_lookup(ifname=name)
    except _netlink_error() as exc:
        raise EnforcementError(f"listing network interfaces failed: {_reason(exc)}") from exc
    return found[0] if found else None


def _link(ipr: Any, index: int) -> Any:
    return ipr.link("get", index=index)[0]


def _read_vf_config(ipr: Any, pf_name: str, vf_index: int) -> VfConfig | None:
    pf_index = _lookup(ipr, pf_name)
    if pf_index is None:
        return None
    msg = ipr.link("get", index=pf_index, ext_mask=1)[0]
    vflist = msg.get_attr("IFLA_VFINFO_LIST")
    if vflist is None:
        return None
    entries: list[dict[str, Any]] = []
    for info in vflist.get_attrs("IFLA_VF_INFO"):
        flat: dict[str, Any] = {}
        for nla, key in (("IFLA_VF_MAC", "mac"), ("IFLA_VF_VLAN", "vlan"),
                         ("IFLA_VF_SPOOFCHK", "spoofchk"), ("IFLA_VF_TRUST", "trust"),
                         ("IFLA_VF_LINK_STATE", "link_state"), ("IFLA_VF_RATE", "max_tx_rate")):
            attr = info.get_attr(nla)
            if attr is None:
                continue
            flat["vf"] = attr["vf"]
            flat[key] = attr[key]
            if key == "vlan":
                flat["qos"] = attr["qos"]
            if key == "max_tx_rate":
                flat["min_tx_rate"] = attr["min_tx_rate"]
        entries.append(flat)
    return rec.vf_config_from_dicts(entries, vf_index)


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
) -> NetdevRecord:
    """Move a host netdev (by name or VF BDF) into the netns of ``pid`` as ``new_name``.

    ``vf_settings`` (``numa-pin.io/vf-config``, :mod:`numa_pin.admission.vfconfig`) are set on
    the VF's PF first, once its PF-side state is saved, as sriov-cni does (a ``mac`` on the VF's
    netdev too); every failure after that puts the saved state back before it is raised.

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
    nl_error = _netlink_error()
    with _iproute() as ipr:
        index = _lookup(ipr, host_name)
        if index is None:
            raise EnforcementError(f"no network interface {host_name!r} in this netns")
        try:
            link = _link(ipr, index)
        except nl_error as exc:
            raise EnforcementError(f"cannot read {host_name}: {_reason(exc)}") from exc
        vf_config: VfConfig | None = None
        if pf_name is not None and vf_index is not None:
            try:
                vf_config = _read_vf_config(ipr, pf_name, vf_index)
            except (nl_error, KeyError, AttributeError, TypeError, ValueError):
                # numa-pin itself never changes the PF side; without the snapshot a
                # restore only skips the PF-side step
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
        if vf_settings:
            _apply_vf_settings(ipr, record, index, vf_settings)
        try:
            fd = _open_netns(ns_path)
        except EnforcementError as exc:
            raise EnforcementError(f"{exc}; {_undo_vf_settings(ipr, record)}", path=ns_path) from exc
        try:
            ipr.link("set", index=index, net_ns_fd=fd, ifname=new_name)
        except nl_error as exc:
            reason = _reason(exc)
            if getattr(exc, "code", None) == errno.EEXIST:
                reason += f" (is {new_name} already taken in the container netns?)"
            outcome = _recover_failed_move(record, ipr, proc_root) + _undo_vf_settings(ipr, record, "; ")
            raise EnforcementError(
                f"moving {host_name} into the netns of pid {pid} as {new_name} failed: "
                f"{reason}; {outcome}", path=ns_path) from exc
        finally:
            os.close(fd)
    if bring_up:
        try:
            with _iproute(ns_path) as ns:
                moved = _lookup(ns, new_name)
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
                                   f"failed: {_reason(exc)}; {outcome}",
                                   path=ns_path) from exc
    if undo is not None:
        def back() -> None:
            restore_netdev(record, pid, sysfs_root, proc_root)

        undo.record(f"netdev {host_name} moved into {ns_path} as {new_name}", back)
    return record


def _apply_vf_settings(ipr: Any, record: NetdevRecord, index: int, settings: Mapping[str, Any]) -> None:
    """Set ``settings`` on the PF of ``record``'s VF (and a ``mac`` on the VF's netdev, which
    some drivers do not take from the PF); on failure, put the saved state back and raise."""
    what = f"VF {record.vf_index} of {record.pf_name}"
    if record.pf_name is None or record.vf_index is None:
        raise EnforcementError(f"{record.host_name} is not an SR-IOV VF with a PF here; its VF settings "
                               "(numa-pin.io/vf-config) cannot be set")
    request = rec.settings_request(settings, record.vf_config, record.vf_index)
    pf_index = _lookup(ipr, record.pf_name)
    try:
        if pf_index is None:
            raise EnforcementError(f"PF {record.pf_name} of {record.host_name} not found")
        ipr.link("set", index=pf_index, vf=request)
        if "mac" in settings:
            ipr.link("set", index=index, address=settings["mac"])
    except (_netlink_error(), EnforcementError) as exc:
        raise EnforcementError(f"setting {rec.describe_settings(settings)} on {what} ({record.host_name}) "
                               f"failed: {_reason(exc)}{_undo_vf_settings(ipr, record, '; ')}") from exc


def _undo_vf_settings(ipr: Any, record: NetdevRecord, sep: str = "") -> str:
    """Give the VF its saved PF-side state (and its netdev its MAC) back after a failed move;
    a phrase for the error message ('' when there was nothing to undo)."""
    request = record.restore_request
    if not record.vf_settings or request is None or record.pf_name is None:
        return ""
    try:
        pf_index = _lookup(ipr, record.pf_name)
        if pf_index is None:
            return f"{sep}PF {record.pf_name} not found; VF settings not restored"
        ipr.link("set", index=pf_index, vf=request)
        if "mac" in record.vf_settings and record.mac and record.ifindex is not None:
            ipr.link("set", index=record.ifindex, address=record.mac)
    except (_netlink_error(), EnforcementError) as exc:
        return f"{sep}restoring the VF settings failed too: {_reason(exc)}"
    return f"{sep}VF settings restored"


def _recover_failed_move(record: NetdevRecord, ipr: Any, proc_root: str | os.PathLike[str]) -> str:
    """After a refused move: bring the device home if the kernel moved it anyway.

    The kernel changes the netns first and renames afterwards; when ``new_name`` is
    taken in the container, the move has happened under the host name and only the
    rename failed. Returns a phrase for the error message.
    """
    if _lookup(ipr, record.host_name) is not None:
        return "the device stayed in the host netns"
    nl_error = _netlink_error()
    host_ns = os.path.join(os.fspath(proc_root), "self", "ns", "net")
    try:
        with _iproute(record.netns) as ns:
            index = _lookup(ns, record.host_name)
            if index is None:
                return f"{record.host_name} is in neither netns"
            fd = _open_netns(host_ns)
            try:
                ns.link("set", index=index, net_ns_fd=fd)
            finally:
                os.close(fd)
    except (EnforcementError, nl_error) as exc:
        return f"moving it back to the host failed too: {_reason(exc)}"
    return "it was moved back to the host netns"


def reassert_vf_settings(record: NetdevRecord, settings: Mapping[str, Any]) -> list[str]:
    """Set ``settings`` on the PF again when the VF of ``record`` no longer has them (reconcile);
    returns the fields that had drifted. Raises EnforcementError when the PF refuses."""
    if not record.vf_settings or not record.pf_name or record.vf_index is None:
        return []
    with _iproute() as ipr:
        try:
            drift = rec.drifted(settings, _read_vf_config(ipr, record.pf_name, record.vf_index))
            pf_index = _lookup(ipr, record.pf_name)
            if drift and pf_index is not None:
                ipr.link("set", index=pf_index, vf=rec.settings_request(settings, record.vf_config, record.vf_index))
        except _netlink_error() as exc:
            raise EnforcementError(f"setting {rec.describe_settings(settings)} on VF {record.vf_index} of "
                                   f"{record.pf_name} again failed: {_reason(exc)}") from exc
    return drift


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
    nl_error = _netlink_error()
    errors: list[str] = []
    host_ns = host_netns or os.path.join(os.fspath(proc_root), "self", "ns", "net")
    with _iproute() as ipr:
        request = record.restore_request
        if request is not None and record.pf_name:
            try:
                pf_index = _lookup(ipr, record.pf_name)
                if pf_index is None:
                    errors.append(f"PF {record.pf_name} not found; VF config not restored")
                else:
                    ipr.link("set", index=pf_index, vf=request)
            except nl_error as exc:
                errors.append(f"restoring VF {record.vf_index} config on {record.pf_name}: "
                              f"{_reason(exc)}")
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
        os.close(_open_netns(ns_path))
    except EnforcementError:
        return None  # the netns is gone; a physical device is already home
    nl_error = _netlink_error()
    with _iproute(ns_path) as ns:
        index = _lookup(ns, record.container_name)
        if index is None:
            return None
        try:
            link = _link(ns, index)
            parent = link.get_attr("IFLA_PARENT_DEV_NAME")
            if record.bdf and parent and parent.lower() != record.bdf:
                errors.append(f"{record.container_name} in {ns_path} belongs to PCI {parent}, "
                              f"not {record.bdf}; left alone")
                return None
            ns.link("set", index=index, state="down")
            fd = _open_netns(host_ns)
            try:
                ns.link("set", index=index, net_ns_fd=fd, ifname=record.host_name)
            finally:
                os.close(fd)
        except nl_error as exc:
            # the kernel moves first and renames second: a taken host name leaves the
            # device home under its container name, which the host side renames again
            arrived = _lookup(ipr, record.container_name)
            if arrived is not None:
                return arrived
            raise EnforcementError(
                f"moving {record.container_name} back to the host as {record.host_name} "
                f"failed: {_reason(exc)}", path=ns_path) from exc
    return _lookup(ipr, record.host_name)


def _find_at_home(record: NetdevRecord, sysfs_root: str | os.PathLike[str], ipr: Any) -> int | None:
    """The device's index in the host netns: by BDF, then container name, then host name."""
    names: list[str] = []
    if record.bdf:
        names.extend(rec.netdevs_of(record.bdf, sysfs_root))
    names.extend([record.container_name, record.host_name])
    for name in names:
        index = _lookup(ipr, name)
        if index is not None:
            if record.bdf is None and name == record.container_name and name != record.host_name:
                # a virtual device with the container name in the host: only trust it when
                # the host name is free, the state a dead netns leaves behind
                if _lookup(ipr, record.host_name) is not None:
                    continue
            return index
    return None


def _restore_host_side(record: NetdevRecord, index: int, ipr: Any, errors: list[str],
                       nl_error: type[Exception]) -> None:
    try:
        link = _link(ipr, index)
    except nl_error as exc:
        errors.append(f"reading interface {index}: {_reason(exc)}")
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
            errors.append(f"{what}: {_reason(exc)}")


__all__ = [
    "NetdevRecord",
    "VfConfig",
    "move_netdev_to_netns",
    "reassert_vf_settings",
    "restore_netdev",
]
