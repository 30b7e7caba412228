"""Bursts of admissions lose nothing (issue 21): a decision made on a snapshot is checked against
the ledger as it is at commit time, not against an unchanged ledger.

The threads here all decide on the same snapshot (a barrier holds every decision until all have
decided), so every commit but the first meets a ledger that changed, and most meet a decision
whose CPUs another admission already took. On the code that demanded an unchanged ledger these
admissions were refused with ``AdmissionTimeout``; see ``docs/design/admission-concurrency.md`` for the
argument these tests check.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import numa_pin.resources.node.base as node_base
import numa_pin.service.node as service_mod
from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.errors import NumaPinError
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

REAL_DECIDE = service_mod.decide


#: big-64node needs kubelet's guard on merges over more than 8 NUMA nodes lifted
BIG = {"policy_options": {"max-allowable-numa-nodes": 64}}


def make_service(node: FakeNode, **extra: object) -> NodeService:
    return NodeService(config_from_dict(node.config_dict(policy="restricted", **{**BIG, **extra})))


def check_ledger(node: FakeNode) -> None:
    """No CPU granted twice, no reserved CPU granted, every cgroup as the ledger says."""
    svc = make_service(node)
    state = svc.ledger.read()
    seen: dict[int, str] = {}
    for g in state.grants.values():
        assert not g.cpus & cpu_node.reserved(svc), g.container_id
        for cpu in g.cpus:
            assert cpu not in seen, f"CPU {cpu} granted to {seen[cpu]} and {g.container_id}"
            seen[cpu] = g.container_id
    pool = cpu_node.shared_pool(svc, state)
    for g in state.grants.values():
        assert parse_list(node.cpuset(g.container_id)[0]) == (g.cpus or pool), g.container_id


def burst(node: FakeNode, monkeypatch, requests: dict[str, dict[str, str]], base_pid: int,
          ) -> tuple[dict[str, str], list[int]]:
    """Admit ``requests`` ({container id: annotations}) from one thread each, every decision made
    on the same snapshot. Returns {container id: error line} for the refused, and how many
    decisions each admission made in all."""
    gate = threading.Barrier(len(requests))
    decided: list[int] = []

    def gated_decide(*args, **kwargs):
        decision = REAL_DECIDE(*args, **kwargs)
        me = threading.get_ident()
        first = me not in decided
        decided.append(me)
        if first:  # every first decision waits until all are made: they all saw the same ledger
            gate.wait(60)
        return decision

    monkeypatch.setattr(service_mod, "decide", gated_decide)
    refused: dict[str, str] = {}
    pids = {cid: node.add_container(cid, base_pid + i, None) for i, cid in enumerate(requests)}

    def admit(cid: str) -> None:
        try:
            make_service(node).admit(request_from_oci(cid, requests[cid]), pids[cid])
        except NumaPinError as exc:
            refused[cid] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=admit, args=(cid,)) for cid in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return refused, decided


@pytest.mark.parametrize("count", [16, 32], ids=lambda n: f"burst{n}")
def test_a_burst_that_fits_is_admitted_whole(tmp_path: Path, monkeypatch, count: int):
    node = FakeNode(tmp_path / "n", "big-64node", machines=tmp_path / "machines")
    requests = {f"c{i}": {"numa-pin.io/cpus": "1"} for i in range(count)}
    refused, decisions = burst(node, monkeypatch, requests, 50000)
    assert refused == {}
    grants = make_service(node).ledger.read().grants
    assert sorted(grants) == sorted(requests)
    assert len(decisions) == count, "no admission decided twice: CPUs another took are picked again"
    check_ledger(node)


def test_one_liveness_pass_per_admission(tmp_path: Path, monkeypatch):
    """The commit takes the snapshot's word for the grants it found alive: an admission checks
    each grant's liveness once, not twice (issue 21; the old commit checked every grant again)."""
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines")
    svc = make_service(node)
    for i in range(12):
        svc.admit(request_from_oci(f"s{i}", {}), node.add_container(f"s{i}", 52000 + i, None))
    checked: list[str] = []
    real = node_base.is_alive

    def counting(grant, *args, **kwargs):
        checked.append(grant.container_id)
        return real(grant, *args, **kwargs)

    monkeypatch.setattr(node_base, "is_alive", counting)
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "2"}), node.add_container("x", 52100, None))
    assert sorted(checked) == sorted(f"s{i}" for i in range(12))
    check_ledger(node)


def test_shared_cpusets_follow_the_ledger_through_admissions_and_releases(tmp_path: Path):
    """No shared container keeps a CPU granted exclusively, and a released CPU returns to every
    shared container, one of them gone meanwhile (its cgroup removed)."""
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines")
    svc = make_service(node)
    for i in range(20):
        svc.admit(request_from_oci(f"s{i}", {}), node.add_container(f"s{i}", 53000 + i, None))
    for i in range(6):
        svc.admit(request_from_oci(f"e{i}", {"numa-pin.io/cpus": "2"}), node.add_container(f"e{i}", 53100 + i, None))
        check_ledger(node)
    node.stop_container("s3", 53003)
    for i in range(0, 6, 2):
        svc.release(f"e{i}")
        check_ledger(node)
    state = svc.ledger.read()
    assert "s3" not in state.grants, "the container that ended was collected"
    assert len(cpu_node.shared_pool(svc, state)) == len(svc.topology.cpu_ids) - 6
