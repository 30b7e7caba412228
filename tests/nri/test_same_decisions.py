"""The hook path and the NRI path decide alike: one request set, two fresh nodes of one shape.

The hook gets each container as a runtime hands it over (a bundle's ``config.json`` and the OCI
state on stdin, ``prestart``); the plugin gets it as containerd's NRI does (``CreateContainer``
with the pod and the container). Both run in the same order; the grants in the two ledgers and
the refusals must match container by container.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numa_pin.config.schema import config_from_dict
from numa_pin.hook.invoke import HookRequest, run
from numa_pin.ledger.store import Ledger
from numa_pin.nri import messages as nri_messages
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

from .fake_runtime import Connected, container, pod

GI = 1 << 30
#: (container id, QoS directory, cpu request and limit in millicores, memory limit, annotations)
CASES = [
    ("g2", "", 2000, 2000, GI, {}),
    ("bu", "burstable", 500, 1500, GI, {}),
    ("be", "besteffort", 0, 0, 0, {}),
    ("g20", "", 20000, 20000, GI, {}),  # more than a NUMA node: refused under restricted
    ("ann", "burstable", 100, 0, 0, {"numa-pin.io/cpus": "3"}),
    ("g3", "", 3000, 3000, 2 * GI, {}),
    ("frac", "", 1500, 1500, GI, {}),  # Guaranteed with a fractional CPU: shared
    ("bad", "burstable", 100, 0, 0, {"numa-pin.io/nonsense": "1"}),
    ("g1", "", 1000, 1000, GI, {}),
    # a container with equal request and limit in a Burstable pod (another container of the pod has
    # none): only the cgroup parent shows kubelet's class, and it is not Guaranteed
    ("bu-eq", "burstable", 2000, 2000, GI, {}),
]


def _spec(cid: str, qos_dir: str, req: int, lim: int, mem: int, annotations: dict[str, str]) -> dict:
    """The config.json containerd writes for the same container (the CRI annotations included)."""
    cpu: dict[str, int] = {"shares": max(2, req * 1024 // 1000), "period": 100000}
    if lim:
        cpu["quota"] = lim * 100000 // 1000
    resources: dict[str, object] = {"cpu": cpu}
    if mem:
        resources["memory"] = {"limit": mem}
    parent = "/".join(p for p in ("/kubepods", qos_dir, f"pod{cid}") if p)
    return {
        "ociVersion": "1.1.0",
        "process": {"env": ["PATH=/usr/bin", "HOSTNAME=x"]},
        "annotations": {
            "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.container-name": cid,
            "io.kubernetes.cri.sandbox-id": f"sandbox-{cid}", "io.kubernetes.cri.sandbox-name": cid,
            "io.kubernetes.cri.sandbox-namespace": "default", **annotations,
        },
        "linux": {"cgroupsPath": f"{parent}/{cid}", "resources": resources},
    }


def _outcome(ledger: Ledger, cid: str, refusal: str | None) -> tuple:
    if refusal is not None:
        return ("refused", refusal)
    g = ledger.read().grants[cid]
    return (g.kind, sorted(g.cpus), sorted(g.mems), g.policy, g.scope)


@pytest.fixture
def nodes(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeNode, FakeNode]:
    machines = tmp_path_factory.getbasetemp() / "machines"
    return (FakeNode(tmp_path / "hook", "intel-2s-ht", machines=machines, parent=""),
            FakeNode(tmp_path / "nri", "intel-2s-ht", machines=machines, parent=""))


def test_the_hook_and_the_plugin_make_the_same_decisions(nodes: tuple[FakeNode, FakeNode], tmp_path: Path) -> None:
    hook_node, nri_node = nodes
    config = hook_node.write_config(policy="restricted", kubelet_root=str(tmp_path / "no-kubelet"))
    env = {"NUMA_PIN_CACHE_DIR": str(tmp_path / "cache")}
    m = nri_messages.load()
    conn = Connected(NodeService(config_from_dict(nri_node.config_dict(policy="restricted",
                                                                          kubelet_root=str(tmp_path / "no-kubelet")))), m)
    conn.runtime.configure()
    conn.runtime.synchronize([], [])
    by_hook, by_nri = {}, {}
    try:
        for pid, (cid, qos_dir, req, lim, mem, annotations) in enumerate(CASES, start=5000):
            spec = _spec(cid, qos_dir, req, lim, mem, annotations)
            rel = spec["linux"]["cgroupsPath"].lstrip("/")
            # the hook: the runtime made the cgroup and the process, then runs prestart
            hook_node.add_container(rel, pid)
            bundle = tmp_path / "bundles" / cid
            bundle.mkdir(parents=True)
            (bundle / "config.json").write_text(json.dumps(spec))
            state = json.dumps({"ociVersion": "1.1.0", "id": cid, "status": "creating", "pid": pid,
                                "bundle": str(bundle)}).encode()
            result = run(HookRequest(("--config", str(config), "prestart"), env, state, str(tmp_path)))
            by_hook[cid] = _outcome(Ledger(str(hook_node.state_dir)), cid,
                                    None if result.code == 0 else result.stderr[0].split(": ")[2])
            # the plugin: asked before the container exists; the runtime then makes it
            p = pod(m, cid, cid, qos_dir)
            p.id = f"sandbox-{cid}"
            c = container(m, p, cid, cpu_milli=req, limit_milli=lim, memory=mem, annotations=annotations)
            code, text, _ = conn.runtime.create(p, c)
            if code == 0:
                nri_node.add_container(rel, pid)
            by_nri[cid] = _outcome(Ledger(str(nri_node.state_dir)), cid, None if code == 0 else text.split(": ")[2])
    finally:
        conn.close()
    assert by_nri == by_hook
    kinds = [o[0] for o in by_hook.values()]
    assert kinds.count("refused") == 2 and "exclusive" in kinds and "shared" in kinds, "the set covers each outcome"
