"""The PF-side settings a container asks for its SR-IOV VFs (``numa-pin.io/vf-config``; pure).

One annotation, comma-separated ``key=value`` pairs, with sriov-cni's names and meanings::

    numa-pin.io/vf-config: vlan=100,vlanQoS=3,spoofchk=off,trust=on,max_tx_rate=1000

``vlan``         VLAN id, 0-4094 (0: no VLAN tagging)
``vlanQoS``      802.1p priority of that VLAN, 0-7; a non-zero one needs a non-zero ``vlan``
``mac``          the VF's MAC address (unicast, not all zeros)
``spoofchk``     ``on`` or ``off``: MAC/VLAN anti-spoof checking on the VF
``trust``        ``on`` or ``off``: trusted VF (promiscuous mode, changing its own MAC)
``min_tx_rate``  guaranteed transmit rate in Mbit/s (0: none)
``max_tx_rate``  transmit rate limit in Mbit/s (0: none); not below a non-zero ``min_tx_rate``
``link_state``   ``auto`` (follow the PF), ``enable`` or ``disable``

Every VF the container is granted gets them on its PF before it is moved into the container,
and its saved PF-side state back when it leaves (:mod:`numa_pin.enforcer.netdev`). The settings
are kept on the grant (``Grant.vf_config``) as a dict of these keys; a container that gets no
VF is refused (:mod:`numa_pin.resources.node.vf`).
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base.text import quote
from numa_pin.errors import RequestError
from numa_pin.requests.pairs import split_pairs

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

ANNOTATION = "numa-pin.io/vf-config"
#: ``link_state`` words -> IFLA_VF_LINK_STATE values (the kernel's auto, enable, disable)
LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}
_ON_OFF = {"on": True, "off": False}
_RATE_MAX = 0xFFFFFFFE  # a u32 in netlink; 0xffffffff means "not supported" there
_INTS = {"vlan": 4094, "vlanQoS": 7, "min_tx_rate": _RATE_MAX, "max_tx_rate": _RATE_MAX}
#: the settings a request may ask, in the order they are listed in errors
KEYS = ("vlan", "vlanQoS", "mac", "spoofchk", "trust", "min_tx_rate", "max_tx_rate", "link_state")
_MAX_TEXT = 512


def parse_vf_config(text: str, annotation: str = ANNOTATION) -> dict[str, Any]:
    """``"vlan=100,trust=on"`` -> ``{"vlan": 100, "trust": True}`` (see the module's table).

    Raises:
        RequestError: naming ``annotation``: an unknown or repeated key, a value out of range,
            or settings that contradict each other.
    """
    if len(text) > _MAX_TEXT:
        raise RequestError(f"longer than {_MAX_TEXT} characters", annotation=annotation)
    out: dict[str, Any] = {}
    for _, key, value in split_pairs(text, ",", "=", "key=value", annotation):
        if key not in KEYS:
            raise RequestError(f"unknown VF setting {quote(key)} (known: {', '.join(KEYS)})", annotation=annotation)
        if key in out:
            raise RequestError(f"VF setting {quote(key)} given twice", annotation=annotation)
        out[key] = _value(key, value, annotation)
    if "vlanQoS" in out and "vlan" not in out:
        raise RequestError("vlanQoS needs a vlan", annotation=annotation)
    if out.get("vlanQoS") and not out.get("vlan"):
        raise RequestError("a non-zero vlanQoS needs a non-zero vlan", annotation=annotation)
    low, high = out.get("min_tx_rate"), out.get("max_tx_rate")
    if low and high and low > high:
        raise RequestError(f"min_tx_rate {low} is above max_tx_rate {high}", annotation=annotation)
    return out


def _value(key: str, value: str, annotation: str) -> Any:
    if key in _INTS:
        if not value.isascii() or not value.isdigit() or len(value) > 10 or int(value) > _INTS[key]:
            raise RequestError(f"{key} must be an integer from 0 to {_INTS[key]}, got {quote(value)}",
                               annotation=annotation)
        return int(value)
    if key in ("spoofchk", "trust"):
        if value not in _ON_OFF:
            raise RequestError(f"{key} must be on or off, got {quote(value)}", annotation=annotation)
        return _ON_OFF[value]
    if key == "link_state":
        if value not in LINK_STATES:
            raise RequestError(f"link_state must be one of {', '.join(LINK_STATES)}, got {quote(value)}",
                               annotation=annotation)
        return value
    return parse_mac(value, annotation)


def parse_mac(value: str, annotation: str = ANNOTATION) -> str:
    """A unicast MAC address in lower case (``02:00:5e:10:00:01``). Raises RequestError."""
    octets = value.lower().split(":")
    if len(octets) != 6 or not all(len(o) == 2 and all(c in "0123456789abcdef" for c in o) for o in octets):
        raise RequestError(f"mac must be six hex octets separated by colons, got {quote(value)}",
                           annotation=annotation)
    if int(octets[0], 16) & 1:
        raise RequestError(f"mac {quote(value)} is a multicast address", annotation=annotation)
    if octets == ["00"] * 6:
        raise RequestError("mac 00:00:00:00:00:00 is not an address", annotation=annotation)
    return ":".join(octets)


def describe(settings: Mapping[str, Any]) -> str:
    """The settings as the annotation writes them (``vlan=100,trust=on``), in :data:`KEYS` order."""
    def word(value: Any) -> str:
        return ("on" if value else "off") if isinstance(value, bool) else str(value)

    return ",".join(f"{k}={word(settings[k])}" for k in KEYS if k in settings)


__all__ = ["ANNOTATION", "KEYS", "LINK_STATES", "describe", "parse_mac", "parse_vf_config"]
