"""A crash and a reboot between two boots' grants: every knob puts back what *this* boot had.

A container killed with -9 and a power cut leave the old boot's grant in the ledger, its saved
originals (``isolation.json``) and its IRQ and partition journal. After the reboot the node's
settings are the new boot's own, which may differ from the last boot's. The first isolated
grant of the new boot must save the new boot's values (an original of an earlier boot counts as
absent), and its release must write them back. The oracle is the fake node's files as this
boot set them before the grant: after the release every one of them (every knob's, not only the
one asked) reads exactly the same.

The old grants go in one of four ways: ``numa-pin serve`` or ``status`` as the node starts
(``drop_earlier_boots``), a ``reconcile`` before the first container, the first admission
itself finding them dead, or dropped from the ledger with their saved originals and journal
left behind (what ``drop_earlier_boots`` did before it settled them: the files of an earlier
boot must count as absent by themselves). The new boot's container is either the same one started again (its
id, and so its cgroup, kept: ``podman start``) or another.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from isolation_fakes import affinities, make_irqs

from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer.saved import FILE as SAVED
from numa_pin.ledger.liveness import collect_garbage
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import journal
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

HOST = ("system.slice", "user.slice", "init.scope", "system.slice/ssh.service")
POLICIES = ("policy0", "policy1", "policy2", "policy3", "policy4", "policy5", "policy6", "policy7")
IRQS = (0, 1, 9, 24)

#: what each boot's kernel and services start with (the two boots differ in every file)
BOOTS = {
    "boot-1": {"latency": "0", "governor": "powersave", "quota": "50000", "host": "0-7", "irq": "0-7",
               "default": "ff", "balance": "1"},
    "boot-2": {"latency": "20", "governor": "ondemand", "quota": "20000", "host": "1-7", "irq": "1-6",
               "default": "7e", "balance": "1"},
}


class BootNode(FakeNode):
    """The kit's laptop (8 CPUs) on cgroup v1 (cpuset and cpu hierarchies) with every file an
    isolation knob writes: PM QoS, cpufreq, CFS quota, host cgroups, IRQs, load balancing."""

    def __init__(self, root: Path, machines: Path) -> None:
        super().__init__(root, "laptop", machines=machines)
        with open(self.proc_root / "self" / "mountinfo", "a") as f:
            f.write(f"36 25 0:31 / {self.cgroup_root}/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
        self.config = config_from_dict(self.config_dict())
        self.containers: dict[str, int] = {}

    @property
    def cpu_dir(self) -> Path:
        return self.sysfs_root / "devices" / "system" / "cpu"

    def boot(self, boot_id: str) -> None:
        """Power on: a new boot id, and every setting as this boot's kernel and services make it."""
        values = BOOTS[boot_id]
        random = self.proc_root / "sys" / "kernel" / "random"
        random.mkdir(parents=True, exist_ok=True)
        (random / "boot_id").write_text(boot_id + "\n")
        for n in range(8):
            (self.cpu_dir / f"cpu{n}" / "power").mkdir(exist_ok=True)
            (self.cpu_dir / f"cpu{n}" / "power" / "pm_qos_resume_latency_us").write_text(values["latency"] + "\n")
        for n, policy in enumerate(POLICIES):
            d = self.cpu_dir / "cpufreq" / policy
            d.mkdir(parents=True, exist_ok=True)
            (d / "related_cpus").write_text(f"{n}\n")
            (d / "scaling_governor").write_text(values["governor"] + "\n")
            (d / "scaling_available_governors").write_text("performance powersave ondemand\n")
        for name in HOST:
            self._write_cpuset(self.cgroup_root / "cpuset" / name, values["host"])
        (self.cgroup_root / "cpuset" / "cpuset.sched_load_balance").write_text("0\n")
        (self.cgroup_root / "cpuset" / self.parent).mkdir(parents=True, exist_ok=True)
        (self.cgroup_root / "cpuset" / self.parent / "cpuset.sched_load_balance").write_text(values["balance"] + "\n")
        make_irqs(self.proc_root, dict.fromkeys(IRQS, values["irq"]), values["default"])
        self.values = values

    def start(self, name: str, pid: int) -> None:
        """The container's cgroups (cpuset and cpu, this boot's quota) and its process."""
        self.add_container(name, pid)
        (self.cgroup_dir(name) / "cpuset.sched_load_balance").write_text(self.values["balance"] + "\n")
        d = self.cgroup_root / "cpu,cpuacct" / self.parent / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.cfs_quota_us").write_text(self.values["quota"] + "\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
        self.containers[name] = pid

    def power_cut(self) -> None:
        """Every container killed with -9, then the power: no poststop, no release; cgroups and
        processes are gone, the state directory stays."""
        for name, pid in self.containers.items():
            self.stop_container(name, pid)
            shutil.rmtree(self.cgroup_root / "cpu,cpuacct" / self.parent / name, ignore_errors=True)
        self.containers = {}

    def settings(self) -> dict[str, str]:
        """Every file any knob may write, as text."""
        out = {f"pm_qos cpu{n}": (self.cpu_dir / f"cpu{n}" / "power" / "pm_qos_resume_latency_us").read_text()
               for n in range(8)}
        out.update({f"governor {p}": (self.cpu_dir / "cpufreq" / p / "scaling_governor").read_text()
                    for p in POLICIES})
        out.update({f"quota {n}": (self.cgroup_root / "cpu,cpuacct" / self.parent / n / "cpu.cfs_quota_us").read_text()
                    for n in self.containers})
        out.update({f"host {h}": (self.cgroup_root / "cpuset" / h / "cpuset.cpus").read_text() for h in HOST})
        out.update({f"load balance {d}": (self.cgroup_root / "cpuset" / d / "cpuset.sched_load_balance").read_text()
                    for d in ("", self.parent, *(f"{self.parent}/{n}" for n in self.containers))})
        out.update({f"irq {k}": v for k, v in affinities(self.proc_root).items()})
        return {k: v.strip() for k, v in out.items()}


