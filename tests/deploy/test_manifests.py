"""The Kubernetes manifests: the plain file, the Helm chart and what they say about the node.

Oracles kept apart from the manifests: numa-pin's own config loader reads the ConfigMap's
config, and its built-in defaults (``Config()``) say where each root is on a host, so a mount
that names the wrong host directory or a root that no mount backs fails here; the capability
table of ``docs/kubernetes-deploy.md`` is compared with the DaemonSet's list.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from numa_pin.config.load import load_config
from numa_pin.config.model import Config
from numa_pin.nri.plugin import DEFAULT_SOCKET

from .render import plain_yaml, render, render_chart

REPO = Path(__file__).resolve().parents[2]
PLAIN = REPO / "deploy" / "kubernetes" / "numa-pin.yaml"
CHART = REPO / "deploy" / "helm" / "numa-pin"
DOC = REPO / "docs" / "kubernetes-deploy.md"
#: host directories mounted that are no root of the config, and why (the doc's mount table says the same)
EXTRA_MOUNTS = {"/run/systemd": "systemctl set-property on the host's systemd"}
#: every config key that is a root on the host, single or a list
ROOT_KEYS = ("sysfs_root", "proc_root", "dev_root", "cgroup_root", "state_dir", "kubelet_root", "cdi_spec_dirs")


def _plain() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(PLAIN.read_text(encoding="utf-8")) if d]


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objs, "DaemonSet")["spec"]["template"]["spec"]


def _container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _pod(objs)["containers"]
    assert len(containers) == 1
    return containers[0]


def _config(objs: list[dict[str, Any]], tmp_path: Path) -> Config:
    """The ConfigMap's config.yaml, through numa-pin's loader (env empty: nothing else is read)."""
    path = tmp_path / "config.yaml"
    path.write_text(_one(objs, "ConfigMap")["data"]["config.yaml"], encoding="utf-8")
    return load_config(path, {})


def _host_mounts(objs: list[dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (the host path behind it, read-only) for every hostPath volume mounted."""
    volumes = {v["name"]: v for v in _pod(objs)["volumes"]}
    out = {}
    for mount in _container(objs)["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath")
        if host is not None:
            out[mount["mountPath"]] = (host["path"], bool(mount.get("readOnly", False)))
    return out


def _roots(config: Config) -> list[tuple[str, str, str]]:
    """(key, the config's path, the default's path) for every root, lists paired in order."""
    defaults = Config()
    out = []
    for key in ROOT_KEYS:
        ours, theirs = getattr(config, key), getattr(defaults, key)
        if isinstance(ours, tuple):
            assert len(ours) == len(theirs), key
            out.extend((f"{key}[{i}]", a, b) for i, (a, b) in enumerate(zip(ours, theirs, strict=True)))
        else:
            out.append((key, ours, theirs))
    return out


def _nri_socket(objs: list[dict[str, Any]]) -> str:
    args = _container(objs)["args"]
    return str(args[args.index("--nri-socket") + 1])


@pytest.fixture(params=["plain", "chart"])
def objs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return _plain() if request.param == "plain" else render_chart(CHART)


CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding")


def test_the_plain_file_holds_the_objects_in_one_namespace() -> None:
    objs = _plain()
    assert [o["kind"] for o in objs] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "ConfigMap", "DaemonSet"]
    namespace = objs[0]["metadata"]["name"]
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] not in CLUSTER_SCOPED} == {namespace}
    assert _pod(objs)["serviceAccountName"] == objs[1]["metadata"]["name"]
    config_volume = next(v for v in _pod(objs)["volumes"] if "configMap" in v)
    assert config_volume["configMap"]["name"] == _one(objs, "ConfigMap")["metadata"]["name"]


