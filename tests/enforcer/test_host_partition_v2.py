"""Host services and a top-level isolated partition on a Linux 6.1 node (cgroup v2, systemd).

Linux 6.1 refuses an empty ``cpuset.cpus`` on a populated cgroup (ENOSPC), so a host cgroup that
inherited its CPUs (``init.scope``, ``system.slice``) keeps an explicit list once host services
were narrowed and given back, whatever systemd's ``AllowedCPUs`` says. The kernel declares a
top-level isolated partition invalid while a sibling's own list shares its CPUs, and refuses a
sibling a list that takes a valid partition's CPUs (EINVAL). The fake kernel here does all
three; the fake ``systemctl`` is the one of ``test_systemd_units``. What must hold: the residue
never blocks a partition, host services never overlap one, every CPU comes back to the host
cgroups when the partition and the host grant are gone, and a sibling numa-pin does not hold
(an administrator's pin) refuses the partition in one line before anything is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_systemd_units import SystemdNode

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.enforcer import cgroups
from numa_pin.enforcer.saved import FILE as SAVED
from numa_pin.errors import EnforcementError, IsolationError
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService

HOST = ("init.scope", "system.slice", "user.slice")
HOST_ASK = {"numa-pin.io/host-services": "disable"}
LB_ASK = {"cpu-load-balancing.crio.io": "disable"}


class Linux61(SystemdNode):
    """The systemd node with populated host cgroups that inherit their CPUs, containers at the top
    of the hierarchy (cgroupfs), and partitions as Linux 6.1 makes them."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(root, monkeypatch)
        shutil.rmtree(self.fake.cgroup_root / "cpuset")  # the kit's v1 cpuset, not a host cgroup here
        for rel in (*HOST, "system.slice/ssh.service"):
            d = self.tree.mkcg("/" + rel)
            (d / "cpuset.cpus.partition").write_text("member\n")
            self.kernel.populated.add(str(d))
        monkeypatch.setattr(cgroups, "write_cgroup_file", self.write)
        self.partition_writes: list[tuple[str, str]] = []

    @property
    def online(self) -> frozenset[int]:
        return parse_list(self.fake.cpus)

    def top(self, name: str, pid: int) -> int:
        d = self.tree.mkcg(f"/{name}")
        (d / "cpuset.cpus.partition").write_text("member\n")
        proc = self.fake.proc_root / str(pid)
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "cgroup").write_text(f"0::/{name}\n")
        return pid

    def stop(self, name: str, pid: int) -> None:
        """The container ended: its cgroup and process are gone."""
        shutil.rmtree(self.tree.hierarchy / name)
        shutil.rmtree(self.fake.proc_root / str(pid))

    def cpus(self, rel: str) -> str:
        return (self.tree.hierarchy / rel / "cpuset.cpus").read_text().strip()

    def partitions(self) -> dict[Path, frozenset[int]]:
        h = self.tree.hierarchy
        return {d: parse_list((d / "cpuset.cpus").read_text()) for d in h.iterdir()
                if (d / "cpuset.cpus.partition").exists()
                and (d / "cpuset.cpus.partition").read_text().strip() == "isolated"}

    def write(self, path: str, text: str) -> None:
        p = Path(path)
        h = self.tree.hierarchy
        if p.name == "cpuset.cpus.partition" and p.parent.parent == h:
            self.partition_writes.append((p.parent.name, text))
            mine = parse_list((p.parent / "cpuset.cpus").read_text())
            clash = [d.name for d in h.iterdir() if d.is_dir() and d != p.parent
                     and parse_list((d / "cpuset.cpus").read_text()) & mine]
            state = f"isolated invalid (Cpu list in cpuset.cpus not exclusive: {clash})" if clash else text
            p.write_text(state + "\n")
            taken = frozenset().union(*self.partitions().values())
            (h / "cpuset.cpus.effective").write_text(format_list(self.online - taken) + "\n")
            return
        if p.name == "cpuset.cpus" and p.parent.parent == h and text.strip():
            for d, held in self.partitions().items():
                if d != p.parent and parse_list(text) & held:
                    raise EnforcementError(f"writing {text!r} failed: Invalid argument", path=path)
        self.kernel(path, text)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Linux61:
    return Linux61(tmp_path / "n", monkeypatch)


def admit(service: NodeService, node: Linux61, name: str, pid: int, ask: dict[str, str]) -> frozenset[int]:
    grant = service.admit(request_from_oci(name, {"numa-pin.io/cpus": "2", **ask}), node.top(name, pid)).grant
    return grant.cpus


