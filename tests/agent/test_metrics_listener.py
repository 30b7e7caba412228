"""The agent's opt-in metrics listener (the config's ``metrics_address``): a real ``numa-pin serve``
scraped over HTTP, its exposition parsed with prometheus_client's parser and checked against the
ledger; the counts outlive the agent, and a scrape never costs an admission."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numa_pin.ledger.store import Ledger
from numa_pin.testing.node import FakeNode

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
        deadline = time.monotonic() + WAIT_S
        while "listening on" not in self.err.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.err.read_text()
            time.sleep(0.05)

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
