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
from numa_pin.hook.precreate import edit_spec
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.nri.convert import fill_adjustment
from numa_pin.nri.messages import load as load_messages
from numa_pin.requests.request import Amounts, ContainerRequest
from numa_pin.resources.node.gpu import GpuNode
from numa_pin.resources.node.runtime import RuntimeAsk
from numa_pin.resources.runtime import NRI, precreate_target
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


def _edit(built, topo, grant, target):
    """What the GPU resource's runtime half says the runtime must apply for ``grant``."""
    from types import SimpleNamespace

    node = SimpleNamespace(topology=topo, config=SimpleNamespace(sysfs_root=str(built.sysfs_root),
                                                                 proc_root=str(built.proc_root)))
    return GpuNode().runtime(node, RuntimeAsk(grant, ContainerRequest("c", "c", "c", Amounts()), target, LedgerState()))


GRANT = Grant("c", "c", "c", "exclusive", cpus=frozenset({2}), mems=frozenset({0}),
              devices={"intel.com/e810_vf": (devtree.VFIO_VF,), "example.com/rdma": (devtree.SWITCH_NIC,)})


def test_precreate_writes_nodes_rules_and_the_variable(built, topo):
    doc = {"process": {"env": ["PATH=/bin"]}, "linux": {"resources": {}}}
    out = edit_spec(doc, _edit(built, topo, GRANT, precreate_target(False, False)))
    env = dict(e.split("=", 1) for e in out["process"]["env"])
    assert env["PCIDEVICE_INTEL_COM_E810_VF"] == devtree.VFIO_VF
    assert env["PCIDEVICE_EXAMPLE_COM_RDMA"] == devtree.SWITCH_NIC
    paths = [e["path"] for e in out["linux"]["devices"]]
    group = topo.device(devtree.VFIO_VF).iommu_group
    assert paths == ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm", f"/dev/vfio/{group}", "/dev/vfio/vfio"]
    rules = out["linux"]["resources"]["devices"]
    assert {(r["major"], r["minor"]) for r in rules} == {(e["major"], e["minor"]) for e in out["linux"]["devices"]}
    assert all(r["allow"] and r["type"] == "c" for r in rules)


def test_nri_adjusts_the_same_nodes_rules_and_variables_as_precreate(built, topo):
    """The two paths where the runtime applies the grant write one edit: the same device nodes
    (path, type, numbers), the same allow rules and the same variables."""
    spec = edit_spec({"linux": {}}, _edit(built, topo, GRANT, precreate_target(False, False)))
    adjust = load_messages().api("ContainerAdjustment")()
    fill_adjustment(adjust, _edit(built, topo, GRANT, NRI))
    assert [(d.path, d.type, d.major, d.minor) for d in adjust.linux.devices] == [
        (e["path"], e["type"], e["major"], e["minor"]) for e in spec["linux"]["devices"]]
    assert [(r.type, r.major.value, r.minor.value, r.access) for r in adjust.linux.resources.devices] == [
        (r["type"], r["major"], r["minor"], r["access"]) for r in spec["linux"]["resources"]["devices"]]
    assert {kv.key: kv.value for kv in adjust.env} == dict(e.split("=", 1) for e in spec["process"]["env"])


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
    assert env == {"PCIDEVICE_EXAMPLE_COM_RDMA": devtree.SWITCH_NIC, "PCIDEVICE_INTEL_COM_E810_VF": devtree.VFIO_VF}


def test_no_quota_reaches_the_config_and_the_adjustment_alike():
    """``cpu-quota.crio.io: disable`` on an exclusive grant: the runtime is told no quota (-1) by
    both paths that leave the grant to it, at creation and in updates; a shared grant, nothing."""
    from numa_pin.resources.node.isolation import QuotaNode

    asked = Grant("c", "c", "c", "exclusive", cpus=frozenset({2}), isolation={"quota": "disable"})
    for grant, want in ((asked, -1), (Grant("s", "s", "s", "shared", isolation={"quota": "disable"}), None)):
        for request in (ContainerRequest("c", "c", "c", Amounts()), None):
            edit = QuotaNode().runtime(None, RuntimeAsk(grant, request, NRI, LedgerState()))
            assert (edit.cpu_quota if edit else None) == want
    edit = QuotaNode().runtime(None, RuntimeAsk(asked, None, NRI, LedgerState()))
    spec = edit_spec({"linux": {"resources": {"cpu": {"quota": 100000, "period": 100000}}}}, edit)
    assert spec["linux"]["resources"]["cpu"] == {"quota": -1, "period": 100000}
    adjust = load_messages().api("ContainerAdjustment")()
    fill_adjustment(adjust, edit)
    assert adjust.linux.resources.cpu.quota.value == -1
