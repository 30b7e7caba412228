"""``serve --publish-nrt``: the node's NodeResourceTopology in the API server, from a thread.

The API server is a fake over real HTTPS (:mod:`.fake_apiserver`: a certificate made by openssl
now, a token and CA file as a pod's service account has them) that keeps what it is sent and
records every request. Oracles: the requests themselves (verbs, resourceVersion, what is left
untouched), ``numa-pin nrt --json`` run as a command for the same node (the body must be its
output), and the clock beside an NRI admission run while the API server hangs.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from numa_pin.cli import cmd_nrt
from numa_pin.cli import main as cli_main
from numa_pin.cluster.kubeapi import ApiServer
from numa_pin.cluster.nrtpublish import CREATED, FOREIGN, MANAGED_BY_LABEL, MANAGER, UPDATED, Publisher, publish
from numa_pin.config.load import load_config
from numa_pin.config.schema import config_from_dict
from numa_pin.errors import KubeApiError
from numa_pin.nri import messages as nri_messages
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

from .fake_apiserver import PREFIX, FakeApiServer, account_dir, make_cert

GI = 1 << 30
NODE = "worker-7"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("certs")
    return {"server": make_cert(d, "server"), "other": make_cert(d, "other")}


@pytest.fixture
def server(certs):
    fake = FakeApiServer(*certs["server"])
    yield fake
    fake.close()


@pytest.fixture
def api(server: FakeApiServer, certs, tmp_path: Path) -> ApiServer:
    sa = account_dir(tmp_path / "sa", certs["server"][0])
    return ApiServer.in_cluster(server.env(), str(sa), timeout_s=2.0)


def _obj(n: int, name: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name}, "zones": [{"name": "node-0", "n": n}]}


def _wait(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_first_publish_creates_and_a_change_replaces_with_the_version_read(server, api) -> None:
    assert publish(api, _obj(1)) == CREATED
    assert server.methods() == ["GET", "POST"]
    assert server.requests[0].path == f"{PREFIX}/{NODE}"
    created = server.requests[1].body
    assert created["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGER}
    version = server.objects[NODE]["metadata"]["resourceVersion"]
    assert publish(api, _obj(2)) == UPDATED
    assert server.methods()[2:] == ["GET", "PUT"]
    assert server.requests[3].body["metadata"]["resourceVersion"] == version
    assert server.objects[NODE]["zones"] == [{"name": "node-0", "n": 2}]


def test_a_conflict_is_read_again_and_retried_once(server, api) -> None:
    publish(api, _obj(1))
    server.conflicts = 1
    assert publish(api, _obj(2)) == UPDATED
    assert server.methods()[2:] == ["GET", "PUT", "GET", "PUT"]
    assert server.objects[NODE]["zones"][0]["n"] == 2
    server.conflicts = 2
    with pytest.raises(KubeApiError, match="409") as err:
        publish(api, _obj(3))
    assert err.value.status == 409
    assert server.methods()[6:] == ["GET", "PUT", "GET", "PUT"], "once, not more"


def test_an_object_numa_pin_does_not_own_is_left_alone_with_one_line(server, api) -> None:
    theirs = {**_obj(0), "metadata": {"name": NODE, "labels": {MANAGED_BY_LABEL: "nfd-topology-updater"},
                                      "resourceVersion": "7"}}
    server.objects[NODE] = json.loads(json.dumps(theirs))
    assert publish(api, _obj(1)) == FOREIGN
    lines: list[str] = []
    publisher = Publisher(lambda: _obj(len(lines)), lambda o: publish(api, o), log=lines.append, interval_s=0.05,
                          poll_s=0.02).start()
    try:
        _wait(lambda: len(server.requests) >= 1)
        for _ in range(3):
            publisher.notify()
            time.sleep(0.1)
    finally:
        publisher.stop(5)
    assert set(server.methods()) == {"GET"}, "no POST, PUT or DELETE"
    assert server.objects[NODE] == theirs
    assert len(lines) == 1 and "not numa-pin's" in lines[0] and NODE in lines[0]
    assert publisher.published == 0


def test_a_wrong_ca_is_refused(server, certs, tmp_path: Path) -> None:
    sa = account_dir(tmp_path / "sa", certs["other"][0])
    api = ApiServer.in_cluster(server.env(), str(sa), timeout_s=2.0)
    with pytest.raises(KubeApiError, match="CERTIFICATE_VERIFY_FAILED"):
        publish(api, _obj(1))
    assert server.requests == [], "nothing reached the server"


@pytest.mark.parametrize(("answer", "match", "status"), [
    ((302, {}, {"Location": "https://elsewhere.example/"}), "redirected .302. to https://elsewhere.example/; not followed",
     302),
    ((200, {"pad": "x" * 5000}, {}), "exceeds 4096", 200),
    ((500, {"kind": "Status", "message": "etcd is down"}, {}), "GET: 500 etcd is down", 500),
], ids=["redirect-not-followed", "answer-too-large", "server-error"])
def test_answers_are_bounded(server, certs, tmp_path: Path, answer, match, status) -> None:
    sa = account_dir(tmp_path / "sa", certs["server"][0])
    api = ApiServer.in_cluster(server.env(), str(sa), timeout_s=2.0, max_response=4096)
    server.get_answer = answer
    with pytest.raises(KubeApiError, match=match) as err:
        publish(api, _obj(1))
    assert err.value.status == status
    assert server.methods() == ["GET"], "nothing written, nothing followed"


@pytest.mark.parametrize(("env", "files", "match"), [
    ({}, ("token", "ca.crt"), "KUBERNETES_SERVICE_HOST"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "x"}, ("token", "ca.crt"), "not a port"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, ("ca.crt",), "token: missing"),
], ids=["not-in-a-pod", "bad-port", "no-token"])
def test_in_cluster_needs_the_pods_account(tmp_path: Path, env, files, match) -> None:
    for name in files:
        (tmp_path / name).write_text("x")
    with pytest.raises(KubeApiError, match=match):
        ApiServer.in_cluster(env, str(tmp_path))


def test_ten_changes_in_a_second_publish_at_most_twice_the_last_with_the_final_state(server, api) -> None:
    state = {"n": 0}
    publisher = Publisher(lambda: _obj(state["n"]), lambda o: publish(api, o), log=lambda _: None,
                          interval_s=1.5, poll_s=0.05)
    publisher.start()
    try:
        _wait(lambda: NODE in server.objects)  # the publish at start
        time.sleep(1.6)
        before = len([m for m in server.methods() if m in ("POST", "PUT")])
        for i in range(1, 11):
            state["n"] = i
            publisher.notify()
            time.sleep(0.09)
        _wait(lambda: server.objects[NODE]["zones"][0]["n"] == 10, timeout_s=5)
        time.sleep(0.3)
    finally:
        publisher.stop(5)
    writes = [r for r in server.requests if r.method in ("POST", "PUT")][before:]
    assert 1 <= len(writes) <= 2, writes
    assert writes[-1].body["zones"][0]["n"] == 10


def test_failures_are_logged_once_each_and_retried_with_backoff(server, api) -> None:
    server.conflicts = 1000
    server.objects[NODE] = {**_obj(0), "metadata": {"name": NODE, "labels": {MANAGED_BY_LABEL: MANAGER},
                                                    "resourceVersion": "1"}}
    lines: list[str] = []
    publisher = Publisher(lambda: _obj(1), lambda o: publish(api, o), log=lines.append, interval_s=0.1,
                          poll_s=0.02, max_backoff_s=0.4)
    publisher.start()
    try:
        time.sleep(1.5)
        server.conflicts = 0
        _wait(lambda: server.objects[NODE]["zones"][0]["n"] == 1, timeout_s=5)
    finally:
        publisher.stop(5)
    failed = [line for line in lines if "409" in line]
    assert len(failed) == 1, lines
    puts = server.methods().count("PUT")
    assert 4 <= puts <= 2 * 8, f"backoff 0.1, 0.2, 0.4, 0.4...: a few attempts in 1.5 s, not {puts}"
    assert "updated" in lines[-1], "the recovery is said"


def _node_config(node: FakeNode, tmp_path: Path) -> Path:
    return node.write_config(tmp_path / "config.yaml", policy="restricted")


@pytest.fixture
def node(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> FakeNode:
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines", parent="")


def test_the_body_is_what_numa_pin_nrt_prints(server, api, node: FakeNode, tmp_path: Path, capsys) -> None:
    config_path = _node_config(node, tmp_path)
    assert cli_main.main(["nrt", "--config", str(config_path), "--node-name", NODE, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    config = load_config(str(config_path), {})
    build, _ = cmd_nrt.node_builder(config, config.sysfs_root, config.proc_root, NODE)
    assert publish(api, build()) == CREATED
    body = server.requests[-1].body
    assert body["metadata"].pop("labels") == {MANAGED_BY_LABEL: MANAGER}
    assert body == printed


def test_a_hanging_api_server_never_delays_an_admission(server, certs, node: FakeNode, tmp_path: Path) -> None:
    from tests.nri.fake_runtime import Connected, container, pod

    server.get_delay_s = 3.0
    sa = account_dir(tmp_path / "sa", certs["server"][0])
    api = ApiServer.in_cluster(server.env(), str(sa), timeout_s=1.0)
    config = config_from_dict(node.config_dict(policy="restricted"))
    build, watched = cmd_nrt.node_builder(config, config.sysfs_root, config.proc_root, NODE)
    lines: list[str] = []
    publisher = Publisher(build, lambda o: publish(api, o), log=lines.append, interval_s=0.1, watched=watched,
                          poll_s=0.02)
    m = nri_messages.load()
    conn = Connected(NodeService(config), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        publisher.start()
        _wait(lambda: len(server.requests) >= 1)  # the publisher waits on the API server now
        p = pod(m, "u1", "guaranteed", "")
        c = container(m, p, "c1", cpu_milli=2000, limit_milli=2000, memory=GI)
        started = time.monotonic()
        code, text, _ = conn.runtime.create(p, c)
        elapsed = time.monotonic() - started
        assert code == 0, text
        assert elapsed < 0.9, f"the admission took {elapsed:.2f}s beside a hanging API server"
        _wait(lambda: any("timed out" in line or "within" in line for line in lines), timeout_s=5)
    finally:
        publisher.stop(5)
        conn.close()
    assert "KubeApiError" in lines[0]
    assert threading.active_count() < 50


def _serve_args(sa: Path | str, interval: float = 0.1):
    import argparse

    return argparse.Namespace(publish_nrt=True, nrt_interval=interval, node_name=None, serviceaccount_dir=str(sa))


def test_serve_publishes_the_node_named_by_the_downward_api(server, certs, node: FakeNode, tmp_path: Path) -> None:
    from numa_pin.cli import serve_nrt

    sa = account_dir(tmp_path / "sa", certs["server"][0])
    env = {**server.env(), "NODE_NAME": NODE, "NUMA_PIN_CONFIG": str(_node_config(node, tmp_path))}
    publisher = serve_nrt.start(_serve_args(sa), env)
    try:
        _wait(lambda: NODE in server.objects)
    finally:
        publisher.stop(5)
    assert server.methods()[:2] == ["GET", "POST"]


def test_serve_without_an_api_server_serves_and_says_why_once(node: FakeNode, tmp_path: Path, capsys) -> None:
    from numa_pin.cli import serve_nrt

    env = {"NUMA_PIN_CONFIG": str(_node_config(node, tmp_path))}
    started = time.monotonic()
    publisher = serve_nrt.start(_serve_args(tmp_path / "none", interval=0.05), env)
    assert time.monotonic() - started < 0.5, "start reads nothing: the thread does"
    try:
        time.sleep(1.0)
    finally:
        publisher.stop(5)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("numa-pin")]
    assert len(lines) == 1 and "KUBERNETES_SERVICE_HOST is not set" in lines[0], lines


def _cpu_available(obj: dict[str, Any]) -> int:
    return sum(int(r["available"]) for z in obj["zones"] for r in z["resources"] if r["name"] == "cpu")


def test_an_admission_and_its_release_are_published(server, api, node: FakeNode) -> None:
    """Through the NRI plugin: the ledger changes, the publisher sees it and replaces the object."""
    from tests.nri.fake_runtime import Connected, container, pod

    config = config_from_dict(node.config_dict(policy="restricted"))
    build, watched = cmd_nrt.node_builder(config, config.sysfs_root, config.proc_root, NODE)
    publisher = Publisher(build, lambda o: publish(api, o), log=lambda _: None, interval_s=0.1, watched=watched,
                          poll_s=0.02)
    m = nri_messages.load()
    conn = Connected(NodeService(config), m)
    try:
        conn.runtime.configure()
        conn.runtime.synchronize([], [])
        publisher.start()
        _wait(lambda: NODE in server.objects)
        free = _cpu_available(server.objects[NODE])
        p = pod(m, "u1", "guaranteed", "")
        c = container(m, p, "c1", cpu_milli=2000, limit_milli=2000, memory=GI)
        assert conn.runtime.create(p, c)[0] == 0
        _wait(lambda: _cpu_available(server.objects[NODE]) == free - 2)
        assert conn.runtime.remove(p, c)[0] == 0
        _wait(lambda: _cpu_available(server.objects[NODE]) == free)
    finally:
        publisher.stop(5)
        conn.close()
    assert server.methods().count("PUT") >= 2


def test_a_commit_that_only_appends_to_the_ledger_journal_is_seen(node: FakeNode, monkeypatch) -> None:
    """Issue 34: on a busy node a commit appends to ``ledger.log`` and leaves ``ledger.json`` as it
    was; the files watched for a rebuild must show it."""
    from numa_pin.cluster.nrtpublish import file_stamps
    from numa_pin.ledger import store
    from numa_pin.ledger.model import Grant, LedgerState

    config = config_from_dict(node.config_dict(policy="restricted"))
    _, watched = cmd_nrt.node_builder(config, config.sysfs_root, config.proc_root, NODE)
    ledger = store.Ledger(config.state_dir)
    monkeypatch.setattr(store, "JOURNAL_FROM_BYTES", 0)  # a snapshot journal records may follow
    with ledger.transaction() as txn:
        txn.state = LedgerState({f"g{n}": Grant(f"g{n}", "pod", "app", "shared") for n in range(40)})
    seen, snapshot = file_stamps(watched), Path(ledger.path).read_bytes()
    with ledger.transaction() as txn:
        txn.remove("g1")
    assert Path(ledger.path).read_bytes() == snapshot  # the commit went to the journal
    assert file_stamps(watched) != seen
