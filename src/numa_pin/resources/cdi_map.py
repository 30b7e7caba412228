"""Map CDI device names to this machine's PCI devices (pure).

* ``nvidia.com/gpu=<index>``: the GPU at that NVML index (PCI address order, NVML's default
  enumeration, as for ``NVIDIA_VISIBLE_DEVICES``); ``<index>:<mig>`` (a MIG device) means its
  parent GPU;
* ``nvidia.com/gpu=<uuid>`` (``GPU-...``): the GPU with that UUID;
* ``nvidia.com/gpu=all``: every NVIDIA GPU;
* a kind ``vendor.com/class`` that names a configured device resource: the CDI name is a PCI
  address of one of its devices, an index into its devices in address order, or ``all``;
* any other kind (a DRA driver's ``k8s.gpu.nvidia.com/claim=<uid>-gpu-0``): not here; the
  hook resolves it through the CDI spec files into device nodes
  (:mod:`numa_pin.resources.node.devnodes`), which align like ``linux.devices``.

A name of the first two kinds that matches no device raises
:class:`~numa_pin.errors.RequestError` naming the annotation or variable it came from, so a
container is never aligned to a device numa-pin guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from numa_pin.base.pciaddr import normalise
from numa_pin.devices.cdi import CdiDevice
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import RequestError
from numa_pin.topology.model import PciDevice

NVIDIA_GPU_KIND = "nvidia.com/gpu"


def _nvidia(dev: CdiDevice, gpus: Sequence[PciDevice]) -> list[str]:
    if dev.name == "all":
        if not gpus:
            raise RequestError(f"CDI device {dev}: this machine has no NVIDIA GPU", annotation=dev.source)
        return [g.address for g in gpus]
    index = dev.name.split(":", 1)[0]
    if index.isdigit():
        if int(index) < len(gpus):
            return [gpus[int(index)].address]
    else:
        for gpu in gpus:
            if gpu.gpu_uuid and gpu.gpu_uuid == dev.name:
                return [gpu.address]
    raise RequestError(f"CDI device {dev}: no such GPU on this machine ({len(gpus)} NVIDIA GPUs)",
                       annotation=dev.source)


def _resource(dev: CdiDevice, infos: Sequence[DeviceInfo]) -> list[str]:
    ids = sorted(i.id for i in infos)
    if dev.name == "all":
        return ids
    if dev.name.isdigit():
        if int(dev.name) < len(ids):
            return [ids[int(dev.name)]]
    else:
        try:
            address = normalise(dev.name)
        except ValueError:
            address = dev.name
        if address in ids:
            return [address]
    raise RequestError(f"CDI device {dev}: not one of the {len(ids)} {dev.kind} devices", annotation=dev.source)


def resolve_cdi(
    devices: Iterable[CdiDevice],
    nvidia_gpus: Sequence[PciDevice],
    resources: Mapping[str, Sequence[DeviceInfo]],
    gpu_resource: str = NVIDIA_GPU_KIND,
) -> list[tuple[str, str]]:
    """``(resource, PCI address)`` for every CDI device of a kind this module maps (see the
    module doc).

    ``nvidia_gpus`` are the NVIDIA GPUs in address order; ``resources`` the machine's device
    resources; a GPU is booked under the resource that lists its address, else ``gpu_resource``.
    """
    out: list[tuple[str, str]] = []
    for dev in devices:
        if dev.kind == NVIDIA_GPU_KIND:
            for addr in _nvidia(dev, nvidia_gpus):
                res = next((r for r, infos in resources.items() if any(i.id == addr for i in infos)), gpu_resource)
                out.append((res, addr))
        elif dev.kind in resources:
            out.extend((dev.kind, addr) for addr in _resource(dev, resources[dev.kind]))
    return out


__all__ = ["NVIDIA_GPU_KIND", "resolve_cdi"]
