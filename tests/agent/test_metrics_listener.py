"""The agent's opt-in metrics listener (the config's ``metrics_address``): a real ``numa-pin serve``
scraped over HTTP, its exposition parsed with prometheus_client's parser and checked against the
ledger; the counts outlive the agent, and a scrape never costs an admission."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode
from waitfor import wait_for

WAIT_S = 60.0  # a bound for the agent to start (never a speed check)
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    def __init__(self, node: FakeNode, root: Path, config: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.sock, self.err = root / "agent.sock", root / "agent.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
        env.update(NUMA_PIN_CONFIG=str(config), NUMA_PIN_CACHE_DIR=str(node.cache_dir))
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen([str(BIN / "numa-pin"), "serve", "--socket", str(self.sock)],
                                         stdout=subprocess.DEVNULL, stderr=err, env=env)
        wait_for(self._listening, lambda: f"numa-pin serve to listen: {self.err.read_text()}")

    def _listening(self) -> bool:
        assert self.proc.poll() is None, f"numa-pin serve exited: {self.err.read_text()}"
        return "listening on" in self.err.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT_S)


@pytest.fixture
def node(tmp_path, tmp_path_factory):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    for i in range(3):
        fake.add_container(f"c{i}", 6000 + i)
    return fake


def _hook(node: FakeNode, config: Path, agent: Agent, i: int, cpus: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
    env.update(NUMA_PIN_CACHE_DIR=str(node.cache_dir), NUMA_PIN_AGENT_SOCKET=str(agent.sock),
               NUMA_PIN_AGENT_AUTOSTART="0")
    proc = subprocess.run([str(BIN / "numa-pin-hook"), "--config", str(config), "prestart"], env=env, timeout=120,
                          input=node.oci_state(f"c{i}", 6000 + i, {"numa-pin.io/cpus": cpus}), capture_output=True)
    return proc.returncode


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_agent_serves_metrics_that_outlive_it(node, tmp_path):
    port = _free_port()
    config = node.write_config(policy="single-numa-node", metrics_address=f"127.0.0.1:{port}",
                               kubelet_root=str(tmp_path / "no-kubelet"))
    agent = Agent(node, tmp_path / "a1", config)
    try:
        assert "serving metrics on" in agent.err.read_text()
        before = _scrape(port)
        assert before["kubelet_topology_manager_admission_requests_total"] == 0
        assert _hook(node, config, agent, 0, "2") == 0
        assert _hook(node, config, agent, 1, "400") == 1
        after = _scrape(port)
        grants = Ledger(str(node.state_dir)).read().grants
        assert after["kubelet_topology_manager_admission_requests_total"] == 2
        assert after["kubelet_topology_manager_admission_errors_total"] == 1
        assert after["numa_pin_grants,kind=exclusive"] == len(grants) == 1
        assert after["kubelet_cpu_manager_exclusive_cpu_allocation_count"] == len(grants["c0"].cpus)
        # the scrapes were children; the agent still admits
        assert _hook(node, config, agent, 2, "1") == 0
    finally:
        assert agent.stop() == 0
    agent = Agent(node, tmp_path / "a2", config)  # a restarted agent: the counts are the node's, not its own
    try:
        assert _scrape(port)["kubelet_topology_manager_admission_requests_total"] == 3
    finally:
        assert agent.stop() == 0


def test_agent_without_the_key_listens_on_no_tcp_port(node, tmp_path):
    port = _free_port()
    config = node.write_config(policy="single-numa-node", kubelet_root=str(tmp_path / "no-kubelet"))
    agent = Agent(node, tmp_path / "a", config)
    try:
        with pytest.raises(urllib.error.URLError):
            _scrape(port)
        assert "metrics" not in agent.err.read_text()
    finally:
        assert agent.stop() == 0


def test_an_address_in_use_leaves_admissions_served(node, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        config = node.write_config(policy="single-numa-node", metrics_address=f"127.0.0.1:{port}",
                                   kubelet_root=str(tmp_path / "no-kubelet"))
        agent = Agent(node, tmp_path / "a", config)
        try:
            assert "not serving metrics" in agent.err.read_text()
            assert _hook(node, config, agent, 0, "2") == 0
        finally:
            assert agent.stop() == 0


def _drip(sock: socket.socket, stop: threading.Event, every_s: float) -> None:
    """A slow scraper: a request line one byte at a time, never finished."""
    payload = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
    for byte in payload:
        if stop.wait(every_s):
            return
        try:
            sock.send(bytes([byte]))
        except OSError:
            return


def test_a_scrape_past_its_total_deadline_is_cut(node):
    """Issue 36 (4): each byte comes well within the per-read limit, the whole request never does."""
    from numa_pin.agent.metrics import serve_scrape

    config = node.write_config(policy="single-numa-node")
    ours, theirs = socket.socketpair()
    stop = threading.Event()
    dripper = threading.Thread(target=_drip, args=(theirs, stop, 0.05))
    dripper.start()
    try:
        started = time.monotonic()
        serve_scrape(ours, {"NUMA_PIN_CONFIG": str(config)}, timeout_s=5.0, deadline_s=0.5)
        took = time.monotonic() - started
    finally:
        stop.set()
        dripper.join()
        ours.close()
        theirs.close()
    assert took < 5.0, f"served a dripping scraper for {took:.1f} s"
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_slow_scrapers_take_no_admission_slot(tmp_path):
    """Issue 36 (4): more dripping scrapers than an agent has admission slots; a hook connecting
    then is served by a child, not sent back to run in-process."""
    from numa_pin.agent import server
    from numa_pin.agent.listener import listen_tcp

    path = str(tmp_path / "run" / "agent.sock")
    lock_fd, listener = server.open_socket(path)
    metrics = listen_tcp(f"127.0.0.1:{_free_port()}")
    agent = server.AgentServer(path, lock_fd, listener, max_children=2, metrics=metrics)
    scrapers = [socket.create_connection(metrics.getsockname()[:2]) for _ in range(server.MAX_SCRAPES + 3)]
    hook = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    forked: set[int] = set()
    try:
        for s in scrapers:
            s.sendall(b"G")
            agent._scrape()
        forked |= agent.children | agent.scrapes
        assert len(agent.scrapes) <= server.MAX_SCRAPES
        hook.connect(path)
        agent._accept()
        forked |= agent.children | agent.scrapes
        hook.shutdown(socket.SHUT_WR)  # no request: the child it got hangs up
        hook.settimeout(WAIT_S)
        reply = b"".join(iter(lambda: hook.recv(4096), b""))
        assert b"in flight" not in reply, reply
    finally:
        for pid in forked:  # only the children this test forked
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        for s in [*scrapers, hook]:
            s.close()
        agent.close()
