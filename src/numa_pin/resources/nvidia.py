"""What NVIDIA GPUs add to the PCI device kind (pure).

* ``nvidia.com/gpu`` means every NVIDIA GPU discovery found when the config defines no
  resource of that name;
* ``NVIDIA_VISIBLE_DEVICES`` tokens are GPUs a device plugin already chose: UUIDs (``GPU-...``)
  or NVML indexes, an index being the GPU's position in PCI address order (NVML's default
  enumeration), never the device minor;
* CDI names (``nvidia.com/gpu=...`` and other kinds) map through :mod:`numa_pin.resources.cdi_map`;
* where ``NVIDIA_VISIBLE_DEVICES`` names exactly the GPUs granted (:func:`gpus_in_env`), the
  runtime is left the value the device plugin wrote: a CDI name there is what the NVIDIA
  container toolkit reads in CDI mode, and the UUID of the same GPU would not reach it.

A GPU is booked under the configured resource that lists its address, else ``nvidia.com/gpu``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numa_pin.base.text import quote
from numa_pin.devices.cdi import CdiDevice
from numa_pin.devices.model import DeviceInfo
from numa_pin.errors import RequestError
from numa_pin.topology.model import KIND_GPU, PciDevice, Topology

NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_VENDOR = "0x10de"
#: the variable a device plugin names the GPUs it chose in (indexes, UUIDs, CDI names)
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

Devices = Mapping[str, tuple[DeviceInfo, ...]]


def _gpus(topology: Topology) -> list[PciDevice]:
    return [d for d in topology.pci_devices if d.kind == KIND_GPU and d.vendor == NVIDIA_VENDOR]


def nvidia_gpus(topology: Topology) -> list[PciDevice]:
    """The machine's NVIDIA GPUs in PCI address order (NVML's default enumeration)."""
    return sorted(_gpus(topology), key=lambda d: d.address)


def with_default_gpus(topology: Topology, devices: Devices) -> dict[str, tuple[DeviceInfo, ...]]:
    """``devices`` plus ``nvidia.com/gpu`` (every NVIDIA GPU) when the config defines none."""
    out = dict(devices)
    if NVIDIA_GPU not in out:
        gpus = tuple(DeviceInfo(d.address, () if d.numa_node is None else (d.numa_node,), True)
                     for d in _gpus(topology))
        if gpus:
            out[NVIDIA_GPU] = gpus
    return out


def _booked_under(address: str, devices: Devices) -> str:
    return next((r for r, infos in devices.items() if any(i.id == address for i in infos)), NVIDIA_GPU)


def fixed_gpus(tokens: Iterable[str], topology: Topology, devices: Devices) -> list[tuple[str, str]]:
    """``(resource, PCI address)`` for every ``NVIDIA_VISIBLE_DEVICES`` token.

    Raises:
        RequestError: a token names no GPU of this machine.
    """
    tokens = tuple(tokens)
    if not tokens:
        return []
    gpus = nvidia_gpus(topology)
    by_uuid = {d.gpu_uuid: d.address for d in gpus if d.gpu_uuid}
    out = []
    for token in tokens:
        if token.isdigit() and int(token) < len(gpus):
            addr = gpus[int(token)].address
        elif token in by_uuid:
            addr = by_uuid[token]
        else:
            raise RequestError(f"GPU {quote(token)} is not on this machine", annotation="NVIDIA_VISIBLE_DEVICES")
        out.append((_booked_under(addr, devices), addr))
    return out


def gpus_in_env(tokens: Iterable[str], cdi: Iterable[CdiDevice], topology: Topology) -> frozenset[str] | None:
    """The addresses of the GPUs the container's ``NVIDIA_VISIBLE_DEVICES`` names: its indexes and
    UUIDs (``tokens``) and its CDI names of NVIDIA's kind (those of ``cdi`` found there). None
    where it names no GPU, names one this machine lacks, or holds a CDI name of another kind
    (those resolve through CDI spec files, not here)."""
    from numa_pin.resources.cdi_map import NVIDIA_GPU_KIND, resolve_cdi

    tokens = tuple(tokens)
    named = tuple(d for d in cdi if d.source == VISIBLE_DEVICES)
    if not (tokens or named) or any(d.kind != NVIDIA_GPU_KIND for d in named):
        return None
    try:
        found = [a for _, a in fixed_gpus(tokens, topology, {})]
        found += [a for _, a in resolve_cdi(named, nvidia_gpus(topology), {})]
    except RequestError:
        return None
    return frozenset(found)


def fixed_cdi(names: Iterable[CdiDevice], topology: Topology, devices: Devices) -> list[tuple[str, str]]:
    """``(resource, PCI address)`` for every device chosen through CDI."""
    names = tuple(names)
    if not names:
        return []
    from numa_pin.resources.cdi_map import resolve_cdi

    return resolve_cdi(names, nvidia_gpus(topology), devices, NVIDIA_GPU)


__all__ = ["NVIDIA_GPU", "VISIBLE_DEVICES", "fixed_cdi", "fixed_gpus", "gpus_in_env", "nvidia_gpus",
           "with_default_gpus"]
