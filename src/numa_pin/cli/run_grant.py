"""What ``numa-pin run`` tells its command about the grant, and how it reads explicit lists.

The command learns its grant from its environment:

* ``NUMA_PIN_CPUS``: its exclusive CPUs (kernel list format; with ``--ranks``, this rank's
  share); absent for a grant on the shared pool;
* ``NUMA_PIN_MEMS``: the NUMA nodes of its memory (with ``--ranks``, the nodes of its share);
* ``CUDA_VISIBLE_DEVICES``: its NVIDIA GPUs, by UUID (``GPU-...``, read from the driver's
  ``/proc/driver/nvidia/gpus/<address>/information``); a GPU whose UUID is not known is named
  by its device minor (``/dev/nvidia<minor>``, as the GPU enforcement names it) and then
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set too;
* ``PCIDEVICE_<RESOURCE>``: the PCI addresses of every other device resource, comma-separated,
  named as the SR-IOV network device plugin names them (``intel.com/sriov_vf`` ->
  ``PCIDEVICE_INTEL_COM_SRIOV_VF``);
* ``NUMA_PIN_RANK`` / ``NUMA_PIN_RANKS`` with ``--ranks``; with ``--bind-devices closest``
  each rank's ``CUDA_VISIBLE_DEVICES`` and ``PCIDEVICE_*`` name only the devices bound to it
  (:mod:`numa_pin.allocators.devbind`), in the same forms;
* ``NUMA_PIN_GRANT_FILE``: a JSON file with the whole grant (:func:`grant_document`).

Explicit lists (:func:`explicit_cpuset`) are numactl's: ``--cpu-list 0-3,8`` (physical CPU
numbers) and ``--nodes 0,1`` (NUMA nodes, meaning their CPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant
from numa_pin.topology.model import KIND_GPU, PciDevice, Topology

NVIDIA_VENDOR = "0x10de"
ENV_CPUS, ENV_MEMS, ENV_GRANT_FILE = "NUMA_PIN_CPUS", "NUMA_PIN_MEMS", "NUMA_PIN_GRANT_FILE"
ENV_RANK, ENV_RANKS = "NUMA_PIN_RANK", "NUMA_PIN_RANKS"
ENV_CUDA, ENV_CUDA_ORDER = "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"
PCIDEVICE_PREFIX = "PCIDEVICE_"


def pcidevice_variable(resource: str) -> str:
    """``PCIDEVICE_`` and the resource name upper-cased, ``.`` and ``/`` made ``_``."""
    return PCIDEVICE_PREFIX + resource.upper().replace("/", "_").replace(".", "_")


def _nvidia_gpu(topology: Topology, address: str) -> PciDevice | None:
    dev = topology.device(address)
    return dev if dev is not None and dev.kind == KIND_GPU and dev.vendor == NVIDIA_VENDOR else None


def device_env(grant: Grant, topology: Topology) -> tuple[dict[str, str], list[str]]:
    """The device variables of ``grant`` and a warning per GPU the command cannot be told of
    (neither UUID nor device minor known: the driver is not loaded)."""
    env: dict[str, str] = {}
    warnings: list[str] = []
    cuda: list[str] = []
    by_minor = False
    for resource in sorted(grant.devices):
        others: list[str] = []
        for address in grant.devices[resource]:
            gpu = _nvidia_gpu(topology, address)
            if gpu is None:
                others.append(address)
            elif gpu.gpu_uuid:
                cuda.append(gpu.gpu_uuid)
            elif gpu.gpu_minor is not None:
                cuda.append(str(gpu.gpu_minor))
                by_minor = True
            else:
                warnings.append(f"GPU {address} has neither a UUID nor a device minor (is the NVIDIA driver "
                                f"loaded?); it is not in {ENV_CUDA}")
        if others:
            env[pcidevice_variable(resource)] = ",".join(others)
    if cuda or any(_nvidia_gpu(topology, a) for ids in grant.devices.values() for a in ids):
        env[ENV_CUDA] = ",".join(cuda)
        if by_minor:
            env[ENV_CUDA_ORDER] = "PCI_BUS_ID"
    return env, warnings


def nodes_of(cpus: frozenset[int], topology: Topology) -> frozenset[int]:
    return frozenset(n for c in cpus if (n := topology.cpus[c].numa) is not None)


def rank_env(share: frozenset[int], rank: int, ranks: int, topology: Topology,
             devices: Grant | None = None) -> dict[str, str]:
    """The variables that differ per rank: its CPUs, their nodes, its number and, when
    ``devices`` is the grant cut down to the rank's devices, their variables."""
    env = device_env(devices, topology)[0] if devices is not None else {}
    env.update({ENV_CPUS: format_list(share), ENV_MEMS: format_list(nodes_of(share, topology)),
                ENV_RANK: str(rank), ENV_RANKS: str(ranks)})
    return env


