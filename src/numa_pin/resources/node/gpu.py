"""GPUs (and the other PCI functions that need device nodes) granted to a running container: a
device kind's I/O half (no decision of its own; the PCI device kind decides which devices a
container gets).

Besides GPUs, a granted function bound to ``vfio-pci`` or with RDMA verbs gets its nodes
(:func:`numa_pin.enforcer.devnodes.function_nodes`) and their device rules the same way, and
the container a ``/run/numa-pin/devices.env`` of ``PCIDEVICE_<RESOURCE>=<addresses>`` lines (what
precreate writes into the spec's environment; a VF with a netdev needs no node and gets its
interface moved instead).

* enforce: at the container's first start with a pid, open its device cgroup to the granted
  GPUs (``devices.allow`` on cgroup v1, the device programs on v2) and create their nodes (and
  the GPU list file) in its mount namespace; the grant's ``gpus`` records what was added;
* give_back (after a release's commit): a container released by hand that still runs loses
  them again; a dead container took them along with its namespace and cgroup;
* runtime (precreate, NRI): the same nodes, rules and variables, for the runtime to apply.
"""

from __future__ import annotations

from numa_pin.errors import NumaPinError
from numa_pin.ledger.model import KIND_PROCESS, Grant
from numa_pin.ledger.records import GpuAccess
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release
from numa_pin.topology.model import KIND_GPU

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numa_pin.enforcer.devnodes import DeviceNode
    from numa_pin.requests.request import ContainerRequest
    from numa_pin.resources.node.runtime import RuntimeAsk, RuntimeEdit
    from numa_pin.topology.model import PciDevice


class GpuNode(NodeResource):
    name = "gpu"

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if not admission.devices_pending(decided):
            return admission
        grant, pid = admission.grant, admission.pid
        assert pid is not None
        if grant.kind == KIND_PROCESS:  # `numa-pin run`: a plain process keeps the host's device
            return admission            # access; there is no container to open devices in
        gpus = _gpus(node, grant)
        others, variables = _other_functions(node, grant)
        env = "".join(f"{key}={value}\n" for key, value in variables.items())
        if not gpus and not others and not env:
            return admission
        from numa_pin.enforcer.devnodes import create_device_nodes, expose_gpus
        from numa_pin.enforcer.gpu import allow_device_rules, gpu_rules

        cfg, undo = node.config, admission.undo
        # one set of rules for GPUs and other functions, so a v2 device program is swapped once
        rules_needed = gpu_rules(gpus, cfg.proc_root) if gpus else ()
        rules_needed = tuple(dict.fromkeys((*rules_needed, *(n.rule for n in others))))
        allowed = allow_device_rules(rules_needed, pid, cfg.proc_root, cfg.cgroup_root, node.layout(),
                                     undo) if rules_needed else None
        nodes = list(expose_gpus(gpus, pid, cfg.proc_root, admission.rootfs, undo)) if gpus else []
        if others or env:  # a VF with a network interface has no node, but its address goes in the file too
            nodes += create_device_nodes(pid, others, cfg.proc_root, admission.rootfs, undo, env_text=env or None)
        rules = [str(r) for r in allowed.added] if allowed is not None else []
        if not nodes and not rules:
            return admission
        # what a release of a live container takes back
        v2 = allowed is not None and allowed.version == 2
        return admission.updated(gpus=GpuAccess(tuple(nodes), tuple(rules),
                                                allowed.cgroup_dir if allowed is not None and not v2 else None,
                                                tuple(allowed.bpf_dirs) if allowed is not None else ()))

    def give_back(self, node: Node, release: Release) -> list[str]:
        problems: list[str] = []
        for grant in release.gone:
            problems += _revoke(node, grant)
        return problems

    def runtime(self, node: Node, ask: RuntimeAsk) -> RuntimeEdit | None:
        """The granted GPUs' nodes and ``NVIDIA_VISIBLE_DEVICES`` (their UUIDs, unless the device
        plugin's value there names exactly them: it stays as written), the other functions' nodes
        and ``PCIDEVICE_*``, at the container's creation (an update carries no devices)."""
        grant = ask.grant
        if ask.request is None or not grant.devices:
            return None
        from numa_pin.resources.node.runtime import RuntimeEdit

        gpus = _gpus(node, grant)
        others, env = _other_functions(node, grant)
        nodes: list[DeviceNode] = []
        if gpus:
            from numa_pin.enforcer.devnodes import gpu_device_nodes
            from numa_pin.enforcer.gpu import read_uvm_major

            nodes += gpu_device_nodes(gpus, read_uvm_major(node.config.proc_root))
            if not _as_the_plugin_chose(node, ask.request, gpus):
                env["NVIDIA_VISIBLE_DEVICES"] = ",".join(g.gpu_uuid or g.address for g in gpus)
        return RuntimeEdit(devices=tuple(nodes + others), env=env) if nodes or others or env else None