def admit(service: NodeService, name: str, pid: int, annotations: dict[str, str]) -> None:
    """Admit the started container ``name`` on CPU 4 with ``annotations``."""
    request = request_from_oci(name, {"numa-pin.io/cpus": "1", **annotations}, limits=ContainerLimits(cpuset="4"))
    assert service.admit(request, pid).grant.cpus == {4}


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    return tmp_path_factory.mktemp("machines")


@pytest.mark.parametrize("again", ["a", "b"], ids=["same-container-started-again", "another-container"])
@pytest.mark.parametrize("old_grants_go", ["agent-start", "reconcile", "admission", "dropped-unsettled"])
@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({"cpu-c-states.crio.io": "disable"}, id="pm-qos"),
        pytest.param({"cpu-freq-governor.crio.io": "performance"}, id="governor"),
        pytest.param({"cpu-quota.crio.io": "disable"}, id="quota"),
        pytest.param({"numa-pin.io/host-services": "disable"}, id="host-services"),
        pytest.param({"irq-load-balancing.crio.io": "disable"}, id="irqs"),
        pytest.param({"cpu-load-balancing.crio.io": "disable"}, id="load-balancing"),
    ],
)
def test_the_first_grant_after_a_crash_and_a_reboot_puts_back_this_boots_originals(
        tmp_path, machines, annotations, old_grants_go, again):
    node = BootNode(tmp_path / "n", machines)
    node.boot("boot-1")
    node.start("a", 100)
    first = node.settings()
    admit(NodeService(node.config), "a", 100, annotations)
    assert node.settings() != first
    node.power_cut()
    node.boot("boot-2")
    service = NodeService(node.config)
    if old_grants_go == "agent-start":
        assert [g.container_id for g in service.drop_earlier_boots()] == ["a"]
    elif old_grants_go == "reconcile":
        service.reconcile()
    elif old_grants_go == "dropped-unsettled":  # as drop_earlier_boots did: the ledger forgets, the files stay
        with service.ledger.transaction() as txn:
            txn.state = collect_garbage(txn.state, lambda g: False)[0]
        assert _saved(node) or (node.state_dir / journal.FILE).exists()
    if old_grants_go in ("agent-start", "reconcile"):  # settled as they went, nothing written back
        assert _saved(node) == {} and not (node.state_dir / journal.FILE).exists()
    node.start(again, 200)
    originals = node.settings()  # this boot's, the oracle
    admit(service, again, 200, annotations)
    assert node.settings() != originals, "the knob changed nothing: the test shows nothing"
    assert service.release(again) is not None
    assert node.settings() == originals
    assert _saved(node) == {}
    assert not (node.state_dir / journal.FILE).exists()
    assert service.reconcile() == ([], [])
    assert node.settings() == originals


def _saved(node: BootNode) -> dict[str, object]:
    path = node.state_dir / SAVED
    return json.loads(path.read_text()) if path.exists() else {}
