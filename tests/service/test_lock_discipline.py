"""A slow or stuck admission never blocks the node (issue: never stall the runtime).

The decision runs on a snapshot outside the ledger lock, commits only if the ledger did not
change (and decides again if it did), and runs under a deadline that ends in a recorded
rejection. Every test here fails on an admission that decides inside the lock or has no deadline.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import numa_pin.service.node as service_mod
from numa_pin.agent.request import watch_client
from numa_pin.base import deadline as deadline_mod
from numa_pin.base.cpuset import parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.errors import AdmissionTimeout
from numa_pin.hook.started import process_started
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

REAL_DECIDE = service_mod.decide


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path / "machines")


def make_service(node: FakeNode, **extra: object) -> NodeService:
    return NodeService(config_from_dict(node.config_dict(policy="restricted", **extra)))


def lock_is_free(lock_path: str) -> bool:
    """Can another open file description take the ledger's flock right now?"""
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_the_decision_runs_outside_the_ledger_lock(node, monkeypatch):
    svc = make_service(node)
    seen: list[bool] = []

    def watching_decide(*args, **kwargs):
        seen.append(lock_is_free(svc.ledger.lock_path))
        return REAL_DECIDE(*args, **kwargs)

    monkeypatch.setattr(service_mod, "decide", watching_decide)
    svc.admit(request_from_oci("a", {"numa-pin.io/cpus": "2"}), node.add_container("a", 41000, "0-31"))
    assert seen == [True]
    assert "a" in svc.ledger.read().grants


def test_a_slow_decision_is_cut_at_the_deadline_and_leaves_the_lock_free(node, monkeypatch):
    svc = make_service(node, admission_timeout_s=0.5)
    released: list[float] = []
    other = make_service(node)
    other.admit(request_from_oci("b", {"numa-pin.io/cpus": "2"}), node.add_container("b", 41001, "0-31"))

    def slow_decide(*args, **kwargs):
        start = time.monotonic()
        t = threading.Thread(target=lambda: (other.release("b"), released.append(time.monotonic() - start)))
        t.start()
        t.join()
        while True:  # a pure computation that never ends on its own
            sum(range(1000))

    monkeypatch.setattr(service_mod, "decide", slow_decide)
    began = time.monotonic()
    with pytest.raises(AdmissionTimeout, match="admission_timeout_s"):
        svc.admit(request_from_oci("slow", {"numa-pin.io/cpus": "2"}), node.add_container("slow", 41002, "0-31"))
    assert time.monotonic() - began < 5
    assert released and released[0] < 1.0, "a release ran while the slow decision was computing"
    assert svc.ledger.read().grants == {}
    assert lock_is_free(svc.ledger.lock_path)


#: (case, our annotations, the rival's, decisions we make in all): a rival that commits between
#: our snapshot and our commit. Taking CPUs we chose is no reason to decide again (they are picked
#: again under the lock); creating the record of our pod is (its affinity binds our decision).
RIVALS = [
    ("rival-takes-our-cpus", {"numa-pin.io/cpus": "4"}, {"numa-pin.io/cpus": "4"}, [0]),
    ("rival-fixes-our-pods-affinity",
     {"numa-pin.io/cpus": "4", "numa-pin.io/scope": "pod", "io.kubernetes.cri.sandbox-id": "p1"},
     {"numa-pin.io/cpus": "4", "numa-pin.io/scope": "pod", "io.kubernetes.cri.sandbox-id": "p1"}, [0, 1]),
]


@pytest.mark.parametrize(("ours", "theirs", "ours_decided"), [r[1:] for r in RIVALS], ids=[r[0] for r in RIVALS])
def test_a_commit_by_someone_else_is_checked_not_decided_again(node, monkeypatch, ours, theirs, ours_decided):
    svc = make_service(node)
    other = make_service(node)
    calls: list[tuple[str, int]] = []

    def racing_decide(topology, state, request, settings):
        calls.append((request.container_id, len(state.grants)))
        if len(calls) == 1:  # another admission commits between our snapshot and our commit
            other.admit(request_from_oci("rival", theirs), node.add_container("rival", 41003, "0-31"))
        return REAL_DECIDE(topology, state, request, settings)

    monkeypatch.setattr(service_mod, "decide", racing_decide)
    svc.admit(request_from_oci("me", ours), node.add_container("me", 41004, "0-31"))
    grants = svc.ledger.read().grants
    assert [n for cid, n in calls if cid == "me"] == ours_decided
    assert len(grants["me"].cpus) == 4 and not grants["me"].cpus & grants["rival"].cpus
    nodes = {n for n, info in svc.topology.nodes.items() if info.cpus & grants["me"].cpus}
    assert len(nodes) == 1, "restricted: the CPUs picked again are on one NUMA node still"
    assert parse_list(node.cpuset("me")[0]) == grants["me"].cpus


