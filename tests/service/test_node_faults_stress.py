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

from numa_pin.base import safefs
from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.errors import EnforcementError, LedgerError, NumaPinError
from numa_pin.ledger import store
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.service.node import NodeService
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


# ---- issue 36: isolation settings across resizes, counts and reason files ---------------------
#: the isolation a resized grant asks (the governor's cpufreq policies span two CPUs: shared settings)
ISOLATION = [{"cpu-c-states.crio.io": "disable"}, {"cpu-freq-governor.crio.io": "performance"},
             {"cpu-c-states.crio.io": "disable", "cpu-freq-governor.crio.io": "performance"}]


class SettingFaults:
    """Makes the ``n``-th setting or cgroup file write fail once (EIO), then lets everything through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from numa_pin.enforcer import cgroups

        self.left: int | None = None
        self.fired = 0
        real = cgroups.write_cgroup_file

        def write(path, text, *args, **kwargs):
            if self.left is not None:
                if self.left == 0:
                    self.left = None
                    self.fired += 1
                    raise NumaPinError(f"{path}: injected EIO")
                self.left -= 1
            return real(path, text, *args, **kwargs)

        monkeypatch.setattr(cgroups, "write_cgroup_file", write)


def isolation_node(root: Path) -> FakeNode:
    """The kit's 2-socket node with its own sysfs copy: a PM QoS file per CPU (``0``) and a
    cpufreq policy per core (its two threads, ``powersave``)."""
    node = FakeNode(root / "n", "intel-2s-ht", machines=root / "machines-iso")
    cpu = node.sysfs_root / "devices" / "system" / "cpu"
    for n in range(32):
        (cpu / f"cpu{n}" / "power").mkdir(exist_ok=True)
        (cpu / f"cpu{n}" / "power" / "pm_qos_resume_latency_us").write_text("0\n")
    for core in range(16):
        d = cpu / "cpufreq" / f"policy{core}"
        d.mkdir(parents=True)
        (d / "related_cpus").write_text(f"{core} {core + 16}\n")
        (d / "scaling_governor").write_text("powersave\n")
        (d / "scaling_available_governors").write_text("performance powersave\n")
    return node


def check_settings(node: FakeNode, svc: NodeService, where: str, *, strict: bool = True) -> None:
    """Every CPU's settings are those the ledger's grants want, nothing else: a CPU no grant asking
    a knob holds has its original, and the saved originals are exactly those of what is set. Not
    ``strict`` (a release whose give-back, after its commit, met a fault): a setting no grant
    wants may still be set or saved, but only where it is saved (the next reconcile restores it)."""
    from numa_pin.enforcer.saved import Saved
    from numa_pin.requests.isolation import of_grant

    state = svc.ledger.read()
    quiet = frozenset().union(*(g.cpus for g in state.grants.values() if of_grant(g).c_states is not None))
    fast = frozenset().union(*(g.cpus for g in state.grants.values() if of_grant(g).governor is not None))
    cpu = node.sysfs_root / "devices" / "system" / "cpu"
    saved = set(Saved(str(node.state_dir)).entries())
    files = [(cpu / f"cpu{n}" / "power" / "pm_qos_resume_latency_us", n in quiet, "n/a", "0") for n in range(32)]
    files += [(cpu / "cpufreq" / f"policy{core}" / "scaling_governor", bool({core, core + 16} & fast),
               "performance", "powersave") for core in range(16)]
    for path, wanted, value, original in files:
        now, kept = path.read_text().strip(), str(path) in saved
        name = path.relative_to(cpu)
        if wanted or strict:
            assert (now, kept) == ((value, True) if wanted else (original, False)), f"{where}: {name}: {now}, {kept}"
        else:
            assert now == original or kept, f"{where}: {name} left at {now} and not saved"


def test_resizes_move_isolation_settings_with_the_cpus_under_faults(tmp_path: Path, monkeypatch):
    """Issue 36 (3): isolated grants admitted, grown, shrunk, released and reconciled while a ledger
    write or a setting write fails at random; after every operation, before anything repairs
    the node, the settings are exactly what the ledger's grants want."""
    from numa_pin.cli.cmd_resize import resize_change

    node = isolation_node(tmp_path)
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    rng = random.Random(3636)
    faults, setting_faults = Faults(monkeypatch), SettingFaults(monkeypatch)
    started: dict[str, frozenset[int]] = {}
    running: list[str] = []
    failed = done = grown = shrunk = 0
    for i in range(ROUNDS):
        op = rng.choice(["admit", "admit", "resize", "resize", "resize", "release", "reconcile"])
        if op != "reconcile" and rng.random() < 0.4:
            if rng.random() < 0.5:
                faults.arm(rng)
            elif op in ("admit", "resize"):  # a release's give-back after its commit is reconcile's
                setting_faults.left = rng.randrange(4)
        ledger_before = svc.ledger.read()
        fired = faults.fired + setting_faults.fired
        try:
            if op == "admit" or not running:
                name = f"c{i}"
                node.add_container(name, 50000 + i)
                started[name] = parse_list(node.cpus)
                annotations = {"numa-pin.io/cpus": str(rng.choice([1, 2, 3])), **rng.choice(ISOLATION)}
                svc.admit(request_from_oci(name, annotations), 50000 + i)
                running.append(name)
            elif op == "resize":
                name = rng.choice(running)
                before = ledger_before.grants[name].cpus
                after = svc.update_grant(name, resize_change(svc, rng.randrange(1, 7), None))[1].cpus
                grown, shrunk = grown + (after > before), shrunk + (after < before)
            elif op == "release":
                name = running.pop(rng.randrange(len(running)))
                node.stop_container(name, 50000 + int(name[1:]))
                svc.release(name)
            else:
                svc.reconcile()
            done += 1
        except NumaPinError as exc:
            if faults.fired + setting_faults.fired > fired:  # a ledger, saved-settings or setting write failed
                failed += 1
                assert svc.ledger.read() == ledger_before, f"round {i} ({op}): a failed write changed the ledger"
            else:  # a full node, a resize KEP-5554 does not allow: refused, not what is tested here
                assert any(w in str(exc) for w in ("pool would be empty", "free", "fit", "admitted", "shrink")), exc
        fired_now = faults.fired + setting_faults.fired - fired
        faults.armed, setting_faults.left = None, None
        check(node, svc, started)
        if op == "release" and fired_now:
            check_settings(node, svc, f"round {i} ({op}, a fault)", strict=False)
            svc.reconcile()
        check_settings(node, svc, f"round {i} ({op}, {fired_now} fault)")
    assert faults.fired and setting_faults.fired and failed and grown and shrunk, (
        faults.fired, setting_faults.fired, failed, grown, shrunk)
    print(f"\nfault mode, isolation across resizes: {ROUNDS} operations ({grown} grew, {shrunk} shrank), "
          f"{faults.fired} ledger and {setting_faults.fired} setting faults, {failed} rolled back, {done} done; "
          "the settings followed the CPUs after each")