def leave_residue(service: NodeService, node: Linux61) -> None:
    """A host-services grant comes and goes: Linux keeps the host cgroups' lists explicit."""
    admit(service, node, "h", 4001, HOST_ASK)
    node.stop("h", 4001)
    service.release("h")
    assert all(parse_list(node.cpus(h)) == node.online for h in HOST), "explicit, every CPU"
    assert node.unit("system.slice") == {} or node.unit("system.slice").get("AllowedCPUs") == ""


def host_lists(node: Linux61) -> dict[str, frozenset[int]]:
    return {h: parse_list(node.cpus(h)) for h in HOST}


@pytest.mark.parametrize("host_too", [False, True], ids=["partition-alone", "partition-and-host-services"])
def test_the_residue_of_host_services_does_not_block_a_top_level_partition(node, host_too):
    service = NodeService(node.config)
    leave_residue(service, node)
    cpus = admit(service, node, "b", 4002, {**LB_ASK, **(HOST_ASK if host_too else {})})
    assert (node.tree.hierarchy / "b" / "cpuset.cpus.partition").read_text().strip() == "isolated"
    assert all(not listed & cpus for listed in host_lists(node).values()), host_lists(node)
    service.release("b")
    assert host_lists(node) == dict.fromkeys(HOST, node.online), "every CPU back"
    assert (node.tree.hierarchy / "b" / "cpuset.cpus.partition").read_text().strip() == "member"


def test_host_services_beside_a_live_partition_stay_off_it_and_come_back(node):
    service = NodeService(node.config)
    part = admit(service, node, "b", 4002, LB_ASK)
    host = admit(service, node, "c", 4003, HOST_ASK)
    assert all(listed == node.online - part - host for listed in host_lists(node).values()), host_lists(node)
    node.stop("c", 4003)
    service.release("c")  # Linux refuses the empty list: what they would inherit, not the partition
    assert all(listed == node.online - part for listed in host_lists(node).values()), host_lists(node)
    node.stop("b", 4002)
    service.release("b")
    assert host_lists(node) == dict.fromkeys(HOST, node.online)
    saved = json.loads((node.fake.state_dir / SAVED).read_text())
    assert saved and all(entry["residue"] and entry["value"] == "" for entry in saved.values()), saved
    service.reconcile()
    assert host_lists(node) == dict.fromkeys(HOST, node.online), "a reconcile leaves them as they are"


def test_reconcile_keeps_residues_off_a_partition(node):
    service = NodeService(node.config)
    leave_residue(service, node)
    cpus = admit(service, node, "b", 4002, LB_ASK)
    (node.tree.hierarchy / "user.slice" / "cpuset.cpus").write_text(node.fake.cpus + "\n")  # an outside writer
    service.reconcile()
    assert not parse_list(node.cpus("user.slice")) & cpus


def test_a_pinned_sibling_refuses_the_partition_before_any_write(node):
    service = NodeService(node.config)
    (node.tree.hierarchy / "user.slice" / "cpuset.cpus").write_text(node.fake.cpus + "\n")  # an administrator's
    before = {h: node.cpus(h) for h in HOST}
    ledger = service.ledger.read()
    with pytest.raises(IsolationError) as err:
        admit(service, node, "b", 4002, LB_ASK)
    assert "user.slice" in str(err.value) and "\n" not in str(err.value)
    assert {h: node.cpus(h) for h in HOST} == before and service.ledger.read() == ledger
    assert node.partition_writes == [], "refused before the partition is tried"


@pytest.mark.parametrize(
    "pin, says",
    [(None, "only where the container's cgroup is at the top of the hierarchy"),
     ("user.slice", "cannot: this kernel has no cpuset.cpus.exclusive (a nested partition needs Linux 6.7), "
                    "and at the top: user.slice lists CPUs 1 in its own cpuset (host services and an isolated "
                    "partition cannot both have them)")],
    ids=["nothing-pinned", "pinned-host-cgroup"],
)
def test_plan_says_when_the_node_cannot_have_a_partition_beside_the_host(node, pin, says):
    """``plan`` (the grant has no cgroup yet) on this 6.1 node: a residue numa-pin holds does not
    count, a list it does not hold does."""
    from numa_pin.ledger.model import Grant
    from numa_pin.resources.node.isolation import preview

    service = NodeService(node.config)
    leave_residue(service, node)
    if pin is not None:
        (node.tree.hierarchy / pin / "cpuset.cpus").write_text("1-3\n")
        (node.fake.state_dir / SAVED).write_text(json.dumps(
            {k: v for k, v in json.loads((node.fake.state_dir / SAVED).read_text()).items() if f"/{pin}/" not in k}))
    grant = Grant("p", "p", "p", "exclusive", cpus=frozenset({1}), isolation={"load_balancing": "disable"})
    line = preview(service, service.ledger.read().with_grant(grant), grant, applied=False)["cpu-load-balancing"]
    assert says in line, line
