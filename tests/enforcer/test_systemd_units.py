"""Where systemd owns a container's cgroup, numa-pin sets the cpuset through systemd as well.

systemd writes a unit's cgroup files again from its own ``AllowedCPUs``/``AllowedMemoryNodes``
at every ``daemon-reload``; values written only to the files are then undone, and a property
another writer set (``systemctl set-property <scope> AllowedCPUs=0-3``) comes back. These tests
run the node service on a fake cgroup v2 tree with a fake ``systemctl`` on PATH that keeps unit
properties in a JSON file; :meth:`SystemdNode.daemon_reload` then does what systemd does (the
properties are written to the files through the fake kernel, an unset one as an empty list).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from enforcer_fakes import MOUNTINFO_V2, FakeCgroupTree, FakeKernel

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.base.deadline import Deadline
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer import cgroups, systemd
from numa_pin.enforcer.cgroups import CgroupRef
from numa_pin.enforcer.cpuset import apply_cpuset
from numa_pin.enforcer.undo import UndoLog
from numa_pin.errors import EnforcementError
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

SCOPE = "/machine.slice/libpod-{name}.scope"

FAKE_SYSTEMCTL = r'''
import json, os, sys, time
from pathlib import Path
state = Path(os.environ["FAKE_SYSTEMD_STATE"])
hierarchy = Path(os.environ["FAKE_SYSTEMD_CGROUP"])
args = sys.argv[1:]
with open(str(state) + ".log", "a") as log:
    log.write(json.dumps(args) + "\n")
if os.environ.get("FAKE_SYSTEMD_SLEEP"):
    time.sleep(float(os.environ["FAKE_SYSTEMD_SLEEP"]))
if args[0] == os.environ.get("FAKE_SYSTEMD_FAIL"):
    print(f"Failed to {args[0]}: Access denied", file=sys.stderr)
    sys.exit(1)
units = json.loads(state.read_text()) if state.exists() else {}
unit = args[args.index("--") + 1]
if args[0] == "show":
    loaded = any(p.is_dir() for p in hierarchy.rglob(unit))
    props = units.get(unit, {})
    print("LoadState=" + ("loaded" if loaded else "not-found"))
    print("ActiveState=" + ("active" if loaded else "inactive"))
    # systemd prints a CPU set as ranges split by spaces: 0 2-3
    print("AllowedCPUs=" + props.get("AllowedCPUs", "").replace(",", " "))
    print("AllowedMemoryNodes=" + props.get("AllowedMemoryNodes", "").replace(",", " "))
elif args[0] == "set-property":
    assert args[1] == "--runtime", args
    for assignment in args[args.index("--") + 2:]:
        key, _, value = assignment.partition("=")
        units.setdefault(unit, {})[key] = value
    state.write_text(json.dumps(units))
'''


class SystemdNode:
    """The kit's intel-2s-ht machine, cgroup v2, systemd as init and a fake systemctl on PATH."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, *, init: str = "systemd") -> None:
        self.fake = FakeNode(root, "intel-2s-ht", machines=root.parent / "machines")
        (self.fake.proc_root / "self" / "mountinfo").write_text(MOUNTINFO_V2)
        (self.fake.proc_root / "1").mkdir(exist_ok=True)
        (self.fake.proc_root / "1" / "comm").write_text(init + "\n")
        self.tree = FakeCgroupTree(self.fake.cgroup_root, 2, online_cpus=self.fake.cpus,
                                   online_mems=self.fake.mems)
        self.tree.mkcg("/machine.slice")
        self.kernel = FakeKernel(self.tree)
        monkeypatch.setattr(cgroups, "write_cgroup_file", self.kernel)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        tool = bin_dir / "systemctl"
        tool.write_text(f"#!{sys.executable}\n{FAKE_SYSTEMCTL}")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
        self.state = root / "units.json"
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv("FAKE_SYSTEMD_STATE", str(self.state))
        monkeypatch.setenv("FAKE_SYSTEMD_CGROUP", str(self.tree.hierarchy))
        self.config = config_from_dict(self.fake.config_dict(policy="single-numa-node"))

    def container(self, name: str, pid: int) -> int:
        rel = SCOPE.format(name=name)
        self.tree.mkcg(rel)
        proc = self.fake.proc_root / str(pid)
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "cgroup").write_text(f"0::{rel}\n")
        return pid

    def unit(self, name: str) -> dict[str, str]:
        units = json.loads(self.state.read_text()) if self.state.exists() else {}
        return dict(units.get(f"libpod-{name}.scope", {}))

    def calls(self) -> list[list[str]]:
        log = Path(str(self.state) + ".log")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def set_property(self, name: str, **props: str) -> None:
        """Another writer: ``systemctl set-property libpod-<name>.scope KEY=VALUE``."""
        units = json.loads(self.state.read_text()) if self.state.exists() else {}
        units.setdefault(f"libpod-{name}.scope", {}).update(props)
        self.state.write_text(json.dumps(units))

    def daemon_reload(self) -> None:
        """What systemd does to every scope's cgroup: its properties go back into the files."""
        units = json.loads(self.state.read_text()) if self.state.exists() else {}
        for d in sorted(self.tree.hierarchy.joinpath("machine.slice").iterdir()):
            if d.is_dir() and d.name.endswith(".scope"):
                props = units.get(d.name, {})
                self.kernel(str(d / "cpuset.mems"), props.get("AllowedMemoryNodes", ""))
                self.kernel(str(d / "cpuset.cpus"), props.get("AllowedCPUs", ""))

    def scope_ref(self, name: str) -> CgroupRef:
        """Container ``name``'s scope, made, as the enforcer is handed it."""
        rel = SCOPE.format(name=name)
        return CgroupRef(2, rel, str(self.tree.mkcg(rel)), driver=cgroups.DRIVER_SYSTEMD)

    def systemctl(self) -> systemd.Systemd:
        tool = systemd.detect(self.fake.proc_root)
        assert tool is not None
        return tool

    def effective_cpus(self, name: str) -> frozenset[int]:
        d = self.tree.hierarchy / SCOPE.format(name=name).lstrip("/")
        return parse_list((d / "cpuset.cpus.effective").read_text())


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SystemdNode:
    return SystemdNode(tmp_path / "n", monkeypatch)


