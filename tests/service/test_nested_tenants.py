"""One tenant's nested cpuset cgroup never blocks another's exclusive admission (issue 22, item 1).

A shared container that made its own cpuset cgroups (a nested runtime, Docker-in-Docker, systemd
in the container) keeps cgroup v1 from shrinking it alone (EBUSY). The fake kernel here refuses
such writes as v1 does; the nested cgroups are resized with their container, and one the kernel
still refuses is left as it was, logged to syslog and listed by ``status`` and ``reconcile``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.cli.main import main
from numa_pin.config.schema import config_from_dict
from numa_pin.enforcer import cgroups
from numa_pin.errors import EnforcementError
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path: Path, tmp_path_factory, monkeypatch) -> FakeNode:
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")


def v1_kernel(monkeypatch, refuse: tuple[Path, ...] = ()) -> list[str]:
    """cgroup v1's rule for ``cpuset.cpus`` on the fake tree: a cgroup never goes below one of
    its children's CPUs (EBUSY); writes to ``refuse`` always fail (a cgroup the kernel keeps busy).
    Returns the syslog lines."""
    real = cgroups.write_cgroup_file

    def write(path: str, text: str) -> None:
        p = Path(path)
        if p.name == "cpuset.cpus":
            want = parse_list(text)
            busy = p.parent in refuse or any(
                not parse_list((c / "cpuset.cpus").read_text()) <= want for c in p.parent.iterdir() if c.is_dir())
            if busy:
                raise EnforcementError(f"writing {text!r} failed: Device or resource busy", path=path)
        real(path, text)

    monkeypatch.setattr(cgroups, "write_cgroup_file", write)
    logged: list[str] = []
    monkeypatch.setattr("numa_pin.reporting.report.log_syslog", lambda line, error=True: logged.append(line))
    return logged


def nest(node: FakeNode, name: str, *rel: str) -> list[Path]:
    """Nested cgroups below container ``name``'s, each with its parent's CPUs (what runc does)."""
    made = []
    d = node.cgroup_dir(name)
    for part in rel:
        cpus = (d / "cpuset.cpus").read_text()
        d = d / part
        d.mkdir()
        (d / "cpuset.cpus").write_text(cpus)
        (d / "cpuset.mems").write_text((d.parent / "cpuset.mems").read_text())
        made.append(d)
    return made


def cpus_of(d: Path) -> frozenset[int]:
    return parse_list((d / "cpuset.cpus").read_text())


def service(node: FakeNode) -> NodeService:
    return NodeService(config_from_dict(node.config_dict(policy="restricted")))


def test_nested_cgroups_of_a_shared_container_shrink_with_it_and_grow_back(node, monkeypatch):
    logged = v1_kernel(monkeypatch)
    svc = service(node)
    svc.admit(request_from_oci("s", {}), node.add_container("s", 43000))
    inner = nest(node, "s", "docker", "inner")
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), node.add_container("x", 43001))
    held = svc.ledger.read().grants["x"].cpus
    pool = cpu_node.shared_pool(svc, svc.ledger.read())
    assert [cpus_of(d) for d in (node.cgroup_dir("s"), *inner)] == [pool] * 3
    assert not pool & held and logged == []
    svc.release("x")
    assert [cpus_of(d) for d in (node.cgroup_dir("s"), *inner)] == [parse_list(node.cpus)] * 3


def test_a_shared_container_the_kernel_keeps_busy_blocks_nobody_and_is_reported(node, monkeypatch, capsys):
    svc = service(node)
    svc.admit(request_from_oci("s", {}), node.add_container("s", 43000))
    [stuck] = nest(node, "s", "stuck")
    logged = v1_kernel(monkeypatch, refuse=(stuck,))
    granted = svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), node.add_container("x", 43001)).grant
    assert node.cpuset("x")[0] == format_list(granted.cpus)  # the container that asked is admitted
    assert cpus_of(node.cgroup_dir("s")) == parse_list(node.cpus)  # the busy one is left as it was
    assert len(logged) == 1 and "/ctr/s" in logged[0] and "busy" in logged[0]
    [line] = cpu_node.blocked_shared(svc, svc.ledger.read())
    assert line.startswith("s: ") and "1 nested cpuset cgroup" in line
    config = node.write_config(policy="restricted", kubelet_root=str(node.root / "no-kubelet"))
    capsys.readouterr()
    assert main(["status", "--json", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["blocked_shared"] == [line]
    assert main(["reconcile", "--config", str(config)]) == 0
    assert f"blocked: {line}" in capsys.readouterr().out
    # once the nested cgroup is gone, a reconcile shrinks the container
    stuck.joinpath("cpuset.cpus").unlink()
    stuck.joinpath("cpuset.mems").unlink()
    stuck.rmdir()
    _, repaired = svc.reconcile()
    assert repaired == ["s"] and cpu_node.blocked_shared(svc, svc.ledger.read()) == []
    assert not cpus_of(node.cgroup_dir("s")) & granted.cpus