def test_a_long_lock_wait_says_who_holds_it_in_the_system_log_only(node, capfd, monkeypatch):
    """The wait is logged with the holder's pid; stderr stays empty, so an outcome is one line."""
    from numa_pin.reporting import report

    logged: list[str] = []
    monkeypatch.setattr(report, "log_syslog", lambda line, error=True: logged.append(line))
    svc = make_service(node, lock_timeout_s=5)
    os.makedirs(svc.config.state_dir, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({svc.ledger.lock_path!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nos.pwrite(fd, f'{os.getpid()}\\n'.encode(), 0)\n"
         "print('locked', flush=True)\ntime.sleep(1.6)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        svc.admit(request_from_oci("w", {"numa-pin.io/cpus": "2"}), node.add_container("w", 41005, "0-31"))
    finally:
        holder.wait(10)
    assert capfd.readouterr().err == ""
    assert logged == [f"numa-pin: waiting for the ledger lock (held by pid {holder.pid})"]
    assert "w" in svc.ledger.read().grants


def test_the_deadline_never_interrupts_outside_interruptible_sections():
    d = deadline_mod.Deadline(0.05, "test")
    with d.active():
        time.sleep(0.1)  # expired while not interruptible: nothing raised here
        with pytest.raises(AdmissionTimeout):
            d.check()
    with pytest.raises(AdmissionTimeout), deadline_mod.Deadline(0.1).active() as d2, d2.interruptible():
        while True:
            sum(range(1000))


def test_an_agent_child_stops_when_its_hook_hangs_up():
    ours, theirs = socket.socketpair()
    served = threading.Event()
    d = deadline_mod.Deadline(30, "admission of x")
    result: list[bool] = []
    with d.active():
        t = threading.Thread(target=lambda: result.append(watch_client(ours, served, poll_ms=20)))
        t.start()
        theirs.close()  # the runtime killed the hook
        with pytest.raises(AdmissionTimeout, match="went away"), d.interruptible():
            for _ in range(10_000_000):
                sum(range(100))
        served.set()
        t.join(5)
    ours.close()
    assert result == [True]


def test_hook_records_a_timeout_where_explain_finds_it(node, monkeypatch):
    """Through the hook, a deadline rejection is one line and a reason file."""
    import io
    import json

    from numa_pin.entry.hook import run
    from numa_pin.reporting.report import reason_path

    def endless(*args, **kwargs):
        while True:
            sum(range(1000))

    monkeypatch.setattr(service_mod, "decide", endless)
    cfg = node.write_config(policy="restricted", admission_timeout_s=0.3)
    state = node.oci_state("t1", node.add_container("t1", 41006, "0-31"), {"numa-pin.io/cpus": "2"})
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(node.cache_dir))
    rc = run(["--config", str(cfg), "prestart"], io.BytesIO(state))
    assert rc != 0
    with open(reason_path(str(node.state_dir), "t1"), encoding="utf-8") as fh:
        assert "AdmissionTimeout" in json.load(fh)["line"]


def test_process_started_is_when_the_process_was_forked():
    """The kernel's start time of a process, on the monotonic clock: a child's lies between the
    moments just before and just after it was spawned (to a clock tick); this process's is before
    both. (psutil's ``create_time`` is no oracle here: it adds ticks to a boot time rounded to
    the second.)"""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    before = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    after = time.monotonic()
    try:
        started = process_started(child.pid)
        assert started is not None and before - 2 * tick <= started <= after + 2 * tick, (before, started, after)
        own = process_started()
        assert own is not None and own < before
    finally:
        child.kill()
        child.wait()


def test_process_started_reads_any_comm_and_gives_up_on_nonsense(tmp_path):
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    ticks = os.sysconf("SC_CLK_TCK")
    fields = ["S", "1"] + ["0"] * 17 + [str(95 * ticks)] + ["0"] * 30  # starttime: 95 s after boot
    (proc / "77" / "stat").write_text("77 (a) b (c)) " + " ".join(fields) + "\n")
    (proc / "uptime").write_text("100.00 180.00\n")
    started = process_started(77, str(proc))
    assert started is not None and abs(time.monotonic() - started - 5.0) < 0.5
    (proc / "uptime").write_text("90.00 180.00\n")  # a start after now
    assert process_started(77, str(proc)) is None
    (proc / "77" / "stat").write_text("77 (a) S 1\n")  # cut short
    assert process_started(77, str(proc)) is None
    assert process_started(78, str(proc)) is None


def test_a_deadline_since_an_earlier_start_has_only_what_is_left():
    d = deadline_mod.Deadline(20, "admission of x", since=time.monotonic() - 15)
    assert 4 < d.remaining() <= 5
    spent = deadline_mod.Deadline(20, "admission of x", since=time.monotonic() - 25)
    with pytest.raises(AdmissionTimeout, match=r"took longer than 20s \(admission_timeout_s, counted from the "
                                               r"hook's start\)"):
        spent.check()
    later = deadline_mod.Deadline(20, "admission of x", since=time.monotonic() + 60)  # never past now
    assert later.remaining() <= 20
