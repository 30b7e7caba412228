"""``explain`` takes a name as well as an id: a Kubernetes container's ``namespace/pod/container``
(what its grant records, and now its rejection too) and a podman container name (podman puts no
name in the OCI config, so podman itself is asked). Before: only ids and id prefixes."""

from __future__ import annotations

import io
import json
import stat

import pytest

from numa_pin.cli import cmd_explain
from numa_pin.cli.main import main
from numa_pin.entry.hook import run as hook_run
from numa_pin.testing.node import FakeNode

PODMAN_ID = "5e" * 32


def _kube(namespace: str, pod: str, container: str, uid: str) -> dict[str, str]:
    """The annotations CRI-O puts in a Kubernetes container's config."""
    return {"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod,
            "io.kubernetes.container.name": container, "io.kubernetes.pod.uid": uid}


@pytest.fixture
def node(tmp_path, tmp_path_factory, monkeypatch):
    fake = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    fake.config = fake.write_config(policy="single-numa-node", kubelet_root=str(tmp_path / "no-kubelet"))
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    # a podman that knows one container, web-1; root podman has run since boot
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text("#!/bin/sh\n"
                      f'[ "$*" = "container inspect --format {{{{.Id}}}} web-1" ] && echo {PODMAN_ID} && exit 0\n'
                      'echo "Error: no such container" >&2; exit 125\n')
    podman.chmod(podman.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(cmd_explain, "PODMAN_RUN_DIR", str(tmp_path), raising=False)
    return fake


def _admit(node: FakeNode, cid: str, pid: int, annotations: dict[str, str]) -> int:
    node.add_container(cid, pid)
    return hook_run(["--config", str(node.config), "prestart"], io.BytesIO(node.oci_state(cid, pid, annotations)))


def _explain(node: FakeNode, capsys, query: str) -> tuple[int, dict]:
    rc = main(["explain", query, "--config", str(node.config), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_kubernetes_and_podman_names(node, capsys):
    assert _admit(node, "ctr-app", 7001, {"numa-pin.io/cpus": "2", **_kube("shop", "web", "app", "u1")}) == 0
    assert _admit(node, "ctr-big", 7002, {"numa-pin.io/cpus": "400", **_kube("shop", "web", "big", "u1")}) == 1
    assert _admit(node, PODMAN_ID, 7003, {"numa-pin.io/cpus": "2", "io.container.manager": "libpod"}) == 0
    capsys.readouterr()
    cases = {"shop/web/app": ("granted", "ctr-app"), "shop/web/big": ("rejected", "ctr-big"),
             "web-1": ("granted", PODMAN_ID), "ctr-app": ("granted", "ctr-app")}
    for query, (state, cid) in cases.items():
        rc, doc = _explain(node, capsys, query)
        assert (rc, doc["state"], doc["container_id"]) == (0, state, cid), query
    rc, doc = _explain(node, capsys, "web-2")
    assert (rc, doc["state"]) == (1, "unknown")


def test_podman_is_not_asked_before_it_ever_ran(node, capsys, monkeypatch, tmp_path):
    """A first podman call creates its storage: a node where root podman has not run is left alone."""
    assert _admit(node, PODMAN_ID, 7003, {"numa-pin.io/cpus": "2"}) == 0
    capsys.readouterr()
    monkeypatch.setattr(cmd_explain, "PODMAN_RUN_DIR", str(tmp_path / "absent"), raising=False)
    rc, doc = _explain(node, capsys, "web-1")
    assert (rc, doc["state"]) == (1, "unknown")


def test_a_name_two_containers_recorded_asks_for_an_id(node, capsys):
    for n, cid in enumerate(("ctr-a", "ctr-b")):
        assert _admit(node, cid, 7010 + n, {"numa-pin.io/cpus": "1", **_kube("shop", "web", "app", f"u{n}")}) == 0
    capsys.readouterr()
    assert main(["explain", "shop/web/app", "--config", str(node.config)]) == 2
    assert "'shop/web/app' names 2 containers: ctr-a, ctr-b; give an id" in capsys.readouterr().err
