"""SR-IOV VFs through the NRI plugin (issue 34, item 2): granted at CreateContainer, moved at
StartContainer into the container's network namespace (container scope) or the pod's (pod scope)
with ``numa-pin.io/vf-config`` set on the PF, and given back at StopContainer/RemoveContainer.

The machine is the kit's ``gpu8-sriov`` with the service tests' fake PF and netlink
(``tests/service/vf_world.py``). Under Kubernetes a container has no network namespace of its
own: it joins its pod's, which the pod's pause process holds for the pod's whole life. So here a
namespace is what ``proc/<pid>/ns/net`` points to (:func:`shared_netns`), the pause process keeps
the pod's, and the container's process is gone when the runtime sends StopContainer. Oracles: the
prestart hook's admission of the same request on a twin node (the same VF, settings and place),
and the machine as it was before (everything back after the stop).
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService

from .fake_runtime import Connected, container, pod


@pytest.fixture(autouse=True)
def told(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """What the container is told in its ``devices.env`` at StartContainer (the VF's
    ``PCIDEVICE_*`` line), kept here in place of the child that joins its mount namespace: the
    fake node's pids have none."""
    texts: list[str | None] = []

    def create(pid: Any, nodes: Any, *args: Any, env_text: str | None = None, **kwargs: Any) -> tuple[str, ...]:
        texts.append(env_text)
        return tuple(node.path for node in nodes)

    monkeypatch.setattr("numa_pin.enforcer.devnodes.create_device_nodes", create)
    return texts

_spec = importlib.util.spec_from_file_location(
    "nri_vf_world", Path(__file__).resolve().parents[1] / "service" / "vf_world.py")
assert _spec is not None and _spec.loader is not None
vf_world: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vf_world)

PAUSE, PID = 100, 7001
POD_ID = "sandbox-u1"


