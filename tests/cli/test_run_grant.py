"""What ``numa-pin run`` tells its command: the grant's variables, the grant file, explicit lists.

Oracles: the kit's fake driver files (``proc/driver/nvidia/gpus/<address>/information``, read
here line by line for ``GPU UUID`` and ``Device Minor``), the SR-IOV network device plugin's
variable naming (``PCIDEVICE_`` + resource, upper-cased, ``.`` and ``/`` as ``_``: its README's
``PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE`` example), and the machine spec for CPUs per node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import replace
from numa_pin.cli.run_grant import (
    device_env,
    explicit_cpuset,
    grant_document,
    grant_env,
    pcidevice_variable,
    rank_env,
)
from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant
from numa_pin.testing.machine import build_once
from numa_pin.testing.shapes import shape
from numa_pin.topology.discover import discover
from numa_pin.topology.model import Topology

GPU_RES, VF_RES = "nvidia.com/gpu", "intel.com/sriov_vf"


@pytest.fixture(scope="module")
def gpu8(tmp_path_factory) -> tuple[Topology, Path]:
    built = build_once(shape("gpu8-sriov"), tmp_path_factory.getbasetemp() / "machines")
    return discover(built.sysfs_root, built.proc_root), Path(built.proc_root)


def driver_field(proc: Path, address: str, field: str) -> str:
    for line in (proc / "driver" / "nvidia" / "gpus" / address / "information").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    raise AssertionError(f"{address}: no {field}")


def _grant(**fields) -> Grant:
    return Grant("job-1", "", "job-1", "process", **fields)


def _addresses(topology: Topology, kind: str, node: int, n: int, vf: bool = False) -> tuple[str, ...]:
    return tuple(d.address for d in topology.pci_devices
                 if d.kind == kind and d.numa_node == node and d.is_vf == vf)[:n]


@pytest.mark.parametrize("resource, variable", [
    ("intel.com/sriov_netdevice", "PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE"),
    ("example.com/vf", "PCIDEVICE_EXAMPLE_COM_VF"),
    ("openshift.io/mlx5_a.b", "PCIDEVICE_OPENSHIFT_IO_MLX5_A_B"),
], ids=["plugin-readme", "plain", "dots-in-name"])
def test_pcidevice_names(resource, variable):
    assert pcidevice_variable(resource) == variable


def test_gpus_by_uuid_and_vfs_by_address(gpu8):
    topology, proc = gpu8
    gpus = _addresses(topology, "gpu", 1, 2)
    vfs = _addresses(topology, "nic", 0, 2, vf=True)
    assert len(gpus) == 2 and len(vfs) == 2
    env, warnings = device_env(_grant(devices={GPU_RES: gpus, VF_RES: vfs}), topology)
    assert env == {"CUDA_VISIBLE_DEVICES": ",".join(driver_field(proc, a, "GPU UUID") for a in gpus),
                   "PCIDEVICE_INTEL_COM_SRIOV_VF": ",".join(vfs)}
    assert warnings == []


def test_a_gpu_without_uuid_is_named_by_its_minor(gpu8):
    topology, proc = gpu8
    first, second = _addresses(topology, "gpu", 2, 2)
    devices = tuple(replace(d, gpu_uuid=None) if d.address == second else d for d in topology.pci_devices)
    topology = replace(topology, pci_devices=devices)
    env, warnings = device_env(_grant(devices={GPU_RES: (first, second)}), topology)
    want = [driver_field(proc, first, "GPU UUID"), driver_field(proc, second, "Device Minor")]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(want)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert warnings == []


def test_a_gpu_the_driver_does_not_describe_is_left_out_with_a_warning(gpu8):
    topology, _ = gpu8
    (gpu,) = _addresses(topology, "gpu", 0, 1)
    devices = tuple(replace(d, gpu_uuid=None, gpu_minor=None) if d.address == gpu else d
                    for d in topology.pci_devices)
    env, warnings = device_env(_grant(devices={GPU_RES: (gpu,)}), replace(topology, pci_devices=devices))
    assert env == {"CUDA_VISIBLE_DEVICES": ""}  # no GPU rather than every GPU
    assert len(warnings) == 1 and gpu in warnings[0]


def test_grant_env_and_document(gpu8):
    topology, proc = gpu8
    gpus = _addresses(topology, "gpu", 0, 1)
    node0 = sorted(c for c in topology.cpu_ids if topology.cpus[c].numa == 0)[:4]
    grant = _grant(cpus=frozenset(node0), mems=frozenset({0}), devices={GPU_RES: gpus},
                   memory={"memory": {0: 1 << 30}})
    env, _ = grant_env(grant, topology, "/run/x.json")
    assert parse_list(env["NUMA_PIN_CPUS"]) == frozenset(node0)
    assert (env["NUMA_PIN_MEMS"], env["NUMA_PIN_GRANT_FILE"]) == ("0", "/run/x.json")
    shares = [frozenset(node0[:2]), frozenset(node0[2:])]
    doc = grant_document(grant, topology, shares)
    assert doc["cpus"] == node0 and doc["mems"] == [0] and doc["memory"] == {"memory": {"0": 1 << 30}}
    assert doc["devices"][GPU_RES] == [{"address": gpus[0], "numa_node": 0,
                                       "uuid": driver_field(proc, gpus[0], "GPU UUID"),
                                       "minor": int(driver_field(proc, gpus[0], "Device Minor"))}]
    assert [r["cpus"] for r in doc["ranks"]] == [node0[:2], node0[2:]]
    assert rank_env(shares[1], 1, 2, topology)["NUMA_PIN_RANK"] == "1"


def test_a_shared_grant_exports_no_cpus(gpu8):
    topology, _ = gpu8
    env, _ = grant_env(Grant("job-2", "", "job-2", "shared"), topology, None)
    assert "NUMA_PIN_CPUS" not in env and "NUMA_PIN_GRANT_FILE" not in env


def _node_cpus(topology: Topology, *nodes: int) -> frozenset[int]:
    return frozenset(c for c in topology.cpu_ids if topology.cpus[c].numa in nodes)


@pytest.mark.parametrize("cpu_list, nodes, want", [
    (None, None, lambda t: None),
    ("0-3,8", None, lambda t: frozenset({0, 1, 2, 3, 8})),
    (None, "1", lambda t: _node_cpus(t, 1)),
    (None, "0,2", lambda t: _node_cpus(t, 0, 2)),
    ("0-3,8", "0", lambda t: frozenset({0, 1, 2, 3, 8}) & _node_cpus(t, 0)),
], ids=["neither", "cpu-list", "one-node", "two-nodes", "both-intersect"])
def test_explicit_lists(gpu8, cpu_list, nodes, want):
    topology, _ = gpu8
    assert explicit_cpuset(cpu_list, nodes, topology) == want(topology)


@pytest.mark.parametrize("cpu_list, nodes, flag", [
    ("0-3,x", None, "--cpu-list"),
    ("100000", None, "--cpu-list"),
    (None, "9", "--nodes"),
    ("", None, "--cpu-list"),
], ids=["garbage", "offline-cpu", "missing-node", "empty"])
def test_bad_explicit_lists(gpu8, cpu_list, nodes, flag):
    topology, _ = gpu8
    with pytest.raises(RequestError) as caught:
        explicit_cpuset(cpu_list, nodes, topology)
    assert caught.value.annotation == flag


def test_lists_that_do_not_meet(gpu8):
    topology, _ = gpu8
    cpu = min(_node_cpus(topology, 0))
    with pytest.raises(RequestError, match="leave no CPU"):
        explicit_cpuset(str(cpu), "1", topology)
