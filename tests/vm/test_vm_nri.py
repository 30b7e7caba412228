"""numa-pin as containerd's NRI plugin on the node as users run it, on both containerd lines:
Debian 13 with containerd 1.7 (NRI switched on) and Debian sid with containerd 2.x (NRI on by
default, configuration version 3); systemd as init, cgroup v2, the deb installed,
``numa-pin-nri.service``. Every test runs once per guest.

One qemu run (tests/vm/sysimage.py builds and caches the trixie tree; tests/vm/nri_guest.py runs
inside): kubelet's CRI calls (tests/e2e/cri.py, systemd cgroup driver) make Guaranteed, Burstable
and BestEffort pods, a pod numa-pin refuses, a containerd restart, a plugin restart while pods
run, a pod started while the plugin is down, a release, and a pod-scope pod annotated on the pod. Oracles: the kernel's view of every
container (``Cpus_allowed_list`` of its pid), the guest's NUMA layout (sysimage.NUMA), kubelet's
QoS classes, the raw ledger, and the error containerd's CRI returned (what the pod's event shows).

``NUMA_PIN_VM_CACHE_TRIXIE`` and ``NUMA_PIN_VM_CACHE_SID`` name the caches of the built trees;
``NUMA_PIN_VM_KEEP`` keeps what each guest wrote (under ``<dir>/<suite>``);
``NUMA_PIN_VM_NRI_REUSE`` checks kept shares again without booting.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri.every_path_world import DPDK, GPU_RESOURCES
from nri.test_every_path import (  # tests/ is on the path: its folders are packages
    DEVICE_ROWS,
    EXPECTED,
    GUEST_CELLS,
    GUEST_EFFECTS,
    GUEST_ROWS,
    ROWS,
)
from numa_pin.base.cpuset import parse_list

from . import sysimage

pytestmark = pytest.mark.vm

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "e2e"
REPO = HERE.parent.parent
KEEP_ENV = "NUMA_PIN_VM_KEEP"
REUSE_ENV = "NUMA_PIN_VM_NRI_REUSE"
GUEST_LIB = "/usr/local/lib/np"
ALL = list(range(2 * len(sysimage.NUMA)))
NODES = [frozenset(range(2 * i, 2 * i + 2)) for i in range(len(sysimage.NUMA))]
#: the guest's NUMA node with a PCI function (sysimage.DEVICE), bound to vfio-pci in the guest and
#: selected as the fake GPU node selects its vfio-bound VF (the matrix's ``vfio`` row asks for it)
DEVICE_NODE = 1


def guest_cri_proto(text: str) -> bytes:
    """cri-api's api.proto for the guest's protoc (Debian 13's grpc-tools is protobuf 3.6's, which
    does not know the ``debug_redact`` field option; it changes nothing on the wire)."""
    return re.sub(r"\s*\[debug_redact\s*=\s*true\]", "", text).encode()


@pytest.fixture(scope="module")
def image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DaemonSet's image as a docker archive (packaging/image/build-image.sh: a debootstrap'd
    Debian 12 root and this tree's deb, built once; root, debootstrap and buildah)."""
    reason = None if os.environ.get(REUSE_ENV) else sysimage.unavailable_reason()
    if reason:
        pytest.skip(reason)
    archive = tmp_path_factory.mktemp("image") / "numa-pin-image.tar"
    if os.environ.get(REUSE_ENV):
        return archive  # the kept facts are judged again; nothing is booted
    done = subprocess.run(["bash", str(REPO / "packaging" / "image" / "build-image.sh"), "--archive", str(archive)],
                          capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return archive


@pytest.fixture(scope="module", params=[sysimage.TRIXIE, sysimage.SID], ids=["containerd-1.7", "containerd-2"])
def facts(request: pytest.FixtureRequest, image_archive: Path) -> Iterator[dict]:
    flavour = request.param
    if os.environ.get(REUSE_ENV):
        kept = Path(os.environ[REUSE_ENV]) / flavour.suite / "facts.json"
        if not kept.exists():
            pytest.skip(f"nothing kept for {flavour.suite} in ${REUSE_ENV}")
        yield {**json.loads(kept.read_text()), "flavour": flavour.suite}
        return
    reason = sysimage.unavailable_reason()
    if reason:
        pytest.skip(reason)
    work = Path(tempfile.mkdtemp(prefix="np-nri-guest-"))
    log = work / "build.log"
    try:
        base = sysimage.base_tree(log, flavour)
        deb = sysimage.build_deb(work, log)
        files = {f"{GUEST_LIB}/nri_guest.py": (HERE / "nri_guest.py").read_bytes(),
                 f"{GUEST_LIB}/cri.py": (E2E / "cri.py").read_bytes(),
                 f"{GUEST_LIB}/cri_api/api.proto": guest_cri_proto((E2E / "cri_api" / "api.proto").read_text()),
                 f"{GUEST_LIB}/matrix.json": json.dumps([{"id": r, "annotations": a} for r, a, _ in ROWS if r in GUEST_ROWS]).encode(),
                 f"{GUEST_LIB}/devices.json": json.dumps({"devices": {DPDK: GPU_RESOURCES[DPDK]},
                                                          "ids": list(sysimage.DEVICE[1:])}).encode(),
                 f"{GUEST_LIB}/daemonset_guest.py": (HERE / "daemonset_guest.py").read_bytes(),
                 f"{GUEST_LIB}/numa-pin.yaml": (REPO / "deploy" / "kubernetes" / "numa-pin.yaml").read_bytes(),
                 f"{GUEST_LIB}/numa-pin-image.tar": image_archive.read_bytes()}
        image = sysimage.make_image(base, deb, f"python3 {GUEST_LIB}/nri_guest.py\n", work, log, files=files)
        share = work / "share"
        share.mkdir()
        kernel = sysimage.tree_kernel(base) if flavour.own_kernel else None
        took = sysimage.boot(image, share, timeout=1800, console_log=work / "console.log", kernel=kernel,
                             device_node=DEVICE_NODE)
        (work / "boot-seconds").write_text(f"{took:.0f}\n")
        image.unlink()
        if not (share / "facts.json").exists():
            console = (work / "console.log").read_text(errors="replace")[-4000:]
            boot = (share / "boot1.log").read_text(errors="replace")[-3000:] if (share / "boot1.log").exists() else ""
            pytest.fail(f"the guest wrote no facts; scenario log:\n{boot}\nconsole:\n{console}")
        yield {**json.loads((share / "facts.json").read_text()), "flavour": flavour.suite}
    finally:
        keep = os.environ.get(KEEP_ENV)
        if keep:
            kept = Path(keep) / flavour.suite
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(work, kept, symlinks=True, ignore=shutil.ignore_patterns("*.ext4", "*.deb", "tree"))
        shutil.rmtree(work, ignore_errors=True)


def _step(facts: dict, name: str) -> dict:
    step = facts.get(name)
    assert isinstance(step, dict) and "traceback" not in step, f"step {name} failed in the guest: {step}"
    return step


def _one_node(cpus: list[int]) -> bool:
    return any(set(cpus) <= node for node in NODES)


def test_containerd_with_nri_took_the_plugin(facts: dict) -> None:
    major = "2" if facts["flavour"] == "sid" else "1.7"
    assert re.search(rf" v?{re.escape(major)}\.", facts["containerd"]), facts["containerd"]
    assert facts["nodes"] == [cpus for _, cpus in sysimage.NUMA]
    assert facts["registered_at_start"] is True


def test_each_qos_class_runs_where_its_grant_says(facts: dict) -> None:
    step = _step(facts, "pods")
    ids, seen, grants = step["ids"], step["seen"], step["grants"]
    g = grants[ids["g"]]
    assert g["kind"] == "exclusive" and len(g["cpus"]) == 1 and _one_node(g["cpus"])
    assert seen["g"] == g["cpus"]
    pool = [c for c in ALL if c not in g["cpus"]]
    for shared in ("bu", "be"):
        assert grants[ids[shared]]["kind"] == "shared"
        assert seen[shared] == pool, f"{shared} runs on the shared pool"


def test_a_refusal_is_the_pods_event(facts: dict) -> None:
    step = _step(facts, "refusal")
    assert step["created"] is False
    assert "numa-pin: rejected " in step["error"] and "TopologyAffinityError" in step["error"], step["error"]
    assert not [g for g in step["grants"].values() if len(g["cpus"]) == 3]


@pytest.mark.parametrize("name", ["containerd_restart", "plugin_restart"])
def test_restarts_keep_every_container_where_it_was(facts: dict, name: str) -> None:
    before, after = _step(facts, "pods"), _step(facts, name)
    assert after["reregistered"] is True, "the plugin connected again and synchronised"
    assert after["seen"] == before["seen"]
    assert after["grants"] == before["grants"]


def test_a_pod_started_while_the_plugin_was_down_is_adopted(facts: dict) -> None:
    step = _step(facts, "plugin_down")
    g = _step(facts, "pods")["grants"][_step(facts, "pods")["ids"]["g"]]["cpus"]
    # what containerd does without the plugin: it creates and starts the container unadjusted
    assert step["while_down"]["late"] == [c for c in ALL if c not in g] or step["while_down"]["late"] == ALL
    assert step["id"] not in step["while_down"]["grants"]
    # the plugin came back, synchronised, and gave it exclusive CPUs of one node
    assert step["reregistered"] is True
    late = step["grants"][step["id"]]
    assert late["kind"] == "exclusive" and len(late["cpus"]) == 1 and not set(late["cpus"]) & set(g)
    assert step["seen"]["late"] == late["cpus"]
    pool = [c for c in ALL if c not in g and c not in late["cpus"]]
    assert step["seen"]["bu"] == pool and step["seen"]["be"] == pool


def test_a_removed_pod_gives_its_cpus_back(facts: dict) -> None:
    step, pods = _step(facts, "release"), _step(facts, "pods")
    assert pods["ids"]["g"] not in step["grants"]
    late = _step(facts, "plugin_down")["grants"][_step(facts, "plugin_down")["id"]]["cpus"]
    assert step["seen"]["bu"] == [c for c in ALL if c not in late]


def test_pod_scope_from_the_pods_annotations(facts: dict) -> None:
    """containerd's NRI hands the pod's annotations over: no ``pod_annotations`` passthrough."""
    step = _step(facts, "pod_scope")
    ids, grants, seen = step["ids"], step["grants"], step["seen"]
    app, sidecar = grants[ids["app"]], grants[ids["sidecar"]]
    assert app["kind"] == "exclusive" and len(app["cpus"]) == 1 and seen["app"] == app["cpus"]
    assert sidecar["kind"] == "shared" and not set(seen["sidecar"]) & set(app["cpus"])
    assert {app["pod"], sidecar["pod"]} == {step["sandbox"]} and {app["scope"], sidecar["scope"]} == {"pod"}


def test_pods_started_in_parallel_never_run_on_an_exclusive_cpu(facts: dict) -> None:
    """A shared container created before an exclusive grant and started after it, and a burst of
    pods started at once: no sample of any shared container ever includes the exclusive CPU."""
    step = _step(facts, "parallel_pods")
    grant = step["grants"][step["id"]]
    assert grant["kind"] == "exclusive" and step["exclusive"] == grant["cpus"]
    assert len(step["samples"]) == 10
    for sample in step["samples"]:
        for name, cpus in sample.items():
            assert cpus and not set(cpus) & set(grant["cpus"]), f"{name} ran on exclusive CPU(s): {cpus}"


REFUSAL = re.compile(r"numa-pin: (?:rejected|error) \S+: (\w+): ")


@pytest.mark.parametrize("row", GUEST_ROWS)
def test_the_every_path_table_holds_through_containerd(facts: dict, row: str) -> None:
    """The same row as the fake runtime's NRI path and the hooks (tests/nri/test_every_path.py):
    the same verdict, the grant's CPUs what the container runs on, nothing held after."""
    step = _step(facts, "matrix")
    assert step["grants_before"] == {}
    overrides = next(o for r, _, o in ROWS if r == row)
    seen, want = step[row], GUEST_CELLS.get(row, overrides.get("nri", EXPECTED[row]))
    shown = json.dumps(seen)  # whole: pytest cuts a dict it shows to 240 characters
    if want in ("exclusive", "shared", "mixed"):
        assert seen["admitted"] is True, shown
        grant = seen["grant"]
        assert grant is not None and grant["kind"] == ("shared" if want == "shared" else "exclusive"), shown
        if want == "exclusive":
            assert seen["seen"] == grant["cpus"] and _one_node(grant["cpus"]), shown
        else:  # shared, or mixed: its exclusive CPUs and the pool (all the others, on an emptied node)
            assert seen["seen"] == ALL, shown
            assert (len(grant["cpus"]) == 2 and _one_node(grant["cpus"])) if want == "mixed" else not grant["cpus"]
        if row in GUEST_EFFECTS:
            _assert_guest_effect(seen["host"], grant["cpus"], *GUEST_EFFECTS[row])
        if row in DEVICE_ROWS:
            _assert_guest_devices(_step(facts, "vfio"), grant, seen["devices"])
    else:
        assert seen["admitted"] is False, shown
        found = REFUSAL.search(seen["error"])
        assert found and found.group(1) == want, seen["error"]
    assert step["grants_after"] == {}


def _assert_guest_devices(vfio: dict, grant: dict, container: dict) -> None:
    """The fake GPU node's device checks (tests/nri/test_every_path.py's ``_assert_devices``) with
    the guest's kernel as the oracle: the grant holds the vfio-bound function, with CPUs and memory
    of its NUMA node; the container has its IOMMU group's node and ``/dev/vfio/vfio`` with the
    numbers sysfs gives them, and is told its address as sriov-network-device-plugin names it."""
    assert vfio["driver"] == "vfio-pci" and vfio["numa_node"] == DEVICE_NODE, vfio
    assert grant["devices"] == {DPDK: [vfio["address"]]}, grant
    assert grant["mems"] == [DEVICE_NODE] and set(grant["cpus"]) <= set(parse_list(vfio["node_cpus"])), grant
    assert container["vfio"] == {vfio["group"]: vfio["dev"], "vfio": vfio["container_dev"]}, container
    assert container["env"] == {"PCIDEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", DPDK).upper(): vfio["address"]}, container


