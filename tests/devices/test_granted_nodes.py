"""Granted but usable: a VF bound to vfio-pci and an RDMA NIC get their device nodes, device
rules and sriov-network-device-plugin's variable in the spec at precreate (issue 26, section 2).

Oracles: the kit's sysfs tree as the kernel lays it out (``class/vfio/<group>/dev`` for a VFIO
group, ``<function>/infiniband_verbs/uverbs<N>/dev``, ``class/misc/rdma_cm/dev``), read back
with plain file reads here; the plugin's variable naming (``PCIDEVICE_`` + resource name upper
cased, ``.`` and ``/`` as ``_``: pkg/resources/server.go, getEnvs).
"""

from __future__ import annotations

import pytest

from numa_pin.enforcer.devnodes import function_nodes, pcidevice_env
from numa_pin.hook.precreate import RuntimeFeatures, edit_spec
from numa_pin.ledger.model import Grant
from numa_pin.testing import devtree

SPEC = devtree.gpudirect()


def numbers(path):
    major, minor = path.read_text().strip().split(":")
    return int(major), int(minor)


@pytest.mark.parametrize("resource, env", [("intel.com/e810_vf", "PCIDEVICE_INTEL_COM_E810_VF"),
                                           ("openshift.io/sriov-nic", "PCIDEVICE_OPENSHIFT_IO_SRIOV_NIC")])
def test_the_plugin_variable_name(resource, env):
    assert pcidevice_env(resource) == env


def test_a_vfio_vf_gets_its_group_and_the_container_node(built, topo):
    vf = topo.device(devtree.VFIO_VF)
    assert vf.driver == "vfio-pci"
    group = numbers(built.sysfs_root / "class" / "vfio" / str(vf.iommu_group) / "dev")
    assert [(n.path, n.major, n.minor) for n in function_nodes(vf, str(built.sysfs_root))] == [
        (f"/dev/vfio/{vf.iommu_group}", *group), ("/dev/vfio/vfio", 10, 196)]


def test_an_rdma_nic_gets_its_verbs_and_rdma_cm(built, topo):
    fn = built.pci_dir(devtree.SWITCH_NIC)
    verbs = numbers(fn / "infiniband_verbs" / "uverbs1" / "dev")
    cm = numbers(built.sysfs_root / "class" / "misc" / "rdma_cm" / "dev")
    nodes = function_nodes(topo.device(devtree.SWITCH_NIC), str(built.sysfs_root))
    assert [(n.path, n.major, n.minor) for n in nodes] == [("/dev/infiniband/uverbs1", *verbs),
                                                            ("/dev/infiniband/rdma_cm", *cm)]


def test_a_plain_netdev_vf_needs_no_node(built, topo):
    assert function_nodes(topo.device("0000:32:01.0"), str(built.sysfs_root)) == ()


def test_precreate_writes_nodes_rules_and_the_variable(built, topo):
    grant = Grant("c", "c", "c", "exclusive", cpus=frozenset({2}), mems=frozenset({0}),
                  devices={"intel.com/e810_vf": (devtree.VFIO_VF,), "example.com/rdma": (devtree.SWITCH_NIC,)})
    doc = {"process": {"env": ["PATH=/bin"]}, "linux": {"resources": {}}}
    out, _ = edit_spec(doc, grant, topo, None, RuntimeFeatures(), None, str(built.sysfs_root))
    env = dict(e.split("=", 1) for e in out["process"]["env"])
    assert env["PCIDEVICE_INTEL_COM_E810_VF"] == devtree.VFIO_VF
    assert env["PCIDEVICE_EXAMPLE_COM_RDMA"] == devtree.SWITCH_NIC
    paths = [e["path"] for e in out["linux"]["devices"]]
    group = topo.device(devtree.VFIO_VF).iommu_group
    assert paths == ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm", f"/dev/vfio/{group}", "/dev/vfio/vfio"]
    rules = out["linux"]["resources"]["devices"]
    assert {(r["major"], r["minor"]) for r in rules} == {(e["major"], e["minor"]) for e in out["linux"]["devices"]}
    assert all(r["allow"] and r["type"] == "c" for r in rules)


def test_prestart_takes_the_same_nodes_and_writes_the_variables_file(built, topo):
    """The prestart half (GpuNode) derives the nodes and the devices.env lines from the grant as
    precreate does; GPUs and devices others assigned (numa-pin.io/assigned) are left out."""
    from types import SimpleNamespace

    from numa_pin.resources.devices import ASSIGNED
    from numa_pin.resources.node.gpu import _other_functions

    node = SimpleNamespace(topology=topo, config=SimpleNamespace(sysfs_root=str(built.sysfs_root)))
    grant = Grant("c", "c", "c", "exclusive", devices={
        "intel.com/e810_vf": (devtree.VFIO_VF,), "example.com/rdma": (devtree.SWITCH_NIC,),
        "nvidia.com/gpu": (sorted(d.address for d in topo.pci_devices if d.kind == "gpu")[0],),
        ASSIGNED: (devtree.ROOT_NIC,)})
    nodes, env = _other_functions(node, grant)
    group = topo.device(devtree.VFIO_VF).iommu_group
    assert [n.path for n in nodes] == ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm", f"/dev/vfio/{group}",
                                       "/dev/vfio/vfio"]
    assert env == (f"PCIDEVICE_EXAMPLE_COM_RDMA={devtree.SWITCH_NIC}\n"
                   f"PCIDEVICE_INTEL_COM_E810_VF={devtree.VFIO_VF}\n")
