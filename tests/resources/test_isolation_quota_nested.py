"""``cpu-quota`` on a fake cgroup v2 tree where the container's process sits below the grant's
cgroup (crun's ``<scope>/container``, under the systemd and cgroupfs drivers): every cgroup from
the grant's down to the process's loses its quota, ``reconcile`` repairs each of them, and the
release gives each its own back; a cgroup below that does not hold the process is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.cgroups import ref_from_path
from numa_pin.enforcer.undo import UndoLog
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.resources.node.base import Admission, Node, Release
from numa_pin.resources.node.isolation import QuotaNode
from numa_pin.resources.node.registry import settings_from_config

ORIGINAL = "150000 50000"
#: what crun writes from the spec (kubelet's or podman's limit), and an outside writer later
RUNTIME = "100000 100000"
POD = "/kubepods.slice/kubepods-pod1.slice"

CASES = [
    # (grant's cgroup, where the process sits, the cgroups that lose their quota)
    ("/machine.slice/libpod-a.scope", "/machine.slice/libpod-a.scope/container",
     ["machine.slice/libpod-a.scope", "machine.slice/libpod-a.scope/container"]),
    ("/machine.slice/libpod-a.scope", "/machine.slice/libpod-a.scope",
     ["machine.slice/libpod-a.scope"]),
    ("/libpod_parent/libpod-a", "/libpod_parent/libpod-a/container",
     ["libpod_parent/libpod-a", "libpod_parent/libpod-a/container"]),
    (f"{POD}/crio-a.scope", f"{POD}/crio-a.scope/container",
     [POD[1:], f"{POD[1:]}/crio-a.scope", f"{POD[1:]}/crio-a.scope/container"]),
    ("/machine.slice/libpod-a.scope", None,
     ["machine.slice/libpod-a.scope", "machine.slice/libpod-a.scope/container"]),
]
IDS = ["crun-systemd", "runc-systemd", "crun-cgroupfs", "crun-kubernetes-pod", "crun-pid-gone"]


def make(tmp_path: Path, cgroup: str, at: str | None) -> tuple[Node, Grant, Path]:
    root = tmp_path / "cg"
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(f"30 25 0:26 / {root} rw - cgroup2 cgroup2 rw\n")
    top = cgroup.lstrip("/")
    for rel in (top, f"{top}/container", f"{top}/other", POD[1:]):  # crun makes container; other holds no pid
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "cpu.max").write_text(ORIGINAL + "\n")
    if at is not None:
        (proc / "4242").mkdir()
        (proc / "4242" / "cgroup").write_text(f"0::{at}\n")
    node = Node(config_from_dict({"cgroup_root": str(root), "proc_root": str(proc),
                                  "state_dir": str(tmp_path / "state"), "syslog": False}), None,
                make_settings=settings_from_config)
    grant = Grant("a", "p", "a", "exclusive", pid=4242, cgroup=cgroup, cpus=frozenset({1}),
                  isolation={"quota": "disable"})
    return node, grant, root


def quotas(root: Path) -> dict[str, str]:
    return {str(p.parent.relative_to(root)): p.read_text().strip() for p in sorted(root.rglob("cpu.max"))}


@pytest.mark.parametrize("cgroup, at, cleared", CASES, ids=IDS)
def test_quota_reaches_the_process_cgroup_is_repaired_and_restored(tmp_path, cgroup, at, cleared):
    node, grant, root = make(tmp_path, cgroup, at)
    before = quotas(root)
    expect = {rel: ("max 50000" if rel in cleared else value) for rel, value in before.items()}
    state = LedgerState({"a": grant})
    ref = ref_from_path(cgroup, str(root), node.layout())
    QuotaNode().enforce(node, Admission(grant, state, UndoLog(), ref, grant.pid, None, (), True), grant)
    assert quotas(root) == expect

    deepest = root / cleared[-1] / "cpu.max"
    deepest.write_text(RUNTIME + "\n")  # an outside writer (the runtime's update, a person)
    assert QuotaNode().repair(node, state, UndoLog()) == ["a"]
    assert quotas(root) == {**expect, cleared[-1]: "max 100000"}, "no quota, the period as the writer left it"

    QuotaNode().release(node, Release(state, LedgerState(), grant, (grant,), UndoLog()))
    assert quotas(root) == before


def test_a_process_outside_the_grant_cgroup_adds_nothing(tmp_path):
    """A recycled pid elsewhere in the tree is not followed: only the grant's cgroup loses its quota."""
    node, grant, root = make(tmp_path, "/machine.slice/libpod-a.scope", "/system.slice/cron.service")
    (root / "system.slice" / "cron.service").mkdir(parents=True)
    (root / "system.slice" / "cron.service" / "cpu.max").write_text(ORIGINAL + "\n")
    assert sorted(QuotaNode().targets(node, grant)) == [str(root / "machine.slice/libpod-a.scope/cpu.max")]


@pytest.mark.parametrize(
    "top, leaf, below",
    [("/a.scope", "/a.scope", []),
     ("/a.scope", "/a.scope/container", ["/a.scope/container"]),
     ("/s/a.scope/", "/s/a.scope/container/init.scope", ["/s/a.scope/container", "/s/a.scope/container/init.scope"]),
     ("/s/a.scope", "/s/a.scopex/container", []),
     ("/s/a.scope", "/s", []),
     ("/a", "/a" + "/x" * 9, [])],
    ids=["itself", "crun", "two-levels", "a-prefix-is-not-a-parent", "above", "too-deep"],
)
def test_path_below(top, leaf, below):
    from numa_pin.enforcer.proccgroup import path_below

    assert path_below(top, leaf) == below