def _assert_guest_effect(host: dict, cpus: list[int], what: str, value: str) -> None:
    """One knob's effect as the guest read it while the container ran."""
    if what == "pm_qos":
        assert {int(c): v for c, v in host["pm_qos"].items()} == dict.fromkeys(cpus, value), host
    elif what == "partition":
        assert host["partition"] == value, host
    else:  # new IRQs go to the CPUs the grant does not hold
        mask = int(host["irq_default"].replace(",", ""), 16)
        assert mask and not mask & sum(1 << c for c in cpus), host


@pytest.mark.parametrize("path", ["nri", "podman"])
def test_a_nested_isolated_partition_on_a_kernel_that_has_them(facts: dict, path: str) -> None:
    """``cpu-load-balancing.crio.io: disable`` on the guest's own kernel (Debian's, >= 6.7): the
    container's cgroup, nested under its pod's or podman's, is an isolated partition while it
    runs (the kernel's word, read back), and nothing is held after."""
    ran = _step(facts, f"partition_{path}")
    major, minor = (int(x) for x in ran["kernel"].split(".")[:2])
    assert (major, minor) >= (6, 7), ran["kernel"]
    grant = ran["grant"]
    assert grant is not None and grant["kind"] == "exclusive" and ran["seen"] == grant["cpus"], ran
    isolated = [cg for cg, value in ran["chain"].items() if value.startswith("isolated")]
    assert isolated and all(cg.count("/") >= 2 for cg in isolated), ran["chain"]
    assert ran["after"] == {}


