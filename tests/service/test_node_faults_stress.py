"""``make stress``, fault mode: ENOSPC and EIO at random ledger writes of a busy node.

Admissions (exclusive, shared, with a nested cpuset cgroup), releases (stopped and, with force,
running containers) and reconciles run against a fake node while, in a random share of them,
one write of the state directory fails: the data of the new ledger (ENOSPC), its fsync (EIO),
the directory's fsync (EIO) or the lock holder's pid (ENOSPC). After every operation, before
anything repairs the node, the invariants are checked against the cgroups themselves:

* the ledger decodes and is the one of the last operation that did not fail;
* no two exclusive grants share a CPU;
* every granted container's cgroup holds its grant (exclusive) or the shared pool (shared), and
  a container whose admission failed still has the CPUs it started with: a failed write undid
  every cgroup write of its operation.

``NUMA_PIN_STRESS_FAULTS`` sets the number of operations (default 300).
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from numa_pin import safefs
from numa_pin.admission.request import request_from_oci
from numa_pin.config.schema import config_from_dict
from numa_pin.cpuset import parse_list
from numa_pin.errors import LedgerError, NumaPinError
from numa_pin.ledger import store
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service import NodeService
from numa_pin.testing.node import FakeNode

pytestmark = pytest.mark.stress
ROUNDS = int(os.environ.get("NUMA_PIN_STRESS_FAULTS", "300"))

#: where a write fails: (the name the write path calls it by, errno)
FAULTS = [("write_all", errno.ENOSPC), ("fsync", errno.EIO), ("fsync_dir", errno.EIO), ("pwrite", errno.ENOSPC)]


class Faults:
    """Makes the ``n``-th call of one store write fail once, then lets everything through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: tuple[str, int, int] | None = None  # (where, errno, calls left before it)
        self.fired = 0
        for where, _ in FAULTS:
            owner = store.os if where in ("fsync", "pwrite") else safefs
            monkeypatch.setattr(owner, where, self._wrap(where, getattr(owner, where)))

    def _wrap(self, where: str, real):
        def call(*args, **kwargs):
            if self.armed is not None and self.armed[0] == where:
                name, code, left = self.armed
                if left == 0:
                    self.armed = None
                    self.fired += 1
                    raise OSError(code, os.strerror(code))
                self.armed = (name, code, left - 1)
            return real(*args, **kwargs)
        return call

    def arm(self, rng: random.Random) -> None:
        where, code = rng.choice(FAULTS)
        self.armed = (where, code, rng.randrange(2))


def check(node: FakeNode, svc: NodeService, started: dict[str, frozenset[int]]) -> None:
    state = svc.ledger.read()
    seen: dict[int, str] = {}
    for g in state.grants.values():
        for cpu in g.cpus:
            assert cpu not in seen, f"CPU {cpu} is granted to {seen[cpu]} and {g.container_id}"
            seen[cpu] = g.container_id
    pool = cpu_node.shared_pool(svc, state)
    for name, first in started.items():
        d = node.cgroup_dir(name)
        if not d.is_dir():
            continue
        cpus = parse_list((d / "cpuset.cpus").read_text())
        grant = state.grants.get(name)
        want = first if grant is None else (grant.cpus or pool)
        assert cpus == want, f"{name}: cgroup {sorted(cpus)}, ledger says {sorted(want)}"


def test_enospc_and_eio_at_random_ledger_writes_leave_the_node_consistent(tmp_path: Path, monkeypatch):
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines")
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    rng = random.Random(2222)
    faults = Faults(monkeypatch)
    started: dict[str, frozenset[int]] = {}
    running: list[str] = []
    failed = done = 0
    for i in range(ROUNDS):
        ledger_before = svc.ledger.read()
        if rng.random() < 0.4:
            faults.arm(rng)
        op = rng.choice(["exclusive", "exclusive", "shared", "nested", "release", "force", "reconcile"])
        try:
            if op in ("exclusive", "shared", "nested") or not running:
                name = f"c{i}"
                node.add_container(name, 50000 + i)
                started[name] = parse_list(node.cpus)
                annotations = {"numa-pin.io/cpus": str(rng.choice([1, 2]))} if op == "exclusive" else {}
                if op == "nested":  # a nested runtime's cgroup with all the container's CPUs
                    inner = node.cgroup_dir(name) / "inner"
                    inner.mkdir()
                    (inner / "cpuset.cpus").write_text(node.cpus + "\n")
                    (inner / "cpuset.mems").write_text(node.mems + "\n")
                svc.admit(request_from_oci(name, annotations), 50000 + i)
                running.append(name)
            elif op == "release":
                name = running.pop(rng.randrange(len(running)))
                node.stop_container(name, 50000 + int(name[1:]))
                svc.release(name)
            elif op == "force":
                svc.release_to_shared(rng.choice(running))
            else:
                svc.reconcile()
            done += 1
        except LedgerError:
            failed += 1
            assert svc.ledger.read() == ledger_before, f"round {i} ({op}): a failed write changed the ledger"
        except NumaPinError as exc:  # a full node rejects: that is not what is tested here
            assert "pool would be empty" in str(exc) or "free" in str(exc) or "fit" in str(exc), exc
        faults.armed = None
        check(node, svc, started)
    assert faults.fired and failed and done, (faults.fired, failed, done)
    print(f"\nfault mode: {ROUNDS} operations, {faults.fired} faults, {failed} failed with a ledger error, "
          f"{done} done; the node was consistent after each")