@pytest.mark.parametrize(
    ("rel", "version", "unit"),
    [
        ("/machine.slice/libpod-abc.scope", 2, "libpod-abc.scope"),
        ("/system.slice/runc-x.scope", 2, "runc-x.scope"),
        ("/system.slice/containerd.service", 2, "containerd.service"),
        ("/kubepods.slice/kubepods-besteffort.slice", 2, "kubepods-besteffort.slice"),
        ("/init.scope", 2, None),
        ("/machine.slice/libpod-abc.scope", 1, None),
        ("/numa-pin/job", 2, None),
        ("/kubepods/burstable/pod1/abc", 2, None),
    ],
    ids=["podman-scope", "runc-scope", "service", "slice", "init-scope", "cgroup-v1", "cgroupfs", "kubepods-cgroupfs"],
)
def test_unit_of_a_cgroup(rel: str, version: int, unit: str | None) -> None:
    ref = CgroupRef(version, rel, "/sys/fs/cgroup" + rel, rel, cgroups._driver_of(rel))
    assert systemd.unit_of(ref) == unit


def test_an_exclusive_grant_is_set_on_its_scope_and_survives_daemon_reload(node: SystemdNode) -> None:
    service = NodeService(node.config)
    service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4001))
    grant = service.ledger.read().grants["x"]
    assert parse_list(node.unit("x")["AllowedCPUs"]) == grant.cpus
    assert parse_list(node.unit("x")["AllowedMemoryNodes"]) == grant.mems
    node.daemon_reload()
    assert node.effective_cpus("x") == grant.cpus


def test_drift_through_systemd_is_repaired_through_systemd(node: SystemdNode) -> None:
    service = NodeService(node.config)
    service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4001))
    grant = service.ledger.read().grants["x"]
    node.set_property("x", AllowedCPUs=node.fake.cpus)  # another writer, then a daemon-reload
    node.daemon_reload()
    assert node.effective_cpus("x") == parse_list(node.fake.cpus)
    _, repaired = service.reconcile()
    assert repaired == ["x"]
    assert parse_list(node.unit("x")["AllowedCPUs"]) == grant.cpus
    set_calls = len([c for c in node.calls() if c[0] == "set-property"])
    assert service.reconcile()[1] == [], "nothing drifted: nothing is repaired"
    assert len([c for c in node.calls() if c[0] == "set-property"]) == set_calls
    node.daemon_reload()
    assert node.effective_cpus("x") == grant.cpus, "the next daemon-reload keeps numa-pin's values"


def test_a_scope_its_runtime_already_pinned_costs_no_systemctl_call(node: SystemdNode) -> None:
    """NRI's StartContainer: the runtime applied the grant's cpuset at CreateContainer, through
    the unit it made (runc's and crun's systemd drivers put a spec's cpuset in the unit), so a
    systemd slow to answer then has nothing to fail; a scope whose files differ still asks it."""
    ref, tool = node.scope_ref("x"), node.systemctl()
    node.set_property("x", AllowedCPUs="2-3", AllowedMemoryNodes="1")  # the runtime's unit ...
    node.daemon_reload()  # ... and its files
    state = apply_cpuset(ref, {2, 3}, {1}, node.fake.cgroup_root, UndoLog(), systemd=tool)
    assert (state.effective_cpus, state.effective_mems) == ({2, 3}, {1})
    assert node.calls() == []
    apply_cpuset(ref, {3}, {1}, node.fake.cgroup_root, UndoLog(), systemd=tool)
    assert node.unit("x") == {"AllowedCPUs": "3", "AllowedMemoryNodes": "1"}
    assert [c[0] for c in node.calls()] == ["show", "set-property"]


