"""What moving a netdev needs to know and to keep (no pyroute2): the undo record of a move
(:class:`NetdevRecord`, with the PF-side :class:`VfConfig`), interface names, and a device's
netdevs and SR-IOV identity as sysfs shows them. :mod:`numa_pin.enforcer.netdev` moves devices
with it and re-exports all of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from numa_pin.base import pciaddr
from numa_pin.base.record import asdict, record
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

IFNAMSIZ = 16
_VIRTFN_RE = re.compile(r"^virtfn(\d+)$")
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
    min_tx_rate: int | None = None  # Mbit/s (``IFLA_VF_RATE``); 0: none
    max_tx_rate: int | None = None

    def request(self, vf_index: int, *, rates: bool = False) -> dict[str, Any]:
        """The ``vf=`` argument of pyroute2 ``link('set', ...)`` that restores this state (the
        transmit rates only with ``rates``: many drivers refuse any rate, even the zero they report)."""
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
        if rates and self.min_tx_rate is not None and self.max_tx_rate is not None:
            req["rate"] = {"min_tx_rate": self.min_tx_rate, "max_tx_rate": self.max_tx_rate}
        return req


#: VF settings (:mod:`numa_pin.requests.vfconfig` names) -> the :class:`VfConfig` field that
#: saves what each one changes
_SAVED_AS = {"vlan": "vlan", "vlanQoS": "qos", "mac": "mac", "spoofchk": "spoofchk", "trust": "trust",
             "link_state": "link_state", "min_tx_rate": "min_tx_rate", "max_tx_rate": "max_tx_rate"}


#: the settings in the order they are listed
VF_SETTING_KEYS = tuple(_SAVED_AS)


def describe_settings(settings: Mapping[str, Any]) -> str:
    """``vlan=100,trust=on``: the settings as the annotation writes them."""
    from numa_pin.requests.vfconfig import describe

    return describe(settings)


def settings_request(settings: Mapping[str, Any], saved: VfConfig | None, vf_index: int) -> dict[str, Any]:
    """The ``vf=`` argument of pyroute2 ``link('set', ...)`` that gives VF ``vf_index`` the
    requested ``settings`` (``Grant.vf_config``), ``saved`` being its PF-side state before.

    Raises EnforcementError when ``saved`` lacks what a setting changes (the driver does not
    report it, or the state could not be read): what cannot be restored is not changed.
    """
    from numa_pin.requests.vfconfig import LINK_STATES

    unknown = sorted(k for k in settings if saved is None or getattr(saved, _SAVED_AS[k]) is None)
    if unknown:
        raise EnforcementError(
            f"VF {vf_index}: the PF does not report its {', '.join(unknown)}, so numa-pin could not "
            f"restore it; not changed (numa-pin.io/vf-config)")
    assert saved is not None
    req: dict[str, Any] = {"vf": vf_index}
    if "mac" in settings:
        req["mac"] = settings["mac"]
    if "vlan" in settings:
        req["vlan"] = {"vlan": settings["vlan"], "qos": settings.get("vlanQoS", 0)}
    for key in ("spoofchk", "trust"):
        if key in settings:
            req[key] = int(settings[key])
    if "link_state" in settings:
        req["link_state"] = LINK_STATES[settings["link_state"]]
    if "min_tx_rate" in settings or "max_tx_rate" in settings:
        req["rate"] = {"min_tx_rate": settings.get("min_tx_rate", saved.min_tx_rate),
                       "max_tx_rate": settings.get("max_tx_rate", saved.max_tx_rate)}
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
    #: the ``numa-pin.io/vf-config`` settings applied on the PF after ``vf_config`` was saved
    vf_settings: tuple[str, ...] = ()

    @property
    def restore_request(self) -> dict[str, Any] | None:
        """The ``vf=`` argument that gives the VF its saved PF-side state back, or None."""
        if self.vf_config is None or self.vf_index is None:
            return None
        rates = "min_tx_rate" in self.vf_settings or "max_tx_rate" in self.vf_settings
        return self.vf_config.request(self.vf_index, rates=rates)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (for the ledger). What older versions never wrote (the saved rates,
        the settings applied) appears only when there is some, so they still read the record."""
        out = asdict(self)
        if not self.vf_settings:
            del out["vf_settings"]
        saved = out.get("vf_config")
        if saved is not None:
            for key in ("min_tx_rate", "max_tx_rate"):
                if saved[key] is None:
                    del saved[key]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetdevRecord:
        """Inverse of :meth:`to_dict`; raises EnforcementError for a malformed record."""
        try:
            fields = dict(data)
            vf = fields.pop("vf_config", None)
            applied = tuple(fields.pop("vf_settings", ()))
            return cls(**fields, vf_config=VfConfig(**vf) if vf is not None else None, vf_settings=applied)
        except TypeError as exc:
            raise EnforcementError(f"malformed netdev record: {exc}") from exc


def drifted(settings: Mapping[str, Any], current: VfConfig | None) -> list[str]:
    """The :class:`VfConfig` fields whose value ``current`` (the PF's report now) no longer
    matches what ``settings`` set; a field the PF does not report never counts."""
    from numa_pin.requests.vfconfig import LINK_STATES

    want: dict[str, Any] = {k: settings[k] for k in ("mac", "spoofchk", "trust", "min_tx_rate", "max_tx_rate")
                            if k in settings}
    if "vlan" in settings:
        want.update(vlan=settings["vlan"], qos=settings.get("vlanQoS", 0))
    if "link_state" in settings:
        want["link_state"] = LINK_STATES[settings["link_state"]]
    if current is None:
        return []
    out = []
    for key, value in want.items():
        now = getattr(current, key)
        if now is not None and (now.lower() if isinstance(now, str) else now) != value:
            out.append(key)
    return out


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
    ``trust``, ``link_state``, ``min_tx_rate``, ``max_tx_rate``; values of ``0xffffffff`` mean "not supported".
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
            min_tx_rate=value("min_tx_rate"),
            max_tx_rate=value("max_tx_rate"),
        )
    return None


__all__ = ["IFNAMSIZ", "VF_SETTING_KEYS", "NetdevRecord", "VfConfig", "describe_settings", "drifted", "is_bdf",
           "netdevs_of", "resolve_netdev", "settings_request", "sriov_identity", "validate_ifname",
           "vf_config_from_dicts"]