def grant_env(grant: Grant, topology: Topology, grant_file: str | None) -> tuple[dict[str, str], list[str]]:
    """Every variable of the module doc but the per-rank ones, and the device warnings."""
    env, warnings = device_env(grant, topology)
    if grant.cpus:
        env[ENV_CPUS] = format_list(grant.cpus)
    if grant.mems:
        env[ENV_MEMS] = format_list(grant.mems)
    if grant_file is not None:
        env[ENV_GRANT_FILE] = grant_file
    return env, warnings


def grant_document(grant: Grant, topology: Topology, shares: Sequence[frozenset[int]] = (),
                   bound: Sequence[Mapping[str, Sequence[str]]] = ()) -> dict[str, Any]:
    """The grant as the JSON object of ``NUMA_PIN_GRANT_FILE``: ``id``, ``kind``, ``cpus`` and
    ``mems`` (lists of numbers), ``memory`` (``{resource: {node: bytes}}``), ``devices``
    (``{resource: [{address, numa_node, uuid?, minor?}]}``) and, with ``--ranks``, ``ranks``
    (``[{rank, cpus, mems}]``, each with ``devices``, ``{resource: [address]}``, when
    ``bound`` gives each rank's devices)."""
    devices: dict[str, list[dict[str, Any]]] = {}
    for resource in sorted(grant.devices):
        entries = []
        for address in grant.devices[resource]:
            dev = topology.device(address)
            entry: dict[str, Any] = {"address": address, "numa_node": dev.numa_node if dev else None}
            if dev is not None and dev.gpu_uuid:
                entry["uuid"] = dev.gpu_uuid
            if dev is not None and dev.gpu_minor is not None:
                entry["minor"] = dev.gpu_minor
            entries.append(entry)
        devices[resource] = entries
    doc: dict[str, Any] = {
        "id": grant.container_id,
        "kind": grant.kind,
        "cpus": sorted(grant.cpus),
        "mems": sorted(grant.mems),
        "memory": {res: {str(node): size for node, size in sorted(per.items())}
                   for res, per in sorted(grant.memory.items())},
        "devices": devices,
    }
    if shares:
        doc["ranks"] = [{"rank": i, "cpus": sorted(s), "mems": sorted(nodes_of(s, topology))}
                        for i, s in enumerate(shares)]
        for entry, devs in zip(doc["ranks"], bound):
            entry["devices"] = {res: list(addresses) for res, addresses in sorted(devs.items())}
    return doc


def explicit_cpuset(cpu_list: str | None, nodes: str | None, topology: Topology) -> frozenset[int] | None:
    """The CPUs ``--cpu-list`` and ``--nodes`` name together (their intersection), or None
    when neither is given.

    Raises:
        RequestError: a list that does not parse, names CPUs that are not online or nodes the
            machine lacks, or leaves no CPU.
    """
    if cpu_list is None and nodes is None:
        return None
    chosen = frozenset(topology.cpu_ids)
    if cpu_list is not None:
        cpus = _parse(cpu_list, "--cpu-list")
        missing = cpus - chosen
        if missing:
            raise RequestError(f"CPUs {format_list(missing)} are not online (online: {format_list(chosen)})",
                               annotation="--cpu-list")
        chosen = cpus
    if nodes is not None:
        wanted = _parse(nodes, "--nodes")
        unknown = wanted - frozenset(topology.node_ids)
        if unknown:
            raise RequestError(f"NUMA nodes {format_list(unknown)} do not exist (nodes: "
                               f"{format_list(topology.node_ids)})", annotation="--nodes")
        chosen = frozenset(c for c in chosen if topology.cpus[c].numa in wanted)
    if not chosen:
        raise RequestError("--cpu-list and --nodes leave no CPU between them", annotation="--nodes")
    return chosen


def _parse(text: str, flag: str) -> frozenset[int]:
    try:
        ids = parse_list(text)
    except ValueError as exc:
        raise RequestError(f"{text!r} is not a list such as 0-3,8: {exc}", annotation=flag) from exc
    if not ids:
        raise RequestError("the list is empty", annotation=flag)
    return ids


def merged(base: Mapping[str, str], *layers: Mapping[str, str]) -> dict[str, str]:
    out = dict(base)
    for layer in layers:
        out.update(layer)
    return out


__all__ = ["device_env", "explicit_cpuset", "grant_document", "grant_env", "pcidevice_variable", "rank_env"]