def test_the_chart_renders_the_objects_of_the_plain_file() -> None:
    def by_kind(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(objs, key=lambda o: str(o["kind"]))

    assert by_kind(render_chart(CHART)) == by_kind(_plain())


def test_the_plain_file_is_the_rendered_chart_with_its_comments() -> None:
    assert PLAIN.read_text(encoding="utf-8") == plain_yaml(CHART), "regenerate: python -m tests.deploy.render"


def test_every_root_of_the_config_is_a_mount_of_the_hosts_directory(objs: list[dict[str, Any]],
                                                                     tmp_path: Path) -> None:
    mounts = _host_mounts(objs)
    config = _config(objs, tmp_path)
    for key, ours, host in _roots(config):
        assert ours in mounts, f"{key}: {ours} is not mounted"
        assert mounts[ours][0] == host, f"{key}: {ours} is the host's {mounts[ours][0]}, not {host}"
    socket = _nri_socket(objs)
    assert mounts[os.path.dirname(socket)][0] == os.path.dirname(DEFAULT_SOCKET)
    assert os.path.basename(socket) == os.path.basename(DEFAULT_SOCKET)


def test_every_host_directory_mounted_is_a_root_or_a_listed_use(objs: list[dict[str, Any]], tmp_path: Path) -> None:
    roots = {ours for _, ours, _ in _roots(_config(objs, tmp_path))}
    expected = roots | {os.path.dirname(_nri_socket(objs))} | set(EXTRA_MOUNTS)
    assert set(_host_mounts(objs)) == expected


@pytest.mark.parametrize(("key", "read_only"), [
    ("sysfs_root", True), ("dev_root", True), ("kubelet_root", True), ("cdi_spec_dirs", True),
    ("cgroup_root", False), ("state_dir", False), ("proc_root", False),
], ids=lambda v: str(v))
def test_mount_modes(objs: list[dict[str, Any]], tmp_path: Path, key: str, read_only: bool) -> None:
    """Read-only where numa-pin only reads; the cgroup tree, the ledger and /proc/irq are written."""
    mounts = _host_mounts(objs)
    for name, ours, _ in _roots(_config(objs, tmp_path)):
        if name.split("[")[0] == key:
            assert mounts[ours][1] is read_only, name


def _doc_capabilities() -> dict[str, bool]:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- capabilities:", 1)[1].split("<!-- end capabilities -->", 1)[0]
    out = {}
    for row in re.findall(r"^\| `CAP_([A-Z_]+)` \| (yes|no) \|", table, re.M):
        out[row[0]] = row[1] == "yes"
    assert len(out) == table.count("\n| `CAP_"), "a row of the table is not `| `CAP_X` | yes/no |`"
    return out


def test_the_capabilities_are_the_documented_ones(objs: list[dict[str, Any]]) -> None:
    security = _container(objs)["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    documented = _doc_capabilities()
    assert sorted(security["capabilities"]["add"]) == sorted(c for c, added in documented.items() if added)


def test_the_rollout_keeps_grants_one_node_at_a_time(objs: list[dict[str, Any]], tmp_path: Path) -> None:
    daemonset = _one(objs, "DaemonSet")
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    pod = _pod(objs)
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    state = _config(objs, tmp_path).state_dir
    mount = next(m for m in _container(objs)["volumeMounts"] if m["mountPath"] == state)
    assert "hostPath" in volumes[mount["name"]], "the ledger must outlive the pod"


def test_the_plugin_enters_the_hosts_cgroup_namespace_then_runs_the_entry_point(objs: list[dict[str, Any]],
                                                                                  tmp_path: Path) -> None:
    command = _container(objs)["command"]
    proc = _config(objs, tmp_path).proc_root
    assert command[:3] == ["nsenter", f"--cgroup={proc}/1/ns/cgroup", "--"]
    assert command[3:] == ["numa-pin", "serve", "--nri"]
    env = {e["name"]: e.get("value") for e in _container(objs)["env"]}
    config_mount = next(m for m in _container(objs)["volumeMounts"] if m["name"] == "config")
    assert env["NUMA_PIN_CONFIG"] == f"{config_mount['mountPath']}/config.yaml"


def _verbs_the_publisher_uses(tmp_path: Path) -> set[str]:
    """The RBAC verbs of every request ``publish`` sends to a fake API server while it creates,
    replaces and retries after a conflict (HTTP method -> verb, as the API server authorizes)."""
    from tests.nrt.fake_apiserver import FakeApiServer, account_dir, make_cert

    from numa_pin.cluster.kubeapi import ApiServer
    from numa_pin.cluster.nrtpublish import publish

    cert, key = make_cert(tmp_path)
    server = FakeApiServer(cert, key)
    try:
        api = ApiServer.in_cluster(server.env(), str(account_dir(tmp_path / "sa", cert)))
        obj = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
               "metadata": {"name": "n"}, "zones": []}
        publish(api, obj)
        server.conflicts = 1
        publish(api, {**obj, "zones": [{"name": "node-0"}]})
    finally:
        server.close()
    verb = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}
    return {verb[m] for m in server.methods()}


def test_rbac_grants_exactly_what_the_publisher_uses_to_the_daemonsets_account(objs: list[dict[str, Any]],
                                                                              tmp_path: Path) -> None:
    role, binding = _one(objs, "ClusterRole"), _one(objs, "ClusterRoleBinding")
    assert len(role["rules"]) == 1
    rule = role["rules"][0]
    assert (rule["apiGroups"], rule["resources"]) == (["topology.node.k8s.io"], ["noderesourcetopologies"])
    assert sorted(rule["verbs"]) == ["create", "get", "update"]
    assert set(rule["verbs"]) == _verbs_the_publisher_uses(tmp_path)
    assert not {"resourceNames", "nonResourceURLs"} & set(rule)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    account = _one(objs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    assert _pod(objs)["serviceAccountName"] == account["name"]


def test_the_pod_publishes_under_its_nodes_name_with_a_token(objs: list[dict[str, Any]]) -> None:
    from numa_pin.cli.main import build_parser, selected_command

    container = _container(objs)
    argv = container["command"][4:] + container["args"]
    args = build_parser(selected_command(argv)).parse_args(argv)
    assert args.nri and args.publish_nrt and args.nrt_interval > 0
    assert args.node_name is None, "the name comes from NODE_NAME"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert _pod(objs)["automountServiceAccountToken"] is True


def test_versions_agree() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert chart["version"] == chart["appVersion"] == values["image"]["tag"] == version
    assert _container(_plain())["image"] == f"localhost/numa-pin:{version}"


@pytest.mark.parametrize(("template", "expected"), [
    ("a: {{ .Values.s }}", "a: text"),
    ("a: {{ .Values.t }}", "a: true"),
    ("a: {{ .Values.n.i }}", "a: 3"),
    ("a: |{{ .Values.m | nindent 2 }}", "a: |\n  x\n  y\n  "),
], ids=["string", "bool", "nested-int", "nindent"])
def test_the_renderer_substitutes(template: str, expected: str) -> None:
    values = {"s": "text", "t": True, "n": {"i": 3}, "m": "x\ny\n"}
    assert render(template, values) == expected


@pytest.mark.parametrize("template", [
    "{{ if .Values.s }}x{{ end }}",
    "{{ .Release.Namespace }}",
    "{{- .Values.s }}",
    "{{ .Values.s | quote }}",
    "{{ .Values.missing }}",
], ids=["conditional", "release", "trim", "other-function", "missing-value"])
def test_the_renderer_refuses_what_it_does_not_model(template: str) -> None:
    with pytest.raises((ValueError, KeyError)):
        render(template, {"s": "text"})