def _gpus(node: Node, grant: Grant) -> list[PciDevice]:
    """The granted GPUs the topology knows, in grant order."""
    topology = node.topology
    return [dev for ids in grant.devices.values() for address in ids
            if (dev := topology.device(address)) is not None and dev.kind == KIND_GPU]


def _as_the_plugin_chose(node: Node, request: ContainerRequest, gpus: list[PciDevice]) -> bool:
    """True when the container's ``NVIDIA_VISIBLE_DEVICES`` names exactly ``gpus`` (the device
    plugin chose them, in its own words: an index, a UUID, a CDI name of any kind), each name
    resolved as the allocation resolved it: a configured resource's kind through the node's
    device inventory, another kind through the nodes its spec file gave the request."""
    from numa_pin.resources.nvidia import NVIDIA_GPU, VISIBLE_DEVICES, gpus_in_env

    topology, resources = node.topology, node.settings.device_resources
    configured = {r.name for r in resources} - {NVIDIA_GPU}
    devices = None
    if any(d.source == VISIBLE_DEVICES and d.kind in configured for d in request.fixed_cdi):
        from numa_pin.devices.inventory import inventory

        devices = inventory(topology, resources)
    named = gpus_in_env(request.fixed_gpus, request.fixed_cdi, topology, request.fixed_nodes, devices)
    return named is not None and named == {g.address for g in gpus}


def _other_functions(node: Node, grant: Grant) -> tuple[list[DeviceNode], dict[str, str]]:
    """The nodes of the granted functions that are not GPUs, and their ``PCIDEVICE_*`` variables
    (as sriov-network-device-plugin sets them)."""
    from numa_pin.enforcer.devnodes import function_nodes, pcidevice_env
    from numa_pin.resources.devices import ASSIGNED

    nodes: dict[str, DeviceNode] = {}
    env: dict[str, str] = {}
    for res, ids in sorted(grant.devices.items()):
        devs = [d for a in ids if (d := node.topology.device(a)) is not None]
        if res == ASSIGNED or not devs or any(d.kind == KIND_GPU for d in devs):
            continue
        env[pcidevice_env(res)] = ",".join(ids)
        for dev in devs:
            nodes.update((n.path, n) for n in function_nodes(dev, node.config.sysfs_root))
    return list(nodes.values()), env


def _revoke(node: Node, grant: Grant) -> list[str]:
    """Take back the GPU nodes and device rules of a grant whose container still runs."""
    access = grant.gpus
    if access is None or grant.pid is None or not node.alive(grant):
        return []
    try:
        from numa_pin.enforcer.devnodes import remove_device_nodes
        from numa_pin.enforcer.gpu import revoke_granted_rules

        remove_device_nodes(grant.pid, list(access.nodes), node.config.proc_root, None)
        revoke_granted_rules(access.rules, access.devices_dir, access.bpf_dirs)
    except NumaPinError as exc:
        return [f"{grant.container_id}: GPU access not taken back: {exc}"]
    return []


__all__ = ["GpuNode"]
