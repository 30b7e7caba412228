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
import json
import os
import random
from pathlib import Path

import pytest

from numa_pin import safefs
from numa_pin.admission.request import request_from_oci
from numa_pin.config.schema import config_from_dict
from numa_pin.cpuset import parse_list
from numa_pin.errors import EnforcementError, LedgerError, NumaPinError
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


# ---- VF settings and recover (issue 36) ------------------------------------------------------
#: how an admission that moves a VF with settings ends, in half of them: killed (no rollback, no
#: commit) after n of its netlink writes, a write refused, killed or failing in a later resource
#: before the commit, the journal's own write failing (ENOSPC)
VF_FAULTS = [*(f"kill-{n}" for n in range(5)), *(f"refuse-{n}" for n in range(4)),
             "kill-before-commit", "fail-before-commit", "journal-enospc"]
VF_SETTINGS = ["vlan=100,trust=on", "vlan=7,vlanQoS=2,spoofchk=off", "trust=on,max_tx_rate=500,link_state=disable",
               "vlan=42,mac=02:00:5e:00:00:2a,trust=on,spoofchk=off"]


class VfFaults:
    """The faults of :data:`VF_FAULTS` that the netlink fake does not inject itself: a later
    resource (the GPUs') killed or failing, the journal's write failing."""

    def __init__(self, monkeypatch) -> None:
        from numa_pin.resources.node import gpu as gpu_node

        self.later: type[BaseException] | None = None
        self.journal_full = False
        self.fired: dict[str, int] = {}
        enforce = gpu_node.GpuNode.enforce

        def later(resource, node, admission, decided):
            if self.later is not None:
                kind, self.later = self.later, None
                raise kind("a later resource failed")
            return enforce(resource, node, admission, decided)

        real_replace = safefs.replace_private

        def replace(directory, path, payload, **kw):
            if self.journal_full and str(path).endswith("isolation.json"):
                self.journal_full = False
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_replace(directory, path, payload, **kw)

        monkeypatch.setattr(gpu_node.GpuNode, "enforce", later)
        monkeypatch.setattr(safefs, "replace_private", replace)

    def arm(self, node, fault: str) -> None:
        from vf_world import Crash

        self.fired[fault] = self.fired.get(fault, 0) + 1
        if fault.startswith("kill-") and fault[5:].isdigit():
            node.crash_at(int(fault[5:]))
        elif fault.startswith("refuse-"):
            node.crash_at(int(fault[7:]), OSError)
        elif fault == "kill-before-commit":
            self.later = Crash
        elif fault == "fail-before-commit":
            self.later = EnforcementError
        elif fault == "journal-enospc":
            self.journal_full = True

    def disarm(self, node) -> None:
        node.armed, self.later, self.journal_full = None, None, False


def check_vfs(node, svc: NodeService, pending: dict[str, frozenset[int]], *, settled: bool) -> None:
    """The node's invariants with VFs: no CPU or VF granted twice, no grant on the CPUs a pending
    container was given at precreate, every VF whose PF-side state is not its original is held by a
    grant or journaled (nothing changed without a durable record), a VF a live grant holds with
    settings has them; ``settled`` (right after a reconcile): every VF no grant holds is back as
    it was."""
    from vf_world import VFS

    state = svc.ledger.read()
    cpus: dict[int, str] = {}
    vfs: dict[str, str] = {}
    for g in state.grants.values():
        for cpu in g.cpus:
            assert cpu not in cpus, f"CPU {cpu} is granted to {cpus[cpu]} and {g.container_id}"
            cpus[cpu] = g.container_id
        for address in g.devices.get("example.com/vf", ()):
            assert address not in vfs, f"VF {address} is granted to {vfs[address]} and {g.container_id}"
            vfs[address] = g.container_id
    for cid, held in pending.items():
        other = {cpus[c] for c in held if c in cpus and cpus[c] != cid}
        assert not other, f"the CPUs pending container {cid} was given went to {sorted(other)}"
    journaled = {os.path.basename(path) for path in node.journaled()}
    now, where = node.snapshot()
    original, home = node.original
    for i, address in enumerate(VFS):
        grant = state.grants.get(vfs.get(address, ""))
        if now[i] != original[i]:
            assert grant is not None or address in journaled, f"VF {address} changed with no record of it"
        if grant is not None and grant.vf_config.get("vlan") is not None and grant.netdevs and svc.alive(grant):
            assert now[i]["vlan"] == grant.vf_config["vlan"], f"VF {address} lost {grant.container_id}'s VLAN"
        if settled and grant is None:
            assert now[i] == original[i] and address not in journaled, f"VF {address} not given back"
            assert where[address] == home[address], f"VF {address}'s netdev is not home"