def test_a_shared_scope_stays_off_exclusive_cpus_across_daemon_reload_and_grows_back(node: SystemdNode) -> None:
    service = NodeService(node.config)
    service.admit(request_from_oci("plain", {}), node.container("plain", 4001))
    assert node.calls() == [], "a plain container on a node without grants costs no systemctl call"
    service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4002))
    grant = service.ledger.read().grants["x"]
    pool = cpu_node.shared_pool(service, service.ledger.read())
    assert parse_list(node.unit("plain")["AllowedCPUs"]) == pool
    node.daemon_reload()
    assert not node.effective_cpus("plain") & grant.cpus, "exclusive means exclusive"
    service.release("x")
    assert parse_list(node.unit("plain")["AllowedCPUs"]) == parse_list(node.fake.cpus)
    node.daemon_reload()
    assert node.effective_cpus("plain") == parse_list(node.fake.cpus)


def test_a_failed_admission_puts_the_units_properties_back(node: SystemdNode) -> None:
    service = NodeService(node.config)
    pid = node.container("x", 4001)
    scope = node.tree.hierarchy / SCOPE.format(name="x").lstrip("/")
    node.kernel.fail[str(scope / "cpuset.cpus")] = "Device or resource busy"
    with pytest.raises(EnforcementError):
        service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), pid)
    assert node.unit("x") == {"AllowedCPUs": "", "AllowedMemoryNodes": ""}
    assert [c[0] for c in node.calls()] == ["show", "set-property", "set-property"]
    assert "x" not in service.ledger.read().grants


def test_a_failing_systemctl_refuses_the_admission_and_names_the_unit(
    node: SystemdNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SYSTEMD_FAIL", "set-property")
    service = NodeService(node.config)
    with pytest.raises(EnforcementError, match=r"libpod-x\.scope.*Access denied"):
        service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4001))
    scope = node.tree.hierarchy / SCOPE.format(name="x").lstrip("/")
    assert (scope / "cpuset.cpus").read_text().strip() == "", "nothing was written"


def test_a_systemctl_that_hangs_is_given_up_on(node: SystemdNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SYSTEMD_SLEEP", "30")
    ref, tool = node.scope_ref("x"), node.systemctl()
    tool.timeout_s = 0.5
    with pytest.raises(EnforcementError, match=r"libpod-x\.scope: systemctl show .* ran past 0\.5s"):
        systemd.assert_unit_cpuset(tool, ref, frozenset({1}), None, UndoLog())


def test_inside_an_admission_systemctl_has_what_the_deadline_leaves(node: SystemdNode,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The admission's deadline (inside the runtime's timeout) bounds each call, not a fixed
    timeout of its own: a hung systemd never keeps the runtime waiting past it."""
    monkeypatch.setenv("FAKE_SYSTEMD_SLEEP", "30")
    ref, tool = node.scope_ref("x"), node.systemctl()
    tool.timeout_s = 60.0
    started = time.monotonic()
    with Deadline(0.5, "admission of x").active():
        with pytest.raises(EnforcementError, match=r"libpod-x\.scope: systemctl show .* ran past 0\.[0-9]+s"):
            systemd.assert_unit_cpuset(tool, ref, frozenset({1}), None, UndoLog())
    assert time.monotonic() - started < 5


def test_a_unit_change_goes_back_after_the_deadline_passed(node: SystemdNode) -> None:
    """Past the deadline no new systemctl call starts, but a rollback still puts the unit's old
    properties back (bounded by the tool's own timeout)."""
    ref, tool = node.scope_ref("x"), node.systemctl()
    node.set_property("x", AllowedCPUs="0-3")
    undo = UndoLog()
    budget = Deadline(30.0, "admission of x")
    with budget.active():
        assert systemd.assert_unit_cpuset(tool, ref, frozenset({1}), None, undo)
        assert node.unit("x")["AllowedCPUs"] == "1"
        budget.expires = time.monotonic()  # spent meanwhile
        with pytest.raises(EnforcementError, match=r"no time left for systemctl show .*deadline passed"):
            systemd.assert_unit_cpuset(tool, ref, frozenset({2}), None, UndoLog())
        assert not undo.rollback()
    assert node.unit("x")["AllowedCPUs"] == "0-3"


@pytest.mark.parametrize("init", ["init", "busybox"], ids=["sysvinit", "busybox"])
def test_without_systemd_no_unit_is_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, init: str) -> None:
    node = SystemdNode(tmp_path / "n", monkeypatch, init=init)
    service = NodeService(node.config)
    service.admit(request_from_oci("plain", {}), node.container("plain", 4001))
    service.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.container("x", 4002))
    assert service.systemd() is None
    assert node.calls() == []
    assert format_list(node.effective_cpus("x")) == format_list(service.ledger.read().grants["x"].cpus)


