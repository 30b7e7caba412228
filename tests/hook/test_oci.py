"""OCI state and config.json parsing: what runc, crun and podman hand the hook."""

import io
import json

import pytest

from numa_pin.errors import HookInputError
from numa_pin.hook.oci import load_spec, parse_spec, read_state

RUNC_STATE = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 4242, "bundle": "/b",
              "annotations": {"numa-pin.io/cpus": "1"}}
CRUN_STATE = {"ociVersion": "1.0", "id": "c2", "status": "created", "pid": 77, "bundle": "/b2", "root": "/b2/rootfs"}
POSTSTOP_STATE = {"ociVersion": "1.2.0", "id": "c3", "status": "stopped", "bundle": "/b3"}
LEGACY_STATE = {"id": "c4", "pid": 1, "bundlePath": "/b4"}


@pytest.mark.parametrize(
    "doc, cid, pid, bundle, annotations",
    [
        (RUNC_STATE, "c1", 4242, "/b", {"numa-pin.io/cpus": "1"}),
        (CRUN_STATE, "c2", 77, "/b2", {}),
        (POSTSTOP_STATE, "c3", None, "/b3", {}),
        (LEGACY_STATE, "c4", 1, "/b4", {}),
    ],
    ids=["runc-creating", "crun-created-extra-root", "poststop-no-pid", "legacy-bundlePath"],
)
def test_read_state(doc, cid, pid, bundle, annotations):
    st = read_state(io.StringIO(json.dumps(doc)))
    assert (st.id, st.pid, st.bundle, dict(st.annotations)) == (cid, pid, bundle, annotations)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "not valid JSON"),
        ("[1,2]", "expected a JSON object"),
        ('{"bundle": "/b"}', "missing container 'id'"),
        ('{"id": "x"}', "missing 'bundle'"),
        ('{"id": "x", "bundle": "/b", "pid": -3}', "bad 'pid'"),
        ('{"id": "x", "bundle": "/b", "pid": "12"}', "bad 'pid'"),
        ('{"id": "x", "bundle": "/b", "annotations": {"a": 1}}', "annotations"),
        ("\xff\xfe", "not valid JSON"),
    ],
    ids=["empty", "not-object", "no-id", "no-bundle", "negative-pid", "string-pid", "non-string-annotation", "garbage"],
)
def test_read_state_rejects(text, needle):
    with pytest.raises(HookInputError, match=needle):
        read_state(io.StringIO(text))


def _spec(**linux):
    return {
        "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-1,3", "BROKEN"]},
        "root": {"path": "rootfs"},
        "annotations": {"k": "v"},
        "linux": {
            "resources": {
                "cpu": {"quota": 200000, "period": 100000, "shares": 2048, "cpus": "2-3"},
                "memory": {"limit": 1 << 30},
                "hugepageLimits": [{"pageSize": "2MB", "limit": 4 << 20}],
            },
            "namespaces": [{"type": "pid"}, {"type": "network", "path": "/var/run/netns/p1"}],
            "cgroupsPath": "system.slice:runc:c1",
            **linux,
        },
    }


def test_parse_spec_fields():
    spec = parse_spec(json.dumps(_spec()), "/bundles/c1")
    assert spec.root_path == "/bundles/c1/rootfs"
    assert spec.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-1,3" and "BROKEN" not in spec.env
    limits = spec.limits
    assert (limits.cpu_quota, limits.cpu_period, limits.cpu_shares) == (200000, 100000, 2048)
    assert limits.memory_limit == 1 << 30
    assert dict(limits.hugepage_limits) == {"2MB": 4 << 20}
    assert spec.netns_path == "/var/run/netns/p1"
    assert limits.cgroups_path == "system.slice:runc:c1"
    assert limits.cpuset == "2-3"


def test_parse_spec_absolute_root_and_minimal():
    spec = parse_spec(json.dumps({"root": {"path": "/abs/root"}}), "/b")
    assert spec.root_path == "/abs/root" and spec.limits.memory_limit is None and dict(spec.annotations) == {}


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"process": {"env": "PATH=/bin"}}, "process.env"),
        ({"root": {"path": 3}}, "root.path"),
        ({"linux": {"resources": {"cpu": {"quota": "lots"}}}}, "cpu.quota"),
        ({"linux": {"resources": {"memory": {"limit": True}}}}, "memory.limit"),
        ({"linux": {"resources": {"hugepageLimits": [{"limit": 1}]}}}, "hugepageLimits"),
    ],
    ids=["env-not-list", "root-not-string", "quota-string", "limit-bool", "hugepage-no-size"],
)
def test_parse_spec_rejects(doc, needle):
    with pytest.raises(HookInputError, match=needle):
        parse_spec(json.dumps(doc), "/b")


def test_load_spec_names_missing_file(tmp_path):
    with pytest.raises(HookInputError, match=str(tmp_path / "config.json")):
        load_spec(str(tmp_path))