def test_vf_settings_and_recover_under_kills_leave_the_node_consistent(tmp_path: Path, monkeypatch):
    """VF admissions killed or failing at every step, containers ending without their poststop,
    precreated (pending) grants, reconciles, and ledgers damaged and rebuilt by ``numa-pin
    recover``: the invariants of :func:`check_vfs` hold after every operation."""
    from vf_world import Crash, VfNode, vf_request

    from numa_pin.cli.main import main

    node = VfNode(tmp_path / "n", tmp_path / "machines", monkeypatch)
    faults = VfFaults(monkeypatch)
    rng = random.Random(3636)
    running: dict[str, int] = {}  # container -> pid, with a VF
    pending: dict[str, frozenset[int]] = {}  # precreated, not started: the CPUs in its config
    counts = dict.fromkeys(["admitted", "killed", "failed", "rejected", "reconciles", "given_back", "recovers",
                            "pending_kept", "started"], 0)
    for i in range(ROUNDS):
        svc = NodeService(node.config)  # every hook is a new process
        op = rng.choice(["vf", "vf", "vf", "precreate", "start", "die", "release", "reconcile", "recover"])
        settled = False
        if op == "vf":
            cid, pid = f"v{i}", 70000 + i
            node.start(cid, pid)
            fault = rng.choice(VF_FAULTS) if rng.random() < 0.5 else "none"
            faults.arm(node, fault)
            try:
                svc.admit(vf_request(cid, rng.choice(VF_SETTINGS)), pid)
                running[cid] = pid
                counts["admitted"] += 1
            except Crash:
                counts["killed"] += 1
                assert cid not in svc.ledger.read().grants, f"round {i}: a killed admission committed"
                node.die(cid, pid, renamed=True)  # the runtime gives up on the container
            except NumaPinError as exc:
                counts["failed" if fault != "none" else "rejected"] += 1
                assert fault != "none" or "free" in str(exc) or "fit" in str(exc), exc
                node.die(cid, pid, renamed=True)
            finally:
                faults.disarm(node)
        elif op == "precreate":
            cid = f"p{i}"
            try:
                grant = svc.admit(request_from_oci(cid, {"numa-pin.io/cpus": "2"}), None,
                                  expected_cgroup=f"/{node.parent}/{cid}").grant
                pending[cid] = grant.cpus
            except NumaPinError as exc:
                assert "free" in str(exc) or "fit" in str(exc) or "pool would be empty" in str(exc), exc
        elif op == "start" and pending:
            cid = rng.choice(sorted(pending))
            pid = node.add_container(cid, 70000 + i)
            svc.admit(request_from_oci(cid, {"numa-pin.io/cpus": "2"}), pid)
            assert frozenset(parse_list(node.cpuset(cid)[0])) == pending.pop(cid), "started on other CPUs"
            node.stop_container(cid, pid)
            svc.release(cid)
            counts["started"] += 1
        elif op in ("die", "release") and running:
            cid = rng.choice(sorted(running))
            node.die(cid, running.pop(cid), renamed=True)  # the fake's sysfs names VFs by their host names
            if op == "release":
                svc.release(cid)
        elif op == "reconcile":
            removed, repaired = svc.reconcile()
            counts["reconciles"] += 1
            counts["given_back"] += len([c for c in repaired if c not in svc.ledger.read().grants])
            settled = True
        elif op == "recover":
            ledger = Path(node.state_dir) / "ledger.json"
            if ledger.exists():
                doc = json.loads(ledger.read_bytes())
                doc["checksum"] = "sha256:" + "0" * 64
                ledger.write_text(json.dumps(doc))
            assert main(["recover", "--config", str(node.config_file)]) == 0
            counts["recovers"] += 1
            counts["pending_kept"] += sum(cid in svc.ledger.read().grants for cid in pending)
        check_vfs(node, svc, pending, settled=settled)
    assert counts["killed"] and counts["given_back"] and counts["recovers"], counts
    print(f"\nfault mode, VF settings and recover: {ROUNDS} operations; {counts}; faults {faults.fired}; "
          "the node was consistent after each")
