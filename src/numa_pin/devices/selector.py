"""Device selectors and resource names: the one model the config builds and the inventory uses (pure).

A :class:`Selector` says which PCI functions belong to a device resource; every field it
gives must match and the values of one field are alternatives (the model of the SR-IOV
network device plugin's ``selectors``). Values are validated and normalised when a
selector is made, so a selector that exists is a valid one:

* ``vendors`` / ``devices``: 1-4 hex digits, optional ``0x`` -> ``"0x10de"`` (sysfs's form);
* ``classes``: a prefix of the class code, 2, 4 or 6 hex digits -> ``"0x0302"``;
* ``drivers``: bound driver names;
* ``pf_names``: the PF's netdev for a VF, or the function's own netdev, optionally with VF
  index ranges (``"ens2f0#0-3,6"``);
* ``is_vf`` / ``has_netdev``: required when not ``None``;
* ``addresses``: PCI addresses -> ``"0000:3b:00.1"`` (:mod:`numa_pin.base.pciaddr`).

:func:`parse_selector` reads one selector from a config document (YAML lists and booleans
only) and names the offending dotted key; the constructor also takes a single string for
a list and names the key ``devices.selectors.<field>``. Both raise
:class:`~numa_pin.errors.ConfigError`. Matching devices is :mod:`numa_pin.devices.inventory`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from numa_pin.base import pciaddr
from numa_pin.base.record import record
from numa_pin.errors import ConfigError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

#: keys of one selector, in the order they are written; list-valued unless in SELECTOR_BOOL_KEYS
SELECTOR_KEYS = ("vendors", "devices", "classes", "drivers", "pf_names", "is_vf", "has_netdev", "addresses")
SELECTOR_BOOL_KEYS = ("is_vf", "has_netdev")
_LIST_KEYS = tuple(k for k in SELECTOR_KEYS if k not in SELECTOR_BOOL_KEYS)
#: the key named in errors of a selector made directly rather than read from a config file
_DIRECT_KEY = "devices.selectors"

_HEX = re.compile(r"(?:0[xX])?([0-9a-fA-F]+)")
_PF_NAME = re.compile(r"([^#\s]+)(?:#([0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*))?")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@record
class PfName:
    """One parsed ``pf_names`` entry: the netdev name and the VF index ranges (None: no ranges)."""

    name: str
    ranges: tuple[tuple[int, int], ...] | None = None

    def takes_vf(self, index: int) -> bool:
        """Does a VF with this index fall in the ranges? (Never when no ranges are given.)"""
        return self.ranges is not None and any(low <= index <= high for low, high in self.ranges)


def parse_pf_name(text: str) -> PfName:
    """``"ens2f0"`` or ``"ens2f0#0-3,6"`` -> :class:`PfName`.

    Raises:
        ValueError: not a netdev name (no ``#`` or white space), or bad ranges (``#x-y``,
            ``#3-1``).
    """
    match = _PF_NAME.fullmatch(text)
    if match is None:
        raise ValueError(f"must be a netdev name, optionally with VF index ranges (ens2f0#0-3,6); got {text!r}")
    if match[2] is None:
        return PfName(match[1])
    ranges = []
    for part in match[2].split(","):
        low, _, high = part.partition("-")
        if int(high or low) < int(low):
            raise ValueError(f"VF index range {part!r} runs backwards in {text!r}; write low-high")
        ranges.append((int(low), int(high or low)))
    return PfName(match[1], tuple(ranges))


def _hex_id(text: str) -> str:
    match = _HEX.fullmatch(text)
    if match is None or len(match[1]) > 4:
        raise ValueError(f"must be a hex id of up to 4 digits (hexadecimal, such as 0x10de); got {text!r}")
    return f"0x{int(match[1], 16):04x}"


def _class_prefix(text: str) -> str:
    match = _HEX.fullmatch(text)
    if match is None or len(match[1]) not in (2, 4, 6):
        raise ValueError(f"must be a PCI class of 2, 4 or 6 hex digits such as 0x0302; got {text!r}")
    return "0x" + match[1].lower()


def _address(text: str) -> str:
    try:
        return pciaddr.normalise(text)
    except ValueError:
        raise ValueError(f"must be a PCI address such as {pciaddr.EXAMPLE}; got {text!r}") from None


def _pf_name(text: str) -> str:
    parse_pf_name(text)
    return text


#: per list key: str -> canonical str, raising ValueError with the message to show
_NORMALISERS: dict[str, Callable[[str], str]] = {
    "vendors": _hex_id,
    "devices": _hex_id,
    "classes": _class_prefix,
    "pf_names": _pf_name,
    "addresses": _address,
}


def _normalise(name: str, items: Iterable[object], key: str) -> tuple[str, ...]:
    """Strip and normalise the items of list key ``name``; errors name ``key[i]``."""
    normalise = _NORMALISERS.get(name)
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"must be a non-empty string; got {item!r}", key=f"{key}[{i}]")
        try:
            out.append(normalise(item.strip()) if normalise else item.strip())
        except ValueError as exc:
            raise ConfigError(str(exc), key=f"{key}[{i}]") from None
    return tuple(out)


@record
class Selector:
    """Which PCI functions a resource takes. Unset fields (empty tuple / None) match any.

    Fields are normalised as the module docstring says; a single string stands for a
    one-item list.

    Raises:
        ConfigError: a bad value, or no field set (that selector would match every device).
    """

    vendors: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    pf_names: tuple[str, ...] = ()
    is_vf: bool | None = None
    has_netdev: bool | None = None
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in _LIST_KEYS:
            key = f"{_DIRECT_KEY}.{name}"
            value: object = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            if not isinstance(value, Iterable):
                raise ConfigError(f"must be a list of strings; got {value!r}", key=key)
            object.__setattr__(self, name, _normalise(name, value, key))
        for name in SELECTOR_BOOL_KEYS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"must be true, false or unset; got {value!r}", key=f"{_DIRECT_KEY}.{name}")
        if not self.to_dict():
            raise ConfigError("an empty selector would match every PCI device; give at least one key",
                              key=_DIRECT_KEY)

    def to_dict(self) -> dict[str, Any]:
        """The set keys only, as YAML writes them; ``parse_selector(s.to_dict(), k) == s``."""
        out: dict[str, Any] = {}
        for name in SELECTOR_KEYS:
            value = getattr(self, name)
            if value is None or value == ():
                continue
            out[name] = value if isinstance(value, bool) else list(value)
        return out

    def pf_name_patterns(self) -> tuple[PfName, ...]:
        """``pf_names`` parsed (they were validated when the selector was made)."""
        return tuple(parse_pf_name(text) for text in self.pf_names)


def parse_selector(value: object, key: str) -> Selector:
    """One selector from a config document: a non-empty mapping of :data:`SELECTOR_KEYS`, each
    list key a non-empty YAML list of strings, each boolean key a YAML boolean.

    Raises:
        ConfigError: anything else; ``key`` is the dotted key of the offending value
            (``devices.intel.com/sriov_vf[0].pf_names[1]``), without the file.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"a selector must be a mapping; got {_type_name(value)}", key=key)
    if not value:
        raise ConfigError("an empty selector would match every PCI device", key=key)
    fields: dict[str, Any] = {}
    for name, raw in value.items():
        if not isinstance(name, (str, int)) or isinstance(name, bool):
            raise ConfigError(f"keys must be strings; got {name!r}", key=key)
        sub = f"{key}.{name}"
        if name not in SELECTOR_KEYS:
            raise ConfigError(f"unknown selector key; known: {', '.join(SELECTOR_KEYS)}", key=sub)
        if name in SELECTOR_BOOL_KEYS:
            if not isinstance(raw, bool):
                raise ConfigError(f"must be true or false; got {raw!r} ({_type_name(raw)})", key=sub)
            fields[name] = raw
        elif not isinstance(raw, list) or not raw:
            raise ConfigError(f"must be a non-empty list of strings; got {raw!r}", key=sub)
        else:
            fields[name] = _normalise(name, raw, sub)
    return Selector(**fields)