def shared_netns(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake netlink keyed by namespace identity (what ``proc/<pid>/ns/net`` points to) rather
    than by path, so the processes of one pod share one namespace, as the kernel has it."""
    from numa_pin.enforcer import netlink
    from numa_pin.errors import EnforcementError

    world = node.world
    host = os.path.join(world.proc_root, "self", "ns", "net")

    def key(path: str | None) -> str:
        if path is None or path == host:
            return vf_world.HOST
        return os.path.realpath(path) if os.path.lexists(path) else path

    def open_netns(path: str) -> int:
        if key(path) not in world.ns:
            raise EnforcementError("cannot open the network namespace: No such file or directory", path=path)
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        world.fds[fd] = key(path)
        return fd

    @contextmanager
    def iproute(netns: str | None = None):
        if key(netns) not in world.ns:
            raise EnforcementError("cannot open a netlink socket: No such file", path=netns)
        yield vf_world.fakes.FakeIPRoute(world, key(netns))

    monkeypatch.setattr(netlink, "iproute", iproute)
    monkeypatch.setattr(netlink, "open_netns", open_netns)


class K8sVfNode(vf_world.VfNode):
    """The VF node with pods: a pod's namespace is created with its pause process."""

    def __init__(self, root: Path, machines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(root, machines, monkeypatch)
        shared_netns(self, monkeypatch)
        self.world.ns[str(self.join_netns(PAUSE, "pod-u1").resolve())] = {}
        self.original = self.snapshot()

    def pod_netns(self) -> str:
        return str((self.root / "netns" / "pod-u1").resolve())


def _annotations(scope: str) -> dict[str, str]:
    return {"numa-pin.io/devices": f"{vf_world.VF_RES}=1", "numa-pin.io/vf-config": vf_world.SETTINGS,
            "numa-pin.io/scope": scope}


def prestart_effect(tmp: Path, machines: Path, monkeypatch: pytest.MonkeyPatch, scope: str) -> Any:
    """The oracle: the hook's admission of the same request, with the pid, on a twin node."""
    twin = K8sVfNode(tmp / "twin", machines, monkeypatch)
    twin.add_container("c1", PID, netns="pod-u1")
    annotations = {"io.kubernetes.cri.sandbox-id": POD_ID, "io.kubernetes.cri.container-name": "c1",
                   **_annotations(scope)}
    NodeService(twin.config).admit(request_from_oci("c1", annotations), PID)
    vfs, where = twin.snapshot()
    return vfs, {bdf: (ns.replace(twin.pod_netns(), "POD"), *rest) for bdf, (ns, *rest) in where.items()}


@pytest.mark.parametrize("end", ["stop", "remove-event"])
@pytest.mark.parametrize("scope", ["container", "pod"])
def test_a_vf_goes_in_at_start_with_its_settings_and_back_at_the_end(
        tmp_path: Path, machines: Path, monkeypatch: pytest.MonkeyPatch, m, scope: str, end: str) -> None:
    expected = prestart_effect(tmp_path, machines, monkeypatch, scope)
    node = K8sVfNode(tmp_path / "n", machines, monkeypatch)
    conn = Connected(NodeService(node.config), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        p = pod(m, "u1", "p", "", _annotations(scope))
        ctr = container(m, p, "c1")
        ctr.linux.cgroups_path = f"/{node.parent}/c1"
        code, text, _ = conn.runtime.create(p, ctr)
        assert code == 0, text
        ledger = conn.session.handler.service.ledger
        (vf,) = ledger.read().grants["c1"].devices[vf_world.VF_RES]
        assert node.snapshot() == node.original, "nothing moves before the container's namespace is known"

        node.add_container("c1", PID, netns="pod-u1")  # the runtime makes it in the pod's namespace
        ctr.pid = PID
        code, text, _ = conn.runtime.start(p, ctr)
        assert code == 0, text
        vfs, where = node.snapshot()
        assert node.world.where(vf) == (node.pod_netns(), "net1"), "in the namespace the container runs in"
        got = (vfs, {bdf: (ns.replace(node.pod_netns(), "POD"), *rest) for bdf, (ns, *rest) in where.items()})
        assert got == expected, "the VF, its settings on the PF and its place are the prestart hook's"
        assert vfs != node.original[0], "the settings reached the PF"
        record = ledger.read().pods.get(POD_ID)
        assert (record is not None and [n.address for n in record.netdevs] == [vf]) is (scope == "pod")

        node.stop_container("c1", PID)  # the container ended; the pod (its pause process) lives on
        code, text, _ = conn.runtime.stop(p, ctr) if end == "stop" else conn.runtime.remove(p, ctr)
        assert code == 0, text
        assert "c1" not in ledger.read().grants and POD_ID not in ledger.read().pods
        assert node.snapshot() == node.original, "the VF is home with its PF-side state as before"
        assert node.journaled() == {}
        assert not any("not restored" in line for line in conn.log), conn.log
    finally:
        conn.close()


def test_containers_of_one_pod_share_its_namespace_and_its_names(
        tmp_path: Path, machines: Path, monkeypatch: pytest.MonkeyPatch, m) -> None:
    """Container scope under Kubernetes: two containers of one pod, a VF each, both in the pod's
    namespace; the second VF takes the next free name there, and each goes back with its own
    container while the other stays."""
    node = K8sVfNode(tmp_path / "n", machines, monkeypatch)
    conn = Connected(NodeService(node.config), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        p = pod(m, "u1", "p", "", _annotations("container"))
        ctrs = {}
        for i, cid in enumerate(("c1", "c2")):
            ctrs[cid] = ctr = container(m, p, cid)
            ctr.linux.cgroups_path = f"/{node.parent}/{cid}"
            assert conn.runtime.create(p, ctr)[0] == 0
            node.add_container(cid, PID + i, netns="pod-u1")
            ctr.pid = PID + i
            code, text, _ = conn.runtime.start(p, ctr)
            assert code == 0, text
        grants = conn.session.handler.service.ledger.read().grants
        vf1, vf2 = (grants[c].devices[vf_world.VF_RES][0] for c in ("c1", "c2"))
        assert node.world.where(vf1) == (node.pod_netns(), "net1")
        assert node.world.where(vf2) == (node.pod_netns(), "net2")

        node.stop_container("c1", PID)
        assert conn.runtime.stop(p, ctrs["c1"])[0] == 0
        assert node.world.where(vf1)[0] == vf_world.HOST and node.world.where(vf2) == (node.pod_netns(), "net2")
        node.stop_container("c2", PID + 1)
        assert conn.runtime.stop(p, ctrs["c2"])[0] == 0
        assert node.snapshot() == node.original and node.journaled() == {}
        assert not any("not restored" in line for line in conn.log), conn.log
    finally:
        conn.close()
