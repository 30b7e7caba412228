"""Device nodes a container already carries, and the PCI functions behind them (pure).

A container's spec lists the device nodes its runtime will create (``linux.devices``): a
device plugin, a DRA driver through CDI, ``podman --device`` or anyone else put them there.
numa-pin aligns CPUs and memory to the PCI functions behind those nodes, whoever chose them.

The edge (:mod:`numa_pin.resources.node.devnodes`) fills :attr:`DeviceNode.address` from sysfs
(``/sys/dev/char/<major>:<minor>`` resolves into the function's directory) and
:attr:`DeviceNode.virtual` for nodes of no device at all (``/dev/vfio/vfio``, ``rdma_cm``,
``nvidiactl``); :func:`functions_of` adds what sysfs does not say:

* NVIDIA's ``/dev/nvidia<N>`` (character major 195, minors below 255) have no entry under
  ``/sys/dev/char`` at all (measured on an H200 node, driver 580, kernel 6.18; nor have
  ``nvidiactl`` 195:255 and ``nvidia-uvm`` 238:0): the GPU whose driver
  reports ``Device Minor: N`` (``/proc/driver/nvidia/gpus/<address>/information``, read by
  discovery); the driver's control nodes (:attr:`DeviceNode.control`) name no GPU;
* ``/dev/vfio/<group>`` (a virtual device in sysfs): every function of that IOMMU group.

A node none of these places has no PCI function numa-pin can align to: :func:`functions_of`
says why, so the admission can say so (and reject it under ``inference.strict_devices``).
"""

from __future__ import annotations

from numa_pin.base.record import record
from numa_pin.topology.model import Topology

#: the NVIDIA driver's character major; minor 255 is ``nvidiactl``, 254 ``nvidia-modeset``
NVIDIA_MAJOR = 195
NVIDIA_MAX_GPU_MINOR = 254
VFIO_DIR = "/dev/vfio/"
#: NVIDIA's control nodes (``nvidia-uvm`` 238:0 on a measured H200 node; the major is dynamic)
NVIDIA_CONTROL_PREFIXES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset", "/dev/nvidia-caps")


@record
class DeviceNode:
    """One device node of a container: from ``linux.devices`` or a CDI device's edits.

    ``source`` says where it came from (``linux.devices`` or the CDI name); ``address`` is the
    PCI function sysfs names for it (None: sysfs names none); ``virtual`` a node of no device
    (a control or multiplexing node, nothing to align); ``why`` an edge's reason it could not
    even look (the CDI name is in no spec file, the node cannot be read).
    """

    path: str
    source: str
    type: str = "c"
    major: int | None = None
    minor: int | None = None
    address: str | None = None
    virtual: bool = False
    why: str = ""

    @property
    def vfio_group(self) -> int | None:
        """The IOMMU group of ``/dev/vfio/<group>``; None for any other node."""
        rest = self.path[len(VFIO_DIR):] if self.path.startswith(VFIO_DIR) else ""
        return int(rest) if rest.isdigit() and len(rest) < 10 else None

    @property
    def control(self) -> bool:
        """A driver's control node, of no one device: ``nvidiactl``, ``nvidia-uvm``,
        ``nvidia-modeset``, ``nvidia-caps/*`` (their majors other than 195 are dynamic)."""
        if self.type == "c" and self.major == NVIDIA_MAJOR and self.minor is not None:
            return self.minor > NVIDIA_MAX_GPU_MINOR
        return self.path.startswith(NVIDIA_CONTROL_PREFIXES)

    @property
    def nothing_to_align(self) -> bool:
        """A control node, or a virtual device other than a VFIO group."""
        return self.control or (self.virtual and self.vfio_group is None)

    @property
    def label(self) -> str:
        """``/dev/x (source)``, or the source alone for a CDI name no spec resolved."""
        return f"{self.path} ({self.source})" if self.path else self.source


def functions_of(node: DeviceNode, topology: Topology) -> tuple[tuple[str, ...], str]:
    """``(PCI addresses, why not)`` for ``node``: the functions it gives access to, or none
    and the reason (empty for a node of no device: there is nothing to align to, and nothing
    wrong). NVIDIA's and VFIO's rules come first: their nodes may resolve to virtual devices."""
    if node.control:
        return (), ""
    if node.why:
        return (), node.why
    if node.type == "c" and node.major == NVIDIA_MAJOR and node.minor is not None:
        gpus = tuple(d.address for d in topology.pci_devices if d.gpu_minor == node.minor)
        if gpus:
            return gpus, ""
        return (), f"no NVIDIA GPU reports device minor {node.minor}"
    group = node.vfio_group
    if group is not None:
        members = tuple(sorted(d.address for d in topology.pci_devices if d.iommu_group == group))
        if members:
            return members, ""
        return (), f"IOMMU group {group} holds no PCI function"
    if node.address is not None:
        if topology.device(node.address) is not None:
            return (node.address,), ""
        return (), f"PCI function {node.address} is not among this machine's devices"
    if node.virtual:
        return (), ""
    where = f"{node.major}:{node.minor}" if node.major is not None else "unknown number"
    return (), f"no PCI function behind {'block' if node.type == 'b' else 'character'} device {where}"


__all__ = ["NVIDIA_CONTROL_PREFIXES", "NVIDIA_MAJOR", "DeviceNode", "functions_of"]