def check_resource_name(name: object, key: str | None = None) -> str:
    """Validate ``domain/name`` (``nvidia.com/gpu``): a lower-case DNS subdomain outside
    ``kubernetes.io``, and a name of at most 63 letters, digits, ``-``, ``_``, ``.``.

    Raises:
        ConfigError: anything else; ``key`` (default ``devices.<name>``) is named.
    """
    key = key if key is not None else f"devices.{name}"
    what = "resource names look like vendor.example/name (e.g. nvidia.com/gpu)"
    if not isinstance(name, str) or name.count("/") != 1:
        raise ConfigError(f"{what}; got {name!r}", key=key)
    domain, short = name.split("/")
    if len(domain) > 253 or not _DOMAIN.fullmatch(domain):
        raise ConfigError(f"{what}; {domain!r} is not a DNS domain (lower case)", key=key)
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ConfigError(f"{what}; the kubernetes.io domain is reserved for native resources", key=key)
    if len(short) > 63 or not _NAME.fullmatch(short):
        raise ConfigError(f"{what}; {short!r} is not a name (letters, digits, -, _, .; at most 63)", key=key)
    return name


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


__all__ = [
    "SELECTOR_BOOL_KEYS",
    "SELECTOR_KEYS",
    "PfName",
    "Selector",
    "check_resource_name",
    "parse_pf_name",
]