FAKE_BUSCTL = r'''
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SYSTEMD_STATE"] + ".bus", "a") as log:
    log.write(json.dumps(args) + "\n")
unit, pid = args[6], args[12]
with open(os.path.join(os.environ["FAKE_PROC"], pid, "cgroup"), "w") as f:
    f.write("0::/system.slice/" + unit + "\n")
print('o "/org/freedesktop/systemd1/job/42"')
'''


def test_numa_pin_run_gets_a_transient_scope_of_its_own(node: SystemdNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """``StartTransientUnit`` over busctl with the job's pid, then the kernel shows it in the scope."""
    tool = node.tree.root.parent / "bin" / "busctl"
    tool.write_text(f"#!{sys.executable}\n{FAKE_BUSCTL}")
    tool.chmod(0o755)
    monkeypatch.setenv("FAKE_PROC", str(node.fake.proc_root))
    pid = 4321
    (node.fake.proc_root / str(pid)).mkdir()
    (node.fake.proc_root / str(pid) / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    found = systemd.detect(node.fake.proc_root)
    assert found is not None
    path = found.start_scope(f"numa-pin-run-{pid}.scope", pid, "numa-pin run job", node.fake.proc_root)
    assert path == f"/system.slice/numa-pin-run-{pid}.scope"
    call = json.loads(Path(str(node.state) + ".bus").read_text())
    assert call[:7] == ["call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))",
                        f"numa-pin-run-{pid}.scope"]
    assert call[7:12] == ["fail", "3", "PIDs", "au", "1"] and call[12] == str(pid) and call[-1] == "0"


HOST_UNITS = ("system.slice", "user.slice", "init.scope")


def test_host_units_get_this_boots_allowed_cpus_back_after_a_crash_and_a_reboot(node: SystemdNode) -> None:
    """A container asking host services off its CPUs, killed with -9, then a power cut: the
    runtime properties die with the boot, an administrator's ``AllowedCPUs=0-3`` of
    ``system.slice`` is this boot's. The first such grant of the new boot saves this boot's
    values (the saved ones of the last boot count as absent) and its release puts them back."""
    import shutil

    boot = node.fake.proc_root / "sys" / "kernel" / "random" / "boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("boot-1\n")
    shutil.rmtree(node.fake.cgroup_root / "cpuset")  # the kit's v1 cpuset directory: no cgroup here
    for rel in HOST_UNITS:
        node.tree.mkcg("/" + rel)
    ask = {"numa-pin.io/cpus": "2", "numa-pin.io/host-services": "disable"}
    NodeService(node.config).admit(request_from_oci("x", ask), node.container("x", 4001))
    assert json.loads(node.state.read_text())["system.slice"]["AllowedCPUs"], "boot 1 narrowed the host units"

    shutil.rmtree(node.tree.hierarchy / SCOPE.format(name="x").lstrip("/"))  # kill -9, power cut, boot
    shutil.rmtree(node.fake.proc_root / "4001")
    node.state.write_text(json.dumps({"system.slice": {"AllowedCPUs": "0-3"}}))
    for rel, cpus in zip(HOST_UNITS, ("0-3", "", ""), strict=True):
        (node.tree.hierarchy / rel / "cpuset.cpus").write_text(cpus + "\n")
    boot.write_text("boot-2\n")

    def host() -> dict[str, tuple[frozenset[int], frozenset[int]]]:
        units = json.loads(node.state.read_text())
        return {rel: (parse_list(units.get(rel, {}).get("AllowedCPUs", "").replace(" ", ",")),
                      parse_list((node.tree.hierarchy / rel / "cpuset.cpus").read_text()))
                for rel in HOST_UNITS}

    service = NodeService(node.config)
    assert [g.container_id for g in service.drop_earlier_boots()] == ["x"]
    originals = host()
    grant = service.admit(request_from_oci("y", ask), node.container("y", 4002)).grant
    narrowed = host()["system.slice"]
    assert narrowed[0] and not narrowed[0] & grant.cpus and narrowed != originals["system.slice"]
    service.release("y")
    assert host() == originals
