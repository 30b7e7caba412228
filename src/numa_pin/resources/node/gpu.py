"""GPUs granted to a running container: a device kind's I/O half (no decision of its own; the
PCI device kind decides which GPUs a container gets).

* enforce: at the container's first start with a pid, open its device cgroup to the granted
  GPUs (``devices.allow`` on cgroup v1, the device programs on v2) and create their nodes (and
  the GPU list file) in its mount namespace; the grant's ``gpus`` records what was added;
* give_back (after a release's commit): a container released by hand that still runs loses
  them again; a dead container took them along with its namespace and cgroup.
"""

from __future__ import annotations

from numa_pin.errors import NumaPinError
from numa_pin.ledger.model import GpuAccess, Grant
from numa_pin.resources.node.base import Admission, Node, NodeResource, Release
from numa_pin.topology.model import KIND_GPU


class GpuNode(NodeResource):
    name = "gpu"

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if not admission.devices_pending(decided):
            return admission
        grant, pid = admission.grant, admission.pid
        assert pid is not None
        topology = node.topology
        gpus = [dev for ids in grant.devices.values() for address in ids
                if (dev := topology.device(address)) is not None and dev.kind == KIND_GPU]
        if not gpus:
            return admission
        from numa_pin.enforcer.devnodes import expose_gpus
        from numa_pin.enforcer.gpu import grant_gpus

        cfg, undo = node.config, admission.undo
        allowed = grant_gpus(gpus, pid, cfg.proc_root, cfg.cgroup_root, node.layout(), undo)
        nodes = expose_gpus(gpus, pid, cfg.proc_root, admission.rootfs, undo)
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
