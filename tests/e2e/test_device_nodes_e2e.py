"""Device nodes a container carries, and the vfio / RDMA nodes numa-pin grants, with real runc,
real ``numa-pin-hook`` (prestart, createRuntime, poststop) and real cgroups on this machine.

The node's PCI functions come from a kit sysfs tree (config ``sysfs_root``): two NUMA nodes of one
CPU each, an accelerator whose ``/sys/dev/char/240:0`` resolves to a function on one of them, an
RDMA NIC (verbs node ``241:192``) and an E810 VF bound to ``vfio-pci`` (``/dev/vfio/<group>``).
The majors are from the local/experimental range (and the kit's VFIO group major), none of which
this machine has a driver for, so a number seen in the container can only have come from the
kit tree. This machine's kernel has one memory node (0), so the devices sit on node 0 of the tree
(CPU 0; node 1 is CPU 1): an aligned container gets CPU 0 and mems 0, and with CPU 0 reserved the
same container is refused, where without its device node it would fit on node 1 (``plan``). A
node-1 device whose memory lands in the real cgroup needs a multi-node kernel (the VM tier).

Oracles: the container cgroup's real ``cpuset.cpus``/``cpuset.mems`` and ``devices.list``, what
the kernel shows in the container (``ls -ln`` of the nodes, ENXIO rather than EPERM on open, the
grant file, the environment), and the tree's own ``node<N>/cpulist`` and ``dev`` files read here.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
from pathlib import Path

import pytest

from numa_pin.enforcer import cgroups
from numa_pin.enforcer.mounts import detect_layout
from numa_pin.ledger.store import Ledger
from numa_pin.testing import machine
from numa_pin.testing.devtree import make_dev_nodes, write_cdi_spec
from numa_pin.testing.pci_spec import CLASS_ETHERNET, PciSpec, VfSpec
from numa_pin.testing.spec import MachineSpec

from . import harness

pytestmark = pytest.mark.e2e

ACCEL, ACCEL_NODE = "0000:41:00.0", ("/dev/accel0", 240, 0)
RDMA_NIC, E810_PF, VFIO_VF = "0000:3f:00.0", "0000:32:00.0", "0000:32:01.1"
ONE_CPU = {"numa-pin.io/cpus": "1"}
VFIO_AND_RDMA = {"numa-pin.io/devices": "intel.com/e810_vfio=1,example.com/rdma=1"}
DEVICE_NODE = 0  # the only memory node this kernel has: the devices' node in the tree
#: a character device in busybox ``ls -ln``: ``crw-------    1 0   0   240,   0 Jan  1 00:00 /dev/accel0``
_LS = re.compile(r"^c\S*\s+\d+\s+\d+\s+\d+\s+(?P<major>\d+),\s*(?P<minor>\d+)\s.*\s(?P<path>/\S+)$")


def _spec() -> MachineSpec:
    """Two nodes of one CPU each (as this machine's CPUs 0 and 1); every PCI function on node
    :data:`DEVICE_NODE`."""
    n = DEVICE_NODE
    return MachineSpec(
        name="devnodes-e2e", sockets=2, cores_per_node=1, pci=(
            PciSpec(ACCEL, "0x1ded", "0x8000", "0x120000", n, driver="accel_stand_in",
                    dev_nodes=(f"accel/accel0={ACCEL_NODE[1]}:{ACCEL_NODE[2]}",)),
            PciSpec(RDMA_NIC, "0x15b3", "0x101b", CLASS_ETHERNET, n, driver="mlx5_core", netdevs=("ib0",),
                    dev_nodes=("infiniband_verbs/uverbs1=241:192",)),
            PciSpec(E810_PF, "0x8086", "0x1592", CLASS_ETHERNET, n, driver="ice", netdevs=("ens2f0",),
                    sriov_totalvfs=2, sriov_numvfs=2, vf_device="0x1889",
                    vfs=(VfSpec("0000:32:01.0", netdev="ens2f0v0"), VfSpec(VFIO_VF, netdev=None, driver="vfio-pci"))),
        ))


def _numbers(dev_file: Path) -> tuple[int, int]:
    major, minor = dev_file.read_text().strip().split(":")
    return int(major), int(minor)


@pytest.fixture
def kit_node(state_dir, tmp_path, tmp_path_factory):
    """``make(reserved)``: a built kit tree, a dev root with the accelerator's real node, and
    the hook entries of a node config that reads both (and this machine's /proc and cgroups)."""
    hook = harness.numa_pin_hook_path()
    if hook is None:
        pytest.skip("numa-pin-hook is not installed")
    if not Path("/sys/fs/cgroup/devices").is_dir():
        pytest.skip("needs a cgroup v1 devices hierarchy")

    def make(reserved: str | None = None):
        built = machine.build_once(_spec(), tmp_path_factory.getbasetemp())
        dev_root = tmp_path / "dev"
        make_dev_nodes(dev_root, [ACCEL_NODE])
        # a DRA driver's CDI spec: the node without numbers, so numa-pin reads them from dev_root
        write_cdi_spec(tmp_path / "cdi", "example.com/accel", {"a0": [(ACCEL_NODE[0], None, None)]})
        config, ledger = state_dir / "config.yaml", state_dir / "ledger"
        cpu_manager = {"reserved_cpus": reserved} if reserved else {"num_reserved_cpus": 0}
        config.write_text(json.dumps({
            "policy": "single-numa-node", "state_dir": str(ledger), "syslog": False,
            "sysfs_root": str(built.sysfs_root), "dev_root": str(dev_root),
            "cdi_spec_dirs": [str(tmp_path / "cdi")], "cpu_manager": cpu_manager,
            "devices": {"example.com/rdma": [{"addresses": [RDMA_NIC]}],
                        "intel.com/e810_vfio": [{"drivers": ["vfio-pci"]}]},
        }))
        env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               f"NUMA_PIN_CACHE_DIR={state_dir / 'cache'}"]
        hooks = {stage: [harness.hook_entry(hook, ["numa-pin-hook", "--config", str(config), stage], env=env,
                                            timeout=30)]
                 for stage in ("prestart", "createRuntime", "poststop")}
        return built, dev_root, hooks, ledger, config

    return make


def _bundle(tmp_path: Path, name: str, rootfs: Path, hooks, annotations, devices=()) -> Path:
    bundle = harness.make_bundle(tmp_path / name, args=["sleep", "1000"], annotations=annotations, hooks=hooks,
                                 rootfs=rootfs)
    doc = json.loads((bundle / "config.json").read_text())
    doc["linux"]["devices"] = [{"path": p, "type": "c", "major": ma, "minor": mi, "fileMode": 0o600}
                               for p, ma, mi in devices]
    (bundle / "config.json").write_text(json.dumps(doc))
    return bundle


def _nodes_seen(rt: harness.OciRuntime, cid: str, paths) -> dict[str, tuple[int, int]]:
    """``{path: (major, minor)}`` of the character devices ``ls -ln`` shows in the container."""
    res = rt._exec("exec", cid, "sh", "-c", "ls -ln " + " ".join(paths) + " 2>&1; true", timeout=60)
    found = (_LS.match(line) for line in res.stdout.splitlines())
    return {m["path"]: (int(m["major"]), int(m["minor"])) for m in found if m}


def _devices_list(pid: int) -> str:
    found = cgroups.find_v1_controller_dir(pid, "/proc", "/sys/fs/cgroup", detect_layout("/proc"), "devices")
    assert found is not None
    return Path(found, "devices.list").read_text()


#: how a container carries the accelerator: its node in ``linux.devices``, or a CDI name whose spec
#: file gives the node's path only
CARRIERS = [pytest.param({}, [ACCEL_NODE], id="linux.devices"),
            pytest.param({"cdi.k8s.io/claim": "example.com/accel=a0"}, [], id="cdi-name")]


@pytest.mark.parametrize("ann, devices", CARRIERS)
def test_a_container_carrying_a_device_node_gets_the_cpus_and_memory_of_its_node(
        runc_rt, kit_node, busybox_rootfs, tmp_path, cid, ann, devices):
    built, dev_root, hooks, _, _ = kit_node()
    want_cpus = (built.sysfs_root / "devices" / "system" / "node" / f"node{DEVICE_NODE}" / "cpulist").read_text()
    link = (built.sysfs_root / "dev" / "char" / f"{ACCEL_NODE[1]}:{ACCEL_NODE[2]}").resolve()
    assert ACCEL in link.parts and stat.S_ISCHR((dev_root / "accel0").stat().st_mode)
    bundle = _bundle(tmp_path, "accel", busybox_rootfs, hooks, {**ONE_CPU, **ann}, devices)
    with harness.running_container(runc_rt, bundle, cid) as st:
        cs = harness.read_cpuset(st["pid"])
        assert (cs.cpus, cs.mems) == (want_cpus.strip(), str(DEVICE_NODE)), "the CPUs and memory of the device's node"
        if devices:  # runc made it from linux.devices (a CDI name is the CDI-aware runtime's to inject)
            assert _nodes_seen(runc_rt, cid, [ACCEL_NODE[0]]) == {ACCEL_NODE[0]: ACCEL_NODE[1:]}


@pytest.mark.parametrize("ann, devices", CARRIERS)
def test_a_device_node_whose_node_has_no_free_cpu_is_refused_where_without_it_the_container_fits(
        runc_rt, kit_node, busybox_rootfs, tmp_path, cid, ann, devices):
    """The device's node's only CPU is reserved: single-numa-node cannot align the container, so
    the runtime refuses it; the same request without the node would get the other node's CPU."""
    reserved = "0"
    built, _, hooks, ledger, config = kit_node(reserved)
    node_cpus = (built.sysfs_root / "devices" / "system" / "node" / f"node{DEVICE_NODE}" / "cpulist").read_text()
    assert node_cpus.strip() == reserved, "the device's node has no CPU left to give"
    bundle = _bundle(tmp_path, "accel", busybox_rootfs, hooks, {**ONE_CPU, **ann}, devices)
    res = runc_rt.run(bundle, cid)
    assert res.returncode != 0 and f"numa-pin: rejected {cid}: TopologyAffinityError" in res.stderr, res.stderr
    assert not Ledger(str(ledger)).read().grants and cid not in runc_rt.list_ids()
    plain = _bundle(tmp_path, "plain", busybox_rootfs, hooks, ONE_CPU)
    plan = subprocess.run([str(harness.numa_pin_hook_path().with_name("numa-pin")), "plan", "--json", "--config",
                           str(config), "--bundle", str(plain)], capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    other = (built.sysfs_root / "devices" / "system" / "node" / f"node{1 - DEVICE_NODE}" / "cpulist").read_text()
    decided = json.loads(plan.stdout)
    assert (decided["cpus"], decided["mems"]) == (other.strip(), str(1 - DEVICE_NODE)), plan.stdout


def test_granted_vfio_and_rdma_nodes_are_usable_and_gone_with_the_container(
        runc_rt, kit_node, busybox_rootfs, tmp_path, cid):
    built, _, hooks, ledger, _ = kit_node()
    want = _granted_nodes(built)
    group = int(built.pci_dir(VFIO_VF).joinpath("iommu_group").resolve().name)
    bundle = _bundle(tmp_path, "vfio", busybox_rootfs, hooks, VFIO_AND_RDMA)
    with harness.running_container(runc_rt, bundle, cid) as st:
        pid = int(st["pid"])
        grant = Ledger(str(ledger)).read().grants[cid]
        assert grant.devices == {"intel.com/e810_vfio": (VFIO_VF,), "example.com/rdma": (RDMA_NIC,)}
        assert _nodes_seen(runc_rt, cid, want) == want
        probe = "cat /run/numa-pin/devices.env /dev/numa-pin/devices.env 2>/dev/null; true"
        res = runc_rt._exec("exec", cid, "sh", "-c", probe, timeout=60)
        assert f"PCIDEVICE_INTEL_COM_E810_VFIO={VFIO_VF}" in res.stdout.splitlines(), res.stdout
        assert f"PCIDEVICE_EXAMPLE_COM_RDMA={RDMA_NIC}" in res.stdout.splitlines(), res.stdout
        rules = {f"c {major}:{minor} rwm" for major, minor in want.values()}
        listed = set(_devices_list(pid).splitlines())
        assert rules <= listed, listed
        opened = runc_rt._exec("exec", cid, "sh", "-c", f"echo > /dev/vfio/{group} && echo OPENED", timeout=60)
        assert "No such device or address" in opened.stderr and "OPENED" not in opened.stdout, \
            "the cgroup lets the open through to the kernel (no driver for the kit's major: ENXIO, not EPERM)"
        cgroup_dir = cgroups.find_v1_controller_dir(pid, "/proc", "/sys/fs/cgroup",
                                                    detect_layout("/proc"), "devices")
    assert cid not in Ledger(str(ledger)).read().grants, "poststop released the grant"
    assert cgroup_dir is not None
    gone = not Path(cgroup_dir).exists() or not rules & set(Path(cgroup_dir, "devices.list").read_text().splitlines())
    assert gone, "the container's device rules ended with it"
    with harness.running_container(runc_rt, _bundle(tmp_path, "next", busybox_rootfs, {}, {}),
                                   harness.new_container_id()) as st:
        assert not rules & set(_devices_list(int(st["pid"])).splitlines()), "the next container gets none of them"


def _granted_nodes(built) -> dict[str, tuple[int, int]]:
    """The nodes a grant of :data:`VFIO_VF` and :data:`RDMA_NIC` brings, numbers from the tree."""
    group = int(built.pci_dir(VFIO_VF).joinpath("iommu_group").resolve().name)
    return {
        f"/dev/vfio/{group}": _numbers(built.sysfs_root / "class" / "vfio" / str(group) / "dev"),
        "/dev/vfio/vfio": _numbers(built.sysfs_root / "class" / "misc" / "vfio" / "dev"),
        "/dev/infiniband/uverbs1": _numbers(built.pci_dir(RDMA_NIC) / "infiniband_verbs" / "uverbs1" / "dev"),
        "/dev/infiniband/rdma_cm": _numbers(built.sysfs_root / "class" / "misc" / "rdma_cm" / "dev"),
    }


def test_release_of_a_live_container_takes_its_vfio_and_rdma_nodes_back(
        runc_rt, kit_node, busybox_rootfs, tmp_path, cid):
    """``numa-pin release --force ID`` while the container runs: nodes and device rules go, the
    container stays (tracked as a shared one)."""
    built, _, hooks, ledger, config = kit_node()
    want = _granted_nodes(built)
    rules = {f"c {major}:{minor} rwm" for major, minor in want.values()}
    bundle = _bundle(tmp_path, "vfio", busybox_rootfs, hooks, VFIO_AND_RDMA)
    with harness.running_container(runc_rt, bundle, cid) as st:
        pid = int(st["pid"])
        assert _nodes_seen(runc_rt, cid, want) == want and rules <= set(_devices_list(pid).splitlines())
        cli = harness.numa_pin_hook_path().with_name("numa-pin")
        res = subprocess.run([str(cli), "release", "--force", cid, "--config", str(config)], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert not Ledger(str(ledger)).read().grants[cid].devices, "tracked as a shared container, without devices"
        assert _nodes_seen(runc_rt, cid, want) == {}, "the nodes are gone from the running container"
        assert not rules & set(_devices_list(pid).splitlines()), "and its device cgroup no longer allows them"


def test_podman_precreate_puts_the_nodes_rules_and_variables_into_the_config_runc_gets(
        podman_runc, kit_node, busybox_rootfs, tmp_path):
    """Only the precreate and poststop hooks: whatever the container has came through its config."""
    built, _, _, ledger, config = kit_node()
    want = _granted_nodes(built)
    hooks = tmp_path / "hooks.d"
    packaging = Path(__file__).resolve().parents[2] / "packaging"
    hooks.mkdir()
    for name in ("podman/hooks.d/numa-pin-precreate.json", "hooks.d/numa-pin-release.json"):
        doc = json.loads((packaging / name).read_text())
        doc["hook"]["path"] = str(harness.numa_pin_hook_path())
        doc["hook"]["args"] = ["numa-pin-hook", "--config", str(config), doc["hook"]["args"][-1]]
        doc["hook"]["env"] = [*doc["hook"]["env"], f"NUMA_PIN_CACHE_DIR={ledger.parent / 'cache'}"]
        (hooks / Path(name).name).write_text(json.dumps(doc))
    group = next(p for p in want if p.startswith("/dev/vfio/") and p != "/dev/vfio/vfio")
    probe = "ls -ln " + " ".join(want) + f"; env; echo > {group}; true"
    # podman splits --annotation at commas unless the whole value is one quoted CSV field
    ((key, value),) = VFIO_AND_RDMA.items()
    res = harness.run_podman(busybox_rootfs, args=["sh", "-c", probe], store=podman_runc,
                             extra=["--annotation", f'"{key}={value}"'], hooks_dir=hooks, name=harness.new_container_id())
    assert res.returncode == 0, res.stderr
    seen = {m["path"]: (int(m["major"]), int(m["minor"])) for line in res.stdout.splitlines() if (m := _LS.match(line))}
    assert seen == want, res.stdout
    lines = res.stdout.splitlines()
    assert f"PCIDEVICE_INTEL_COM_E810_VFIO={VFIO_VF}" in lines and f"PCIDEVICE_EXAMPLE_COM_RDMA={RDMA_NIC}" in lines
    assert "No such device or address" in res.stderr, "the device rule let the open reach the kernel (ENXIO, not EPERM)"
    assert not Ledger(str(ledger)).read().grants, "poststop released the grant"
