"""The device nodes a granted GPU needs, as values (pure).

A GPU is usable from a container when the container's ``/dev`` holds its character nodes and
its device rules allow them (see :mod:`numa_pin.enforcer.gpu` for the rules):

* ``/dev/nvidia<minor>`` (major 195, the *device minor*, never the NVML index);
* ``/dev/nvidiactl`` (195:255);
* ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` (the ``nvidia-uvm`` major, minors 0 and 1)
  while that module is loaded.

:func:`gpu_device_nodes` lists them; :func:`oci_device_entry` and :func:`oci_allow_rule` write
them the way a runtime reads them from ``config.json`` (``linux.devices`` and
``linux.resources.devices``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from numa_pin.enforcer.gpu import NVIDIA_MAJOR, NVIDIACTL_MINOR, DeviceRule
from numa_pin.errors import EnforcementError
from numa_pin.topology.model import PciDevice

#: permissions of a created node (the NVIDIA driver's default for its nodes)
NODE_MODE = 0o666


@dataclass(frozen=True)
class DeviceNode:
    """One character device node: where it lives in the container and its numbers."""

    path: str  # absolute, inside the container ("/dev/nvidia0")
    major: int
    minor: int
    mode: int = NODE_MODE
    type: str = "c"

    @property
    def rule(self) -> DeviceRule:
        """The device-cgroup rule that lets the container use this node."""
        return DeviceRule(self.type, self.major, self.minor, "rwm")


def gpu_device_nodes(gpus: Iterable[PciDevice], uvm_major: int | None) -> tuple[DeviceNode, ...]:
    """The nodes ``gpus`` need (see the module doc), GPUs by minor, then the shared ones.

    Raises EnforcementError for a GPU without a device minor (driver not loaded).
    """
    minors: set[int] = set()
    for gpu in gpus:
        if gpu.gpu_minor is None:
            raise EnforcementError(
                f"GPU {gpu.address} has no device minor (is the NVIDIA driver loaded? "
                f"/proc/driver/nvidia/gpus/{gpu.address}/information names it)"
            )
        minors.add(gpu.gpu_minor)
    nodes = [DeviceNode(f"/dev/nvidia{m}", NVIDIA_MAJOR, m) for m in sorted(minors)]
    nodes.append(DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR))
    if uvm_major is not None:
        nodes.append(DeviceNode("/dev/nvidia-uvm", uvm_major, 0))
        nodes.append(DeviceNode("/dev/nvidia-uvm-tools", uvm_major, 1))
    return tuple(nodes)


def oci_device_entry(node: DeviceNode) -> dict[str, Any]:
    """The ``linux.devices`` entry that makes the runtime create ``node`` (owner root)."""
    return {
        "path": node.path, "type": node.type, "major": node.major, "minor": node.minor,
        "fileMode": node.mode, "uid": 0, "gid": 0,
    }


def oci_allow_rule(node: DeviceNode) -> dict[str, Any]:
    """The ``linux.resources.devices`` entry that allows ``node``."""
    return {"allow": True, "type": node.type, "major": node.major, "minor": node.minor, "access": "rwm"}


def gpu_list_text(gpus: Sequence[PciDevice]) -> str:
    """What the container is told about its GPUs: one ``<uuid or address> <minor>`` line each."""
    return "".join(f"{g.gpu_uuid or g.address} {'' if g.gpu_minor is None else g.gpu_minor}".rstrip() + "\n"
                   for g in gpus)


__all__ = ["NODE_MODE", "DeviceNode", "gpu_device_nodes", "gpu_list_text", "oci_allow_rule", "oci_device_entry"]