def test_an_exec_starts_on_the_first_exclusive_cpu_where_the_runtime_applies_it(facts: dict) -> None:
    """``numa-pin.io/exec-cpu-affinity: first`` through podman's precreate: the container runs on
    its two exclusive CPUs; a process ``podman exec`` starts there runs on the first of them with
    runc 1.3 or later (sid), and on both with an older runc that ignores the field (Debian 13)."""
    ran = _step(facts, "exec_affinity")
    grant = ran["grant"]
    assert grant is not None and len(grant["cpus"]) == 2 and ran["seen"] == grant["cpus"], ran
    version = re.search(r"(\d+)\.(\d+)", ran["runc"])
    assert version, ran["runc"]
    applies = (int(version.group(1)), int(version.group(2))) >= (1, 3)
    assert sorted(parse_list(ran["exec"])) == (grant["cpus"][:1] if applies else grant["cpus"]), ran


def test_the_daemonsets_pod_is_the_nodes_nri_plugin(facts: dict) -> None:
    """deploy/kubernetes/numa-pin.yaml's DaemonSet pod, from the image built here, run through
    the CRI as kubelet runs it (tests/vm/daemonset_guest.py) in place of the packaged plugin:
    containerd takes it as its NRI plugin, and it admits a Guaranteed pod to exclusive CPUs of
    one node and releases them when the pod goes, as the packaged plugin does."""
    ran = _step(facts, "daemonset")
    assert ran["registered"], ran["log"]
    grant = ran["grant"]
    assert grant is not None and grant["kind"] == "exclusive" and len(grant["cpus"]) == 2, ran
    assert ran["seen"] == grant["cpus"] and _one_node(grant["cpus"]), ran
    assert ran["released"], ran
