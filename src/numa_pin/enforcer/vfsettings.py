"""The PF side of an SR-IOV VF: read its config, set what ``numa-pin.io/vf-config`` asks, put
the saved config back, and set it again when it drifted.

A VF's admin MAC, VLAN and QoS, spoofchk, trust, link state and TX rates live on its PF
(read from the PF's ``IFLA_VFINFO_LIST``, set on the PF as ``ip link set <pf> vf <n> ...``
does), not on the VF's netdev. :mod:`numa_pin.enforcer.netdev` reads them before a move and applies the asked
settings (:mod:`numa_pin.requests.vfconfig`) as sriov-cni does; every failure after that
puts the saved state back. :func:`reassert_vf_settings` is reconcile's repair.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.enforcer import netdev_record as rec
from numa_pin.enforcer import netlink as nl
from numa_pin.enforcer.netdev_record import NetdevRecord, VfConfig
from numa_pin.errors import EnforcementError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


def read_vf_config(ipr: Any, pf_name: str, vf_index: int) -> VfConfig | None:
    """The PF-side config of VF ``vf_index`` of ``pf_name`` from the PF's ``IFLA_VFINFO_LIST``,
    or None when the PF is absent or does not report it."""
    pf_index = nl.lookup(ipr, pf_name)
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


def apply_vf_settings(ipr: Any, record: NetdevRecord, index: int, settings: Mapping[str, Any]) -> None:
    """Set ``settings`` on the PF of ``record``'s VF (and a ``mac`` on the VF's netdev, which
    some drivers do not take from the PF); on failure, put the saved state back and raise."""
    what = f"VF {record.vf_index} of {record.pf_name}"
    if record.pf_name is None or record.vf_index is None:
        raise EnforcementError(f"{record.host_name} is not an SR-IOV VF with a PF here; its VF settings "
                               "(numa-pin.io/vf-config) cannot be set")
    request = rec.settings_request(settings, record.vf_config, record.vf_index)
    pf_index = nl.lookup(ipr, record.pf_name)
    try:
        if pf_index is None:
            raise EnforcementError(f"PF {record.pf_name} of {record.host_name} not found")
        ipr.link("set", index=pf_index, vf=request)
        if "mac" in settings:
            ipr.link("set", index=index, address=settings["mac"])
    except (nl.netlink_error(), EnforcementError) as exc:
        raise EnforcementError(f"setting {rec.describe_settings(settings)} on {what} ({record.host_name}) "
                               f"failed: {nl.reason(exc)}{undo_vf_settings(ipr, record, '; ')}") from exc


def undo_vf_settings(ipr: Any, record: NetdevRecord, sep: str = "") -> str:
    """Give the VF its saved PF-side state (and its netdev its MAC) back after a failed move;
    a phrase for the error message ('' when there was nothing to undo)."""
    request = record.restore_request
    if not record.vf_settings or request is None or record.pf_name is None:
        return ""
    try:
        pf_index = nl.lookup(ipr, record.pf_name)
        if pf_index is None:
            return f"{sep}PF {record.pf_name} not found; VF settings not restored"
        ipr.link("set", index=pf_index, vf=request)
        if "mac" in record.vf_settings and record.mac and record.ifindex is not None:
            ipr.link("set", index=record.ifindex, address=record.mac)
    except (nl.netlink_error(), EnforcementError) as exc:
        return f"{sep}restoring the VF settings failed too: {nl.reason(exc)}"
    return f"{sep}VF settings restored"


def restore_vf_config(record: NetdevRecord, ipr: Any = None) -> bool:
    """Give the VF of ``record`` its saved PF-side state back (its ``restore_request`` set on the
    PF; the netdev itself is not touched): what the journal of moves with settings does after a
    crash. False when the record saves none. Raises EnforcementError naming the PF when it is gone
    or refuses."""
    request = record.restore_request
    if request is None or not record.pf_name:
        return False
    if ipr is None:
        with nl.iproute() as own:
            return restore_vf_config(record, own)
    try:
        pf_index = nl.lookup(ipr, record.pf_name)
        if pf_index is None:
            raise EnforcementError(f"PF {record.pf_name} not found; the saved state of its VF {record.vf_index} "
                                   "not restored")
        ipr.link("set", index=pf_index, vf=request)
    except nl.netlink_error() as exc:
        raise EnforcementError(f"restoring the saved state of VF {record.vf_index} on {record.pf_name} failed: "
                               f"{nl.reason(exc)}") from exc
    return True


def reassert_vf_settings(record: NetdevRecord, settings: Mapping[str, Any]) -> list[str]:
    """Set ``settings`` on the PF again when the VF of ``record`` no longer has them (reconcile);
    returns the fields that had drifted. Raises EnforcementError when the PF refuses."""
    if not record.vf_settings or not record.pf_name or record.vf_index is None:
        return []
    with nl.iproute() as ipr:
        try:
            drift = rec.drifted(settings, read_vf_config(ipr, record.pf_name, record.vf_index))
            pf_index = nl.lookup(ipr, record.pf_name)
            if drift and pf_index is not None:
                ipr.link("set", index=pf_index, vf=rec.settings_request(settings, record.vf_config, record.vf_index))
        except nl.netlink_error() as exc:
            raise EnforcementError(f"setting {rec.describe_settings(settings)} on VF {record.vf_index} of "
                                   f"{record.pf_name} again failed: {nl.reason(exc)}") from exc
    return drift


__all__ = ["apply_vf_settings", "read_vf_config", "reassert_vf_settings", "restore_vf_config", "undo_vf_settings"]
