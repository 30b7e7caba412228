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
:class:`NetdevRecord` (JSON-able, for the ledger): the BDF, the PF and VF index, the host
name, MAC, MTU, up state, and the PF-side VF config (admin MAC, VLAN, spoofchk, trust,
link state) read from the PF's ``IFLA_VFINFO_LIST``.

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
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from numa_pin import pciaddr
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from numa_pin.record import asdict, record

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

IFNAMSIZ = 16
_VIRTFN_RE = re.compile(r"^virtfn(\d+)$")
_IFF_UP = 0x1
_UNSUPPORTED = 0xFFFFFFFF  # what drivers report for a VF setting they do not implement


@record
class VfConfig:
    """PF-side state of one VF (``ip link show <pf>`` ``vf N`` line); None = not reported."""

    mac: str | None = None
    vlan: int | None = None
    qos: int | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: int | None = None

    def request(self, vf_index: int) -> dict[str, Any]:
        """The ``vf=`` argument of pyroute2 ``link('set', ...)`` that restores this state."""
        req: dict[str, Any] = {"vf": vf_index}
        if self.mac is not None:
            req["mac"] = self.mac
        if self.vlan is not None:
            req["vlan"] = {"vlan": self.vlan, "qos": self.qos or 0}
        if self.spoofchk is not None:
            req["spoofchk"] = int(self.spoofchk)
        if self.trust is not None:
            req["trust"] = int(self.trust)
        if self.link_state is not None:
            req["link_state"] = self.link_state
        return req


@record
class NetdevRecord:
    """Everything needed to give a moved netdev back. ``bdf`` is None for virtual devices."""

    host_name: str
    container_name: str
    netns: str  # the netns path it was moved into
    bdf: str | None = None
    pf: str | None = None  # PF BDF when the device is a VF
    pf_name: str | None = None  # PF netdev name in the host netns
    vf_index: int | None = None
    mac: str | None = None  # the netdev's own (effective) MAC before the move
    mtu: int | None = None
    was_up: bool = False
    ifindex: int | None = None
    vf_config: VfConfig | None = None  # PF-side config of the VF before the move

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (for the ledger)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetdevRecord:
        """Inverse of :meth:`to_dict`; raises EnforcementError for a malformed record."""
        try:
            fields = dict(data)
            vf = fields.pop("vf_config", None)
            return cls(**fields, vf_config=VfConfig(**vf) if vf is not None else None)
        except TypeError as exc:
            raise EnforcementError(f"malformed netdev record: {exc}") from exc


# ---- names and sysfs -----------------------------------------------------------------
def is_bdf(text: str) -> bool:
    """True for a PCI address in sysfs form (``0000:3b:02.1``)."""
    return pciaddr.is_address(text)


def validate_ifname(name: str) -> str:
    """Return ``name`` if the kernel accepts it as an interface name, else raise
    EnforcementError saying why."""
    if not name or len(name.encode()) >= IFNAMSIZ:
        raise EnforcementError(f"interface name {name!r} must be 1-{IFNAMSIZ - 1} bytes")
    if name in (".", "..") or any(c in name for c in "/: \t\n"):
        raise EnforcementError(f"interface name {name!r} is not valid")
    return name


def _pci_dir(sysfs_root: str | os.PathLike[str], bdf: str) -> str:
    return os.path.join(os.fspath(sysfs_root), "bus", "pci", "devices", bdf.lower())


def netdevs_of(bdf: str, sysfs_root: str | os.PathLike[str]) -> list[str]:
    """Names of the netdevs PCI function ``bdf`` has in *this* netns (sorted)."""
    net = os.path.join(_pci_dir(sysfs_root, bdf), "net")
    try:
        return sorted(os.listdir(net))
    except OSError:
        return []


def resolve_netdev(
    ifname_or_bdf: str, sysfs_root: str | os.PathLike[str]
) -> tuple[str, str | None]:
    """``(ifname, bdf)`` for an interface name or a PCI address.

    Raises EnforcementError when a BDF does not exist or has no netdev here (a VF bound
    to vfio-pci gets no netdev and cannot be moved), or has several.
    """
    if is_bdf(ifname_or_bdf):
        bdf = pciaddr.normalise(ifname_or_bdf)
        pci = _pci_dir(sysfs_root, bdf)
        if not os.path.isdir(pci):
            raise EnforcementError(f"no PCI device {bdf}", path=pci)
        names = netdevs_of(bdf, sysfs_root)
        if not names:
            raise EnforcementError(
                f"PCI device {bdf} has no network interface in this netns (bound to a "
                f"userspace driver such as vfio-pci, or already moved)",
                path=os.path.join(pci, "net"))
        if len(names) > 1:
            raise EnforcementError(
                f"PCI device {bdf} has several network interfaces ({', '.join(names)}); "
                f"name one", path=os.path.join(pci, "net"))
        return names[0], bdf
    name = validate_ifname(ifname_or_bdf)
    link = os.path.join(os.fspath(sysfs_root), "class", "net", name, "device")
    try:
        target = os.path.basename(os.readlink(link))
    except OSError:
        return name, None
    return name, pciaddr.normalise(target) if is_bdf(target) else None


