"""``numa-pin metrics``: the exposition parsed with prometheus_client's own parser, checked against
what the ledger, the reason files and the kit's sysfs tree say (read here directly), and the
counts of :mod:`numa_pin.reporting.tally` across processes, restarts and hostile files."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numa_pin.base.cpuset import parse_list
from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.ledger.store import Ledger
from numa_pin.reporting import tally
from numa_pin.reporting.report import read_reasons
from numa_pin.testing.node import FakeNode

#: (container, cpus asked, admitted?) on intel-2s-ht (2 nodes x 16 CPUs) under single-numa-node
ADMISSIONS = [("c0", "2", True), ("c1", "4", True), ("c2", "400", False), ("c3", "17", False), ("c4", "1", True)]


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    for i in range(len(ADMISSIONS)):
        fake.add_container(f"c{i}", 7000 + i)
    fake.config = fake.write_config(policy="single-numa-node", kubelet_root=str(tmp_path / "no-kubelet"))
    return fake


def _hook(node: FakeNode, name: str, cpus: str) -> int:
    i = int(name[1:])
    return hook_run(["--config", str(node.config), "prestart"],
                    io.BytesIO(node.oci_state(name, 7000 + i, {"numa-pin.io/cpus": cpus})))


def _scrape(node: FakeNode, tmp_path: Path, capsys) -> dict[str, dict[tuple, float]]:
    """``numa-pin metrics --textfile``, parsed: {sample name: {sorted label items: value}}."""
    path = tmp_path / "numa_pin.prom"
    assert main(["metrics", "--config", str(node.config), "--textfile", str(path)]) == 0
    assert capsys.readouterr().out == ""
    assert path.stat().st_mode & 0o777 == 0o644
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _one(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def test_metrics_say_what_the_ledger_and_reasons_say(node, tmp_path, capsys):
    for name, cpus, admitted in ADMISSIONS:
        assert (_hook(node, name, cpus) == 0) is admitted
    capsys.readouterr()
    m = _scrape(node, tmp_path, capsys)
    state = Ledger(str(node.state_dir)).read()
    reasons = read_reasons(str(node.state_dir))
    rejected = [n for n, _, ok in ADMISSIONS if not ok]
    assert sorted(reasons) == rejected
    assert _one(m, "kubelet_topology_manager_admission_requests_total") == len(ADMISSIONS)
    assert _one(m, "kubelet_topology_manager_admission_errors_total") == len(reasons)
    assert _one(m, "kubelet_cpu_manager_pinning_requests_total") == len(ADMISSIONS)
    assert _one(m, "kubelet_cpu_manager_pinning_errors_total") == len(reasons)
    kinds = [r["kind"] for r in reasons.values()]
    for kind in set(kinds):
        assert _one(m, "numa_pin_rejections_total", reason=kind) == kinds.count(kind)
    assert sum(m["numa_pin_rejections_total"].values()) == len(reasons)
    # single-numa-node guarantees NUMA alignment: every admitted container counts, every
    # TopologyAffinityError a failure (kubelet's scope and boundary labels)
    assert _one(m, "kubelet_container_aligned_compute_resources_count", scope="container",
                boundary="numa_node") == len(state.grants)
    assert _one(m, "kubelet_container_aligned_compute_resources_failure_count", scope="container",
                boundary="numa_node") == kinds.count("TopologyAffinityError")
    for kind in ("exclusive", "shared", "process"):
        assert _one(m, "numa_pin_grants", kind=kind) == sum(g.kind == kind for g in state.grants.values())
    assert _one(m, "kubelet_topology_manager_admission_duration_ms_count") == len(ADMISSIONS)
    assert _one(m, "numa_pin_admission_duration_seconds_count") == len(ADMISSIONS)
    assert _one(m, "numa_pin_admission_duration_seconds_bucket", le="+Inf") == len(ADMISSIONS)
    # free CPUs per node: the kit's sysfs cpulists, minus what `status --json` says is reserved,
    # minus what the ledger grants
    assert main(["status", "--config", str(node.config), "--json"]) == 0
    reserved = parse_list(json.loads(capsys.readouterr().out)["reserved"])
    held = state.exclusive_cpus()
    nodes = sorted(node.sysfs_root.glob("devices/system/node/node[0-9]*"))
    assert nodes
    for path in nodes:
        n = path.name[len("node"):]
        cpus = parse_list((path / "cpulist").read_text().strip())
        assert _one(m, "numa_pin_numa_node_capacity", numa_node=n, resource="cpu") == len(cpus)
        assert _one(m, "numa_pin_numa_node_available", numa_node=n, resource="cpu") == len(cpus - reserved - held)
        assert _one(m, "kubelet_cpu_manager_allocation_per_numa", numa_node=n) == len(cpus & held)
    assert _one(m, "kubelet_cpu_manager_exclusive_cpu_allocation_count") == len(held)
    assert _one(m, "numa_pin_node_state_up") == 1


def test_counts_survive_processes_and_count_releases_and_reconciles(node, tmp_path, capsys):
    assert _hook(node, "c0", "2") == 0
    # another process (a hook run by a runtime, not this interpreter) counts into the same file
    state = node.oci_state("c1", 7001, {"numa-pin.io/cpus": "2"})
    env = dict(os.environ, NUMA_PIN_NO_AGENT="1")
    code = ("import io, sys; from numa_pin.entry.hook import run; "
            f"sys.exit(run(['--config', {str(node.config)!r}, 'prestart'], io.BytesIO({state!r})))")
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
    assert hook_run(["--config", str(node.config), "poststop"], io.BytesIO(node.oci_state("c0", 7000))) == 0
    assert main(["reconcile", "--config", str(node.config)]) == 0
    capsys.readouterr()
    m = _scrape(node, tmp_path, capsys)
    assert _one(m, "kubelet_topology_manager_admission_requests_total") == 2
    assert _one(m, "numa_pin_releases_total") == 1
    assert _one(m, "numa_pin_reconcile_runs_total") == 1
    assert set(Ledger(str(node.state_dir)).read().grants) == {"c1"}


def _adder(state_dir: str, n: int) -> None:
    for _ in range(n):
        assert tally.add(state_dir, {"releases": 1, "rejections:other": 2}, wait_s=60)


def test_concurrent_writers_lose_no_count(tmp_path):
    import multiprocessing

    state_dir = str(tmp_path / "state")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_adder, args=(state_dir, 25)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert tally.read(state_dir) == {"releases": 100, "rejections:other": 200}


@pytest.mark.parametrize("content, expected", [
    pytest.param('{"releases": 3, "nope": 9, "lock_waits": -1, "reconcile_runs": true}', {"releases": 3},
                 id="unknown-negative-bool-dropped"),
    pytest.param('[1, 2]', {}, id="not-an-object"),
    pytest.param('{"releases": ', {}, id="torn"),
    pytest.param('{"releases": 1}' + " " * (tally.MAX_BYTES + 1), {}, id="oversized"),
    pytest.param('{"a": {"b": {"c": 1}}}', {}, id="too-deep"),
])
def test_hostile_counters_file_reads_as_what_is_valid(tmp_path, content, expected):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    (state_dir / tally.COUNTERS).write_text(content)
    assert tally.read(str(state_dir)) == expected
    assert tally.add(str(state_dir), {"releases": 1})  # a damaged file starts again (a counter reset)
    assert tally.read(str(state_dir))["releases"] == expected.get("releases", 0) + 1


def test_counters_file_symlink_is_not_followed(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.json"
    target.write_text('{"releases": 5}')
    (state_dir / tally.COUNTERS).symlink_to(target)
    assert tally.read(str(state_dir)) == {}


@pytest.mark.parametrize("plant, why", [
    pytest.param("symlink", "symbolic link", id="symlink"),
    pytest.param("dangling-symlink", "symbolic link", id="dangling-symlink"),
    pytest.param("hard-link", "hard links", id="hard-link"),
])
def test_an_unsafe_counters_lock_is_not_followed_and_the_loss_is_said(tmp_path, monkeypatch, plant, why):
    """Issue 36 (5): a planted lock drops the counts (nothing is written through it), and each
    dropped count says so in one line naming the lock, instead of silently."""
    from numa_pin.reporting import report

    lines: list[str] = []
    monkeypatch.setattr(report, "log_syslog", lambda line, error=True: lines.append(line))
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    if plant != "dangling-symlink":
        target.write_text("precious\n")
    if plant == "hard-link":
        os.link(target, state_dir / tally.LOCK)
    else:
        (state_dir / tally.LOCK).symlink_to(target)
    assert not tally.add(str(state_dir), {"releases": 1})
    assert not tally.add(str(state_dir), {"releases": 1})
    assert tally.read(str(state_dir)) == {}
    assert (target.read_text() if target.exists() else None) == (None if plant == "dangling-symlink" else "precious\n")
    assert len(lines) == 2 and all("\n" not in line and tally.LOCK in line and why in line for line in lines), lines


def test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_writer_removes(tmp_path):
    """Issue 36 (6), for the counters: a writer SIGKILLed while it wrote the new counters leaves
    its temporary file; the next writer (it holds the lock) removes it."""
    import signal
    import subprocess
    import sys

    state_dir = tmp_path / "state"
    assert tally.add(str(state_dir), {"releases": 1})
    killed = subprocess.run(
        [sys.executable, "-c",
         "import os, signal, sys\nfrom numa_pin.base.safefs import create_private\n"
         "fd, tmp = create_private(sys.argv[1], '.counters.')\nos.write(fd, b'{\"releases\": 9')\n"
         "os.kill(os.getpid(), signal.SIGKILL)", str(state_dir)], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    (left,) = [p for p in state_dir.iterdir() if p.name.startswith(".counters.")]
    assert tally.add(str(state_dir), {"releases": 1})
    assert not left.exists() and tally.read(str(state_dir)) == {"releases": 2}
    assert sorted(p.name for p in state_dir.iterdir()) == [tally.COUNTERS, tally.LOCK]


def test_a_writer_that_cannot_get_the_lock_drops_its_increments(tmp_path):
    import fcntl

    state_dir = tmp_path / "state"
    assert tally.add(str(state_dir), {"releases": 1})
    fd = os.open(state_dir / tally.LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert not tally.add(str(state_dir), {"releases": 1}, wait_s=0.05)
    finally:
        os.close(fd)
    assert tally.read(str(state_dir)) == {"releases": 1}


@pytest.mark.parametrize("kind, policy, full, expected", [
    pytest.param(None, "single-numa-node", False, {"aligned:container:numa_node"}, id="admitted-snn"),
    pytest.param("TopologyAffinityError", "single-numa-node", False, {"aligned_failure:container:numa_node",
                                                                       "rejections:TopologyAffinityError"},
                 id="rejected-snn"),
    pytest.param(None, "best-effort", True, {"aligned:container:physical_cpu"}, id="admitted-full-pcpus"),
    pytest.param("SMTAlignmentError", "restricted", True, {"aligned_failure:container:physical_cpu",
                                                           "rejections:SMTAlignmentError"}, id="smt"),
    pytest.param("NoSuchKind", "restricted", False, {"rejections:other"}, id="unknown-kind-is-other"),
])
def test_admission_increments_follow_kubelet(kind, policy, full, expected):
    inc = tally.admission_increments(seconds=0.002, cpus=True, memory=False, policy=policy, scope="container",
                                     full_pcpus=full, error_kind=kind)
    labelled = {k for k in inc if k.startswith(("aligned", "rejections"))}
    assert labelled == expected
    assert inc["admission_errors"] == inc["cpu_pinning_errors"] == (kind is not None)
    assert inc["duration_ms:sum"] == pytest.approx(2.0)
    assert all(k in tally.KEYS for k in inc)


def test_an_admission_that_waited_for_the_ledger_lock_counts_once(node, tmp_path, capsys):
    """The lock is held here (another open file description); the admission's wait notice is the
    signal to let it go, so nothing depends on timing."""
    import fcntl
    import threading

    from numa_pin.config.load import load_config
    from numa_pin.requests.request import request_from_oci
    from numa_pin.service.node import NodeService

    waited = threading.Event()
    service = NodeService(load_config(str(node.config), {}), cache_dir=str(tmp_path / "cache"),
                          on_wait=lambda _holder: waited.set())
    node.state_dir.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(node.state_dir / "ledger.lock", os.O_RDWR | os.O_CREAT, 0o600)
    done: list[object] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        worker = threading.Thread(target=lambda: done.append(
            service.admit(request_from_oci("c0", {"numa-pin.io/cpus": "2"}), 7000)))
        worker.start()
        assert waited.wait(120), "the admission never waited for the lock"
    finally:
        os.close(fd)  # lets the admission go
    worker.join(120)
    assert len(done) == 1
    m = _scrape(node, tmp_path, capsys)
    assert _one(m, "numa_pin_lock_waits_total") == 1
    assert _one(m, "kubelet_topology_manager_admission_requests_total") == 1
