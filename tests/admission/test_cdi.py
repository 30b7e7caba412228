"""Devices chosen through CDI are fixed devices that CPUs and memory align to (issue 13).

Oracles: the kit's own machine description (which GPU sits on which node, its UUID and the
PCI addresses of the VFs, all written by ``numa_pin.testing.shapes``) and kubelet's semantics for
fixed devices, already pinned for ``NVIDIA_VISIBLE_DEVICES`` in test_decide.py: the same GPU named
through CDI must give the same decision as through the device plugin's variable.
"""

from __future__ import annotations

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.devices.cdi import devices_from_annotations, is_qualified_name
from numa_pin.devices.inventory import DeviceResource
from numa_pin.devices.selector import Selector
from numa_pin.errors import RequestError
from numa_pin.ledger.model import LedgerState
from numa_pin.requests.request import request_from_oci
from numa_pin.testing import machine, shapes

GPU8 = machine.expected_topology(shapes.SHAPES["gpu8-sriov"]())
SNN = NodeSettings(policy="single-numa-node")
#: the kit's GPUs, in PCI address order (NVML's default enumeration)
KIT_GPUS = sorted((d for d in GPU8.pci_devices if d.kind == "gpu"), key=lambda d: d.address)
NODE2_GPU = next(g for g in KIT_GPUS if g.numa_node == 2)
E810_VFS = sorted(d.address for d in GPU8.pci_devices if d.address.startswith("0000:32:01."))


def nodes_of(cpus):
    return {GPU8.cpus[c].numa for c in cpus}


@pytest.mark.parametrize(
    "text, ok",
    [("nvidia.com/gpu=0", True), ("nvidia.com/gpu=all", True), ("nvidia.com/gpu=GPU-1234-ab", True),
     ("vendor.com/class=name", True), ("nvidia.com/gpu=0:1", True), ("intel.com/vf=0000:32:01.1", True),
     ("nvidia.com/gpu", False), ("gpu=0", False), ("nvidia.com/gpu=", False), ("/gpu=0", False),
     ("nvidia.com/gpu=0=1", False)],
)
def test_qualified_names(text, ok):
    assert is_qualified_name(text) is ok


def test_annotations_are_read_in_key_order_without_duplicates():
    devs = devices_from_annotations({"cdi.k8s.io/b": "nvidia.com/gpu=1", "other": "x",
                                     "cdi.k8s.io/a": "nvidia.com/gpu=0, nvidia.com/gpu=1"})
    assert [str(d) for d in devs] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert devs[0].source == "cdi.k8s.io/a"


def test_a_malformed_cdi_annotation_is_named():
    with pytest.raises(RequestError, match="cdi.k8s.io/x"):
        request_from_oci("c", {"cdi.k8s.io/x": "not a name"})


@pytest.mark.parametrize(
    "how",
    ["annotation-index", "annotation-uuid", "annotation-mig", "env-cdi-name"],
)
def test_a_cdi_gpu_on_node_2_pulls_cpus_and_memory_to_node_2(how):
    index = KIT_GPUS.index(NODE2_GPU)
    ann = {"numa-pin.io/cpus": "4", "numa-pin.io/memory": "1Gi"}
    env = {}
    if how == "annotation-index":
        ann["cdi.k8s.io/gpu"] = f"nvidia.com/gpu={index}"
    elif how == "annotation-uuid":
        ann["cdi.k8s.io/gpu"] = f"nvidia.com/gpu={NODE2_GPU.gpu_uuid}"
    elif how == "annotation-mig":
        ann["cdi.k8s.io/gpu"] = f"nvidia.com/gpu={index}:0"
    else:
        env["NVIDIA_VISIBLE_DEVICES"] = f"nvidia.com/gpu={index}"
    d = decide(GPU8, LedgerState(), request_from_oci("c", ann, env), SNN)
    assert d.admit and dict(d.devices) == {"nvidia.com/gpu": (NODE2_GPU.address,)}
    assert nodes_of(d.cpus) == {2} and d.mems == frozenset({2})
    plugin = decide(GPU8, LedgerState(), request_from_oci(
        "c", {"numa-pin.io/cpus": "4", "numa-pin.io/memory": "1Gi"}, {"NVIDIA_VISIBLE_DEVICES": NODE2_GPU.gpu_uuid}),
        SNN)
    assert (plugin.cpus, plugin.mems, dict(plugin.devices)) == (d.cpus, d.mems, dict(d.devices))


def test_cdi_alone_makes_a_request():
    req = request_from_oci("c", {"cdi.k8s.io/gpu": f"nvidia.com/gpu={NODE2_GPU.gpu_uuid}"})
    d = decide(GPU8, LedgerState(), req, SNN)
    assert d.admit and dict(d.devices) == {"nvidia.com/gpu": (NODE2_GPU.address,)} and d.mems == frozenset({2})


def test_all_gpus_span_every_node_and_single_numa_node_refuses():
    nodes = {g.numa_node for g in KIT_GPUS}
    assert len(nodes) > 1
    d = decide(GPU8, LedgerState(), request_from_oci("c", {"numa-pin.io/cpus": "2",
                                                           "cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), SNN)
    assert not d.admit


@pytest.mark.parametrize("name", [f"nvidia.com/gpu={len(KIT_GPUS)}", "nvidia.com/gpu=GPU-nope"])
def test_an_unknown_cdi_gpu_names_the_annotation(name):
    with pytest.raises(RequestError, match="cdi.k8s.io/gpu"):
        decide(GPU8, LedgerState(), request_from_oci("c", {"cdi.k8s.io/gpu": name}), SNN)


E810 = NodeSettings(policy="single-numa-node", device_resources=(
    DeviceResource("intel.com/e810_vf", (Selector(vendors=("0x8086",), devices=("0x1889",)),)),))


@pytest.mark.parametrize("name", ["0000:32:01.2", "32:01.2", "2"], ids=["address", "short-address", "index"])
def test_other_kinds_map_through_the_configured_resource_of_that_name(name):
    req = request_from_oci("c", {"numa-pin.io/cpus": "2", "cdi.k8s.io/net": f"intel.com/e810_vf={name}"})
    d = decide(GPU8, LedgerState(), req, E810)
    assert d.admit and dict(d.devices) == {"intel.com/e810_vf": (E810_VFS[2],)}
    assert nodes_of(d.cpus) == {0}  # the E810 PF and its VFs sit on node 0 in the kit


def test_a_cdi_kind_without_a_resource_is_left_to_the_cdi_spec_files():
    """No configured resource maps ``vendor.com/fpga``: the pure mapping leaves it alone (the hook
    resolves it through the CDI spec files: tests/devices/test_device_nodes.py)."""
    d = decide(GPU8, LedgerState(), request_from_oci("c", {"cdi.k8s.io/x": "vendor.com/fpga=0"}), E810)
    assert d.admit and not d.devices
