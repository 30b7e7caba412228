"""What NVIDIA GPUs add to the PCI device kind (pure).

* ``nvidia.com/gpu`` means every NVIDIA GPU discovery found when the config defines no
  resource of that name;
* ``NVIDIA_VISIBLE_DEVICES`` tokens are GPUs a device plugin already chose: UUIDs (``GPU-...``)
  or NVML indexes, an index being the GPU's position in PCI address order (NVML's default
  enumeration), never the device minor;
* CDI names (``nvidia.com/gpu=...`` and configured kinds) map through
  :mod:`numa_pin.resources.cdi_map`, names of any other kind (a DRA claim) through the device
  nodes their CDI spec files give them;
* where ``NVIDIA_VISIBLE_DEVICES`` names exactly the GPUs granted (:func:`gpus_in_env`), names
  of every kind resolved as the allocation resolves them, the runtime is left the value the
  device plugin wrote: a CDI name there is what the NVIDIA container toolkit reads in CDI mode,
  and the UUID of the same GPU would not reach it.

A GPU is booked under the configured resource that lists its address, else ``nvidia.com/gpu``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from numa_pin.base.text import quote
from numa_pin.devices.cdi import CdiDevice
from numa_pin.devices.devnode import DeviceNode, functions_of
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


def gpus_in_env(tokens: Iterable[str], cdi: Iterable[CdiDevice], topology: Topology,
                nodes: Iterable[DeviceNode] = (), devices: Devices | None = None) -> frozenset[str] | None:
    """The addresses of the functions the container's ``NVIDIA_VISIBLE_DEVICES`` names, each
    resolved as the allocation resolves it: its indexes and UUIDs (``tokens``) and each CDI name
    of ``cdi`` found there, NVIDIA's kind and a configured resource's kind (a key of
    ``devices``) through :mod:`numa_pin.resources.cdi_map`, any other kind through the device
    nodes its CDI spec file gives it (those of ``nodes`` whose source is the name).

    None where it names nothing, or where a token or name resolves to no function of this
    machine: a GPU it lacks, a name no spec file names (or ``nodes`` do not carry), a node no
    function is behind."""
    from numa_pin.resources.cdi_map import NVIDIA_GPU_KIND, resolve_cdi

    tokens = tuple(tokens)
    named = tuple(d for d in cdi if d.source == VISIBLE_DEVICES)
    if not (tokens or named):
        return None
    nodes, devices = tuple(nodes), devices or {}
    gpus = nvidia_gpus(topology)
    try:
        found = {a for _, a in fixed_gpus(tokens, topology, {})}
        for dev in named:
            if dev.kind == NVIDIA_GPU_KIND or dev.kind in devices:
                here = [a for _, a in resolve_cdi((dev,), gpus, devices)]
            else:
                here = _spec_functions(str(dev), nodes, topology)
            if not here:
                return None
            found.update(here)
    except RequestError:
        return None
    return frozenset(found)


def _spec_functions(name: str, nodes: tuple[DeviceNode, ...], topology: Topology) -> list[str]:
    """The functions behind the device nodes a CDI spec file gives ``name``; none where one of
    them cannot be placed (the allocation leaves that node unaligned, and the name's GPUs are
    then not all it names)."""
    out: list[str] = []
    for node in nodes:
        if node.source == name:
            addresses, why = functions_of(node, topology)
            if why:
                return []
            out += addresses
    return out


def fixed_cdi(names: Iterable[CdiDevice], topology: Topology, devices: Devices) -> list[tuple[str, str]]:
    """``(resource, PCI address)`` for every device chosen through CDI."""
    names = tuple(names)
    if not names:
        return []
    from numa_pin.resources.cdi_map import resolve_cdi

    return resolve_cdi(names, nvidia_gpus(topology), devices, NVIDIA_GPU)


__all__ = ["NVIDIA_GPU", "VISIBLE_DEVICES", "fixed_cdi", "fixed_gpus", "gpus_in_env", "nvidia_gpus",
           "with_default_gpus"]
