"""Through the NRI plugin, a pod-scope pod whose totals come only from NRI's pod resources
(``PodSandbox.linux.pod_resources``, as containerd and CRI-O fill it from kubelet's sandbox
resources) gets the grants the same pod annotated ``numa-pin.io/pod-*`` gets (issue 34, item 2).

Each form runs on a fresh node of the kit's ``intel-2s-ht`` (16 CPUs and 54Gi free per node),
restricted, pod scope: two Guaranteed containers of 10 CPUs and 30Gi. With the totals (20 CPUs,
60Gi) the pod is aligned to both nodes and both are admitted; without them the second does not fit
the first's node, so the test fails if the pod resources are not read.
"""

from __future__ import annotations

from pathlib import Path

from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.nri import messages as nri_messages
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

from .fake_runtime import Connected, container, pod

GI = 1 << 30
FORMS = ("pod-resources", "annotations", "neither")


def _with_totals(m: nri_messages.Messages, form: str):
    p = pod(m, "u1", "p", "", {"numa-pin.io/scope": "pod"})
    if form == "annotations":
        p.annotations.update({"numa-pin.io/pod-cpus": "20", "numa-pin.io/pod-memory": "60Gi"})
    elif form == "pod-resources":  # kubelet's sandbox resources for request = limit = 20 CPUs, 60Gi
        cpu = p.linux.pod_resources.cpu
        cpu.shares.value, cpu.quota.value, cpu.period.value = 20 * 1024, 20 * 100000, 100000
        p.linux.pod_resources.memory.limit.value = 60 * GI
        overhead = p.linux.pod_overhead  # the runtime's own: not part of the totals
        overhead.cpu.shares.value, overhead.memory.limit.value = 256, 120 << 20
    return p


def run(tmp: Path, machines: Path, m: nri_messages.Messages, form: str) -> list[tuple]:
    """Create both containers; per container (answer code, its cpuset's CPU count, its grant's
    affinity), and the pod's affinity."""
    node = FakeNode(tmp / form, "intel-2s-ht", machines=machines, parent="")
    conn = Connected(NodeService(config_from_dict(node.config_dict(policy="restricted"))), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        p = _with_totals(m, form)
        out: list[tuple] = []
        for cid in ("c1", "c2"):
            code, _, reply = conn.runtime.create(p, container(m, p, cid, cpu_milli=10000, limit_milli=10000,
                                                              memory=30 * GI))
            cpus = reply.adjust.linux.resources.cpu.cpus
            out.append((code, len(parse_list(cpus)) if code == 0 else 0))
        state = conn.session.handler.service.ledger.read()
        out.append(tuple(sorted(state.pods[p.id].affinity)) if p.id in state.pods else None)
        return out
    finally:
        conn.close()


def test_pod_resources_give_the_grants_the_annotated_totals_give(tmp_path: Path, machines: Path, m) -> None:
    got = {form: run(tmp_path, machines, m, form) for form in FORMS}
    assert got["annotations"] == [(0, 10), (0, 10), (0, 1)], "both containers, the pod on both nodes"
    assert got["pod-resources"] == got["annotations"]
    assert got["neither"] != got["annotations"], "the totals must matter here (else the test proves nothing)"
