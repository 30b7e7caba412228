"""``numa-pin nrt --watch --output FILE``: the file follows the ledger, kubectl applies each version.

The loop is checked alone (writes only new versions, reports and survives errors) and as a
real process: a fake ``kubectl`` on PATH records every call and a copy of the file it was given,
a grant is written to the ledger, and the file and the applied copies must show it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from numa_pin.cli import cmd_nrt
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import Ledger
from numa_pin.testing import machine, shapes
from waitfor import wait_for

from .test_nrt import CRD_V1ALPHA2, quantity, validate

NUMA_PIN = Path(sys.executable).with_name("numa-pin")
WAIT_S = 60.0


def test_watch_writes_each_new_version_once_and_survives_errors(tmp_path):
    ledger = tmp_path / "ledger.json"
    out = tmp_path / "nrt.yaml"
    versions = [{"v": 1}, {"v": 1}, LedgerCorrupt("ledger.json: bad checksum"), {"v": 2}]
    built, published, ticks = [], [], []
    errors = []

    def build():
        item = versions[len(built)]
        built.append(item)
        if isinstance(item, Exception):
            raise item
        return item

    def sleep(_s):  # every tick the ledger changes, so every tick rebuilds
        ticks.append(1)
        ledger.write_text(str(len(ticks)))

    class Err:
        def write(self, text):
            errors.append(text)

        def flush(self):
            pass

    written = cmd_nrt.watch(build, str(ledger), str(out), as_json=True, interval=0.5,
                            publish=lambda p: published.append(Path(p).read_text()) or None,
                            stopped=lambda: len(built) == len(versions), err=Err(), sleep=sleep)
    assert written == 2, "the same object twice is written once"
    assert [json.loads(t) for t in published] == [{"v": 1}, {"v": 2}]
    assert json.loads(out.read_text()) == {"v": 2}
    assert any("LedgerCorrupt" in e for e in errors)
    assert not list(tmp_path.glob(".nrt.yaml.*")), "no temporary file left"


def test_watch_does_not_rebuild_while_the_ledger_is_unchanged(tmp_path):
    ledger = tmp_path / "ledger.json"
    ledger.write_text("x")
    calls: list[int] = []
    ticks: list[int] = []
    cmd_nrt.watch(lambda: calls.append(1) or {"v": 1}, str(ledger), str(tmp_path / "o"), as_json=False,
                  interval=0.1, publish=None, stopped=lambda: len(ticks) >= 5, sleep=lambda s: ticks.append(1))
    assert (calls, len(ticks)) == ([1], 5)


def test_watch_rebuilds_when_the_pods_file_changes(tmp_path):
    """With --pods, a change of the pods file alone (the ledger unchanged) rebuilds the object."""
    ledger, pods = tmp_path / "ledger.json", tmp_path / "pods.json"
    ledger.write_text("x")
    pods.write_text("[]")
    calls: list[int] = []
    ticks: list[int] = []

    def sleep(_s):
        ticks.append(1)
        if len(ticks) == 2:
            pods.write_text('[{"namespace": "a", "name": "b"}]')

    cmd_nrt.watch(lambda: calls.append(1) or {"v": len(calls)}, (str(ledger), str(pods)), str(tmp_path / "o"),
                  as_json=True, interval=0.1, publish=None, stopped=lambda: len(ticks) >= 4, sleep=sleep)
    assert len(calls) == 2, "built at the start and once after the pods file changed"


@pytest.mark.parametrize("flag, env, exists, want", [
    ("/k/flag", {"KUBECONFIG": "/k/env"}, {"/k/flag", "/k/env"}, "/k/flag"),
    (None, {"KUBECONFIG": "/k/env:/k/other"}, {"/k/env"}, "/k/env"),
    (None, {"HOME": "/home/u"}, {"/home/u/.kube/config"}, "/home/u/.kube/config"),
    (None, {"HOME": "/home/u"}, set(), None),
    ("/k/flag", {}, set(), None),
], ids=["flag", "env-first-entry", "home", "none", "flag-missing"])
def test_kubeconfig_path(flag, env, exists, want, tmp_path):
    def rooted(p: str) -> str:
        return str(tmp_path) + p

    for p in exists:
        Path(rooted(p)).parent.mkdir(parents=True, exist_ok=True)
        Path(rooted(p)).write_text("apiVersion: v1\n")
    env = {k: ":".join(rooted(x) for x in v.split(":")) for k, v in env.items()}
    got = cmd_nrt.kubeconfig_path(rooted(flag) if flag else None, env)
    assert got == (rooted(want) if want else None)


FAKE_KUBECTL = r"""#!/bin/sh
# records argv and a copy of the -f file, as kubectl apply would read it
n=$(ls "$KUBECTL_LOG" | grep -c "\.args$")
echo "$@" > "$KUBECTL_LOG/call-$n.args"
while [ $# -gt 0 ]; do
    if [ "$1" = -f ]; then cp "$2" "$KUBECTL_LOG/call-$n.yaml"; fi
    shift
done
echo "noderesourcetopology.topology.node.k8s.io/worker configured"
"""


def _cpu_available(obj: dict, zone: str) -> int:
    z = next(z for z in obj["zones"] if z["name"] == zone)
    return quantity(next(r for r in z["resources"] if r["name"] == "cpu")["available"])


@pytest.mark.skipif(not NUMA_PIN.exists(), reason="numa-pin is not installed in this interpreter's bin")
def test_watch_process_follows_the_ledger_and_applies(tmp_path, tmp_path_factory):
    spec = shapes.SHAPES["intel-2s-ht"]()
    built = machine.build_once(spec, tmp_path_factory.getbasetemp() / "machines")
    state_dir = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"state_dir": str(state_dir), "syslog": False, "policy": "restricted",
                                  "sysfs_root": str(built.sysfs_root), "proc_root": str(built.proc_root)}))
    bindir, log = tmp_path / "bin", tmp_path / "kubectl-log"
    bindir.mkdir()
    log.mkdir()
    (bindir / "kubectl").write_text(FAKE_KUBECTL)
    (bindir / "kubectl").chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    out = tmp_path / "nrt.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
    env.update(PATH=f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}", KUBECONFIG=str(kubeconfig),
               KUBECTL_LOG=str(log))
    proc = subprocess.Popen([str(NUMA_PIN), "nrt", "--config", str(config), "--node-name", "worker", "--watch",
                             "--output", str(out), "--interval", "0.05"], env=env, stderr=subprocess.PIPE, text=True)
    try:

        def applied(n: int) -> bool:
            assert proc.poll() is None, proc.stderr.read()
            return (log / f"call-{n}.yaml").exists()

        wait_for(lambda: applied(0), "the first kubectl apply")
        first = yaml.safe_load(out.read_text())
        assert validate(first, CRD_V1ALPHA2) == []
        cpus = sorted(spec.cpus_of_node(1))[:2]
        with Ledger(str(state_dir)).transaction() as txn:
            txn.state = LedgerState().with_grant(Grant(
                container_id="c1", pod_id="c1", container_name="c1", kind="exclusive", pid=None, start_time=None,
                cgroup=None, cpus=frozenset(cpus), mems=frozenset({1}), devices={}, memory={}, affinity=None,
                policy="restricted", scope="container", created=1.0, netdevs=()))
        wait_for(lambda: applied(1), "kubectl apply after the ledger changed")
        second = yaml.safe_load((log / "call-1.yaml").read_text())
        assert _cpu_available(second, "node-1") == _cpu_available(first, "node-1") - 2
        assert _cpu_available(second, "node-0") == _cpu_available(first, "node-0")
        assert yaml.safe_load(out.read_text()) == second
        args = (log / "call-0.args").read_text().split()
        assert args == ["--kubeconfig", str(kubeconfig), "apply", "-f", str(out)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
        assert "applying it with" in proc.stderr.read()
        assert len(list(log.glob("*.yaml"))) == 2, "an unchanged ledger is not applied again"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
