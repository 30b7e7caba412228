"""Container Device Interface (CDI) device names, as values (pure).

A CDI name is ``vendor.com/class=name`` (CDI spec 0.x/1.x: the *kind* ``vendor/class`` then the
device's name in that kind's spec). Container engines take the names from the
``cdi.k8s.io/<key>`` annotations (comma-separated), from the CRI ``CDIDevices`` field or from
``--device``; NVIDIA's toolkit also reads them from ``NVIDIA_VISIBLE_DEVICES`` in CDI mode.
numa-pin treats a device already chosen through CDI as a *fixed* device that CPUs and memory
align to, like ``NVIDIA_VISIBLE_DEVICES`` and ``PCIDEVICE_*`` of a device plugin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from numa_pin.base.record import record
from numa_pin.base.text import quote
from numa_pin.errors import RequestError

#: prefix of the annotations CDI devices are requested with (``cdi.k8s.io/<key>``)
ANNOTATION_PREFIX = "cdi.k8s.io/"

_VENDOR = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
_CLASS = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?"
_QUALIFIED = re.compile(rf"({_VENDOR})/({_CLASS})=({_NAME})")


@record
class CdiDevice:
    """One fully qualified CDI device name, and where it was found (for error messages)."""

    vendor: str
    cls: str
    name: str
    source: str = ""

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def __str__(self) -> str:
        return f"{self.kind}={self.name}"


def is_qualified_name(text: str) -> bool:
    """True for ``vendor.com/class=name``."""
    return _QUALIFIED.fullmatch(text.strip()) is not None


def parse_name(text: str, source: str) -> CdiDevice:
    """Parse one qualified name; raises RequestError naming ``source`` for anything else."""
    match = _QUALIFIED.fullmatch(text.strip())
    if match is None:
        raise RequestError(f"{quote(text)} is not a CDI device name (vendor.com/class=name)", annotation=source)
    return CdiDevice(match.group(1), match.group(2), match.group(3), source)


def devices_from_annotations(annotations: Mapping[str, str]) -> tuple[CdiDevice, ...]:
    """Every device named in ``cdi.k8s.io/*`` annotations, in key order, duplicates dropped."""
    out: list[CdiDevice] = []
    for key in sorted(annotations):
        if key.startswith(ANNOTATION_PREFIX):
            out.extend(parse_name(item, key) for item in annotations[key].split(",") if item.strip())
    return _unique(out)


def devices_from_env_tokens(tokens: Iterable[str], source: str) -> tuple[CdiDevice, ...]:
    """The CDI names among ``tokens`` (``NVIDIA_VISIBLE_DEVICES`` mixes them with indexes/UUIDs)."""
    return _unique(parse_name(t, source) for t in tokens if is_qualified_name(t))


def _unique(devices: Iterable[CdiDevice]) -> tuple[CdiDevice, ...]:
    seen: set[str] = set()
    out: list[CdiDevice] = []
    for dev in devices:
        if str(dev) not in seen:
            seen.add(str(dev))
            out.append(dev)
    return tuple(out)


__all__ = [
    "ANNOTATION_PREFIX",
    "CdiDevice",
    "devices_from_annotations",
    "devices_from_env_tokens",
    "is_qualified_name",
    "parse_name",
]