def sriov_identity(
    bdf: str, sysfs_root: str | os.PathLike[str]
) -> tuple[str | None, str | None, int | None]:
    """``(pf_bdf, pf_ifname, vf_index)`` of a VF; all None for anything else."""
    pci = _pci_dir(sysfs_root, bdf)
    try:
        pf = os.path.basename(os.readlink(os.path.join(pci, "physfn"))).lower()
    except OSError:
        return None, None, None
    pf_dir = _pci_dir(sysfs_root, pf)
    vf_index: int | None = None
    try:
        entries = os.listdir(pf_dir)
    except OSError:
        entries = []
    for entry in entries:
        m = _VIRTFN_RE.match(entry)
        if not m:
            continue
        try:
            target = os.path.basename(os.readlink(os.path.join(pf_dir, entry))).lower()
        except OSError:
            continue
        if target == bdf.lower():
            vf_index = int(m.group(1))
            break
    pf_names = netdevs_of(pf, sysfs_root)
    return pf, (pf_names[0] if pf_names else None), vf_index


def vf_config_from_dicts(entries: list[dict[str, Any]], vf_index: int) -> VfConfig | None:
    """The :class:`VfConfig` of ``vf_index`` from flattened VF info entries (pure).

    Each entry is a dict with ``vf`` and any of ``mac``, ``vlan``, ``qos``, ``spoofchk``,
    ``trust``, ``link_state``; values of ``0xffffffff`` mean "not supported".
    """
    for entry in entries:
        if entry.get("vf") != vf_index:
            continue

        def value(key: str, entry: dict[str, Any] = entry) -> Any:
            v = entry.get(key)
            return None if v == _UNSUPPORTED else v

        spoof, trust = value("spoofchk"), value("trust")
        return VfConfig(
            mac=value("mac"),
            vlan=value("vlan"),
            qos=value("qos"),
            spoofchk=None if spoof is None else bool(spoof),
            trust=None if trust is None else bool(trust),
            link_state=value("link_state"),
        )
    return None


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
                         ("IFLA_VF_LINK_STATE", "link_state")):
            attr = info.get_attr(nla)
            if attr is None:
                continue
            flat["vf"] = attr["vf"]
            flat[key] = attr[key]
            if key == "vlan":
                flat["qos"] = attr["qos"]
        entries.append(flat)
    return vf_config_from_dicts(entries, vf_index)


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
) -> NetdevRecord:
    """Move a host netdev (by name or VF BDF) into the netns of ``pid`` as ``new_name``.

    Returns the record :func:`restore_netdev` needs; when ``undo`` is given, the restore
    is recorded there. With ``bring_up`` the device is set up inside the netns (if that
    fails it is moved back before the error is raised).

    Raises EnforcementError naming the device and netns when the device does not exist,
    the netns cannot be opened (the process is gone), or the kernel refuses the move
    (``new_name`` taken in the container, a device that cannot change netns).
    """
    validate_ifname(new_name)
    host_name, bdf = resolve_netdev(ifname_or_bdf, sysfs_root)
    pf, pf_name, vf_index = sriov_identity(bdf, sysfs_root) if bdf else (None, None, None)
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
        )
        fd = _open_netns(ns_path)
        try:
            ipr.link("set", index=index, net_ns_fd=fd, ifname=new_name)
        except nl_error as exc:
            reason = _reason(exc)
            if getattr(exc, "code", None) == errno.EEXIST:
                reason += f" (is {new_name} already taken in the container netns?)"
            outcome = _recover_failed_move(record, ipr, proc_root)
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
        if record.vf_config is not None and record.pf_name and record.vf_index is not None:
            try:
                pf_index = _lookup(ipr, record.pf_name)
                if pf_index is None:
                    errors.append(f"PF {record.pf_name} not found; VF config not restored")
                else:
                    ipr.link("set", index=pf_index, vf=record.vf_config.request(record.vf_index))
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
        names.extend(netdevs_of(record.bdf, sysfs_root))
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
    "is_bdf",
    "move_netdev_to_netns",
    "netdevs_of",
    "resolve_netdev",
    "restore_netdev",
    "sriov_identity",
    "validate_ifname",
    "vf_config_from_dicts",
]
