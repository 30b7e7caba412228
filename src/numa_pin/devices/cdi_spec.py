"""The device nodes of CDI spec files (pure: a parsed document in, nodes out).

A CDI spec (``/etc/cdi/*.yaml``, ``/var/run/cdi/*.json``; written by nvidia-ctk, the NVIDIA and
example DRA drivers, podman and others) says its ``cdiVersion``: a released version of the spec
from 0.3.0 (the earliest the reference library supports) to 1.1.0, with or without a leading
``v`` (the reference library drops one before it compares: ``v0.6.0`` is 0.6.0). It has a
``kind`` (``vendor.com/class``), a list of ``devices`` each with a ``name`` and its
``containerEdits``, and ``containerEdits`` of the spec itself that apply to each of its devices.
A device's nodes are its own ``deviceNodes`` then the spec's; a node has a ``path`` (in the
container), optionally a ``hostPath`` (0.5.0 on; the path on the host by default), ``type``
(``c``, ``b``), ``major`` and ``minor`` (read from the host node when absent).

Everything is bounded: devices per spec, nodes per device, path lengths.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.devices.cdi import is_qualified_name
from numa_pin.devices.devnode import DeviceNode

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

#: the cdiVersion values numa-pin reads: the spec's released versions the reference library
#: (cncf-tags/container-device-interface) accepts; 0.1.0 and 0.2.0 are released but refused there
VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
MAX_DEVICES = 4096
MAX_NODES = 256
MAX_PATH = 4096


class SpecError(ValueError):
    """A CDI spec document that does not have the CDI shape (the message says where)."""


def _nodes(edits: Any, where: str, source: str) -> list[DeviceNode]:
    if edits is None:
        return []
    if not isinstance(edits, Mapping):
        raise SpecError(f"{where}.containerEdits is not a mapping")
    raw = edits.get("deviceNodes") or []
    if not isinstance(raw, list) or len(raw) > MAX_NODES:
        raise SpecError(f"{where}.containerEdits.deviceNodes is not a list of at most {MAX_NODES}")
    out = []
    for i, item in enumerate(raw):
        here = f"{where}.containerEdits.deviceNodes[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(f"{here} is not a mapping")
        path, host = item.get("path"), item.get("hostPath") or item.get("path")
        kind = item.get("type") or "c"
        if not isinstance(path, str) or not path.startswith("/") or len(path) > MAX_PATH:
            raise SpecError(f"{here}.path is not an absolute path")
        if not isinstance(host, str) or not host.startswith("/") or len(host) > MAX_PATH:
            raise SpecError(f"{here}.hostPath is not an absolute path")
        if kind not in ("c", "b", "u", "p"):
            raise SpecError(f"{here}.type is not one of c, b, u, p")
        numbers = [item.get(k) for k in ("major", "minor")]
        for k, v in zip(("major", "minor"), numbers, strict=True):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 32):
                raise SpecError(f"{here}.{k} is not a device number")
        out.append(DeviceNode(host, source, "c" if kind == "u" else kind, numbers[0], numbers[1]))
    return out


def spec_devices(doc: Any, where: str) -> dict[str, tuple[DeviceNode, ...]]:
    """``{qualified CDI name: its device nodes}`` of one parsed spec document; ``where`` (the
    file) starts every :class:`SpecError` message."""
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where}: not a mapping")
    version, kind, devices = doc.get("cdiVersion"), doc.get("kind"), doc.get("devices")
    if (version[1:] if isinstance(version, str) and version.startswith("v") else version) not in VERSIONS:
        raise SpecError(f"{where}: cdiVersion {str(version)[:20]!r} is not one of {', '.join(VERSIONS)}")
    if not isinstance(kind, str) or not is_qualified_name(f"{kind}=x"):
        raise SpecError(f"{where}: kind is not vendor.com/class")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise SpecError(f"{where}: devices is not a list of at most {MAX_DEVICES}")
    out: dict[str, tuple[DeviceNode, ...]] = {}
    for i, dev in enumerate(devices):
        if not isinstance(dev, Mapping) or not isinstance(dev.get("name"), str):
            raise SpecError(f"{where}: devices[{i}] has no name")
        name = f"{kind}={dev['name']}"
        if not is_qualified_name(name):
            raise SpecError(f"{where}: devices[{i}].name is not a CDI device name")
        shared = _nodes(doc.get("containerEdits"), f"{where}: spec", name)
        out[name] = tuple(_nodes(dev.get("containerEdits"), f"{where}: devices[{i}]", name) + shared)
    return out


__all__ = ["MAX_DEVICES", "MAX_NODES", "VERSIONS", "SpecError", "spec_devices"]