def test_counts_and_reason_files_survive_planted_locks_and_killed_writers(tmp_path: Path, monkeypatch):
    """Issue 36 (5, 6): admissions (some rejected, their reason written as the hook does) while,
    at random, ``counters.lock`` is planted as a symlink (or removed again) and killed writers
    leave temporary files, stale or still in flight. After every operation: nothing was written
    through the symlink, each admission was counted or its loss said in one line, and no
    killed writer's temporary file outlives the next writer of its kind."""
    import time

    from numa_pin.reporting import report, tally

    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines")
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted")))
    state_dir = str(node.state_dir)
    lines: list[str] = []
    monkeypatch.setattr(report, "log_syslog", lambda line, error=True: lines.append(line))
    rng = random.Random(3637)
    target = tmp_path / "precious"
    target.write_text("precious\n")
    lock = node.state_dir / tally.LOCK
    counted = lost = rejected = planted = temps = 0
    running: list[str] = []
    for i in range(ROUNDS):
        roll = rng.random()
        if roll < 0.1 and node.state_dir.exists():
            lock.unlink(missing_ok=True)
            lock.symlink_to(target)
            planted += 1
        elif roll < 0.3:
            lock.unlink(missing_ok=True)  # the operator removed it (numa-pin makes a new one)
        if rng.random() < 0.3 and node.state_dir.exists():  # a writer SIGKILLed mid-write
            where = report.reasons_dir(state_dir) if rng.random() < 0.5 else state_dir
            prefix = ".reason." if where != state_dir else ".counters."
            fd, path = safefs.create_private(where, prefix)
            os.write(fd, b"{")
            os.close(fd)
            if rng.random() < 0.7:  # long dead; else a writer still at work
                old = time.time() - 3 * report.STALE_TEMP_S
                os.utime(path, (old, old))
            temps += 1
        before = tally.read(state_dir).get("admission_requests", 0), len(lines)
        if running and rng.random() < 0.3:
            name = running.pop(rng.randrange(len(running)))
            node.stop_container(name, 50000 + int(name[1:]))
            svc.release(name)
            after = tally.read(state_dir).get("admission_requests", 0), len(lines)
            assert after[0] == before[0] and after[1] - before[1] == int(lock.is_symlink())
        else:
            name = f"c{i}"
            node.add_container(name, 50000 + i)
            try:
                svc.admit(request_from_oci(name, {"numa-pin.io/cpus": str(rng.choice([1, 2, 64]))}), 50000 + i)
                running.append(name)
            except NumaPinError as exc:
                rejected += 1
                assert report.write_reason(state_dir, name, f"numa-pin: rejected {name}: {exc}") is not None
                # a write prunes once per twentieth of the bounds (a busy node's refusals cost no
                # scan each); reconcile prunes every time: after it no dead writer's file is left
                report.prune_reasons(state_dir)
                reasons = Path(report.reasons_dir(state_dir))
                stale = [p for p in reasons.iterdir() if p.name.startswith(".reason.")
                         and time.time() - p.stat().st_mtime > report.STALE_TEMP_S]
                assert not stale, f"round {i}: killed writers' reason files outlived a prune: {stale}"
            after = tally.read(state_dir).get("admission_requests", 0), len(lines)
            assert (after[0] - before[0], after[1] - before[1]) in ((1, 0), (0, 1)), (i, before, after)
            counted, lost = counted + after[0] - before[0], lost + after[1] - before[1]
            if after[1] > before[1]:
                assert "\n" not in lines[-1] and tally.LOCK in lines[-1] and "symbolic link" in lines[-1], lines[-1]
            else:
                assert not [p for p in node.state_dir.iterdir() if p.name.startswith(".counters.")], i
        assert target.read_text() == "precious\n", f"round {i}: written through the planted lock"
    assert counted and lost and rejected and planted and temps, (counted, lost, rejected, planted, temps)
    print(f"\nfault mode, counts and reason files: {ROUNDS} operations, {planted} locks planted, {temps} killed "
          f"writers' files; {counted} admissions counted, {lost} losses said in one line, {rejected} reasons "
          "written; nothing written through a symlink, no dead writer's file outlived the next prune")


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
