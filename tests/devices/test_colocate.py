"""``numa-pin.io/colocate``: devices of several resources share a PCIe root, a NUMA node or a
socket, or the container is refused in one line (issue 26, section 3).

Oracles: the kit's declaration of the ``gpudirect`` machine (GPUs 2 and 3 and a ConnectX NIC below
node 1's GPU switch, a second ConnectX below another root port of that root complex, the
ConnectX-6 PF on node 3 beside GPUs 6 and 7, no ConnectX on node 0) and the sysfs directory each
function hangs from (tests/devices/test_pcie.py pins :func:`pcie_root` to it).
"""

from __future__ import annotations

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.devices.inventory import DeviceResource
from numa_pin.devices.pcie import pcie_root
from numa_pin.devices.selector import Selector
from numa_pin.errors import AllocationError, RequestError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.requests.colocate import parse_colocate
from numa_pin.requests.request import request_from_oci
from numa_pin.testing import devtree, machine

SPEC = devtree.gpudirect()
TOPO = machine.expected_topology(SPEC)
GPUS = sorted(p.address for p in SPEC.pci if p.gpu_minor is not None)
RDMA = "example.com/rdma"
NICS = DeviceResource(RDMA, (Selector(vendors=("0x15b3",), is_vf=False),))
NODE1_ROOT = pcie_root(TOPO, devtree.SWITCH_NIC)


def settings(policy):
    return NodeSettings(policy=policy, device_resources=(NICS,))


def holding(gpus):
    return LedgerState(grants={"busy": Grant("busy", "busy", "busy", "shared", devices={"nvidia.com/gpu": tuple(gpus)})})


def ask(colocate=None, gpus=1, nics=1, env=None):
    ann = {"numa-pin.io/cpus": "2", "numa-pin.io/devices": f"nvidia.com/gpu={gpus},{RDMA}={nics}"}
    if gpus == 0:
        ann["numa-pin.io/devices"] = f"{RDMA}={nics}"
    if colocate:
        ann["numa-pin.io/colocate"] = colocate
    return request_from_oci("c", ann, env or {})


def roots(d):
    return {pcie_root(TOPO, a) for ids in d.devices.values() for a in ids}


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
def test_gpu_and_nic_share_a_pcie_root(policy):
    plain = decide(TOPO, LedgerState(), ask(), settings(policy))
    d = decide(TOPO, LedgerState(), ask("pcie-root:nvidia.com/gpu," + RDMA), settings(policy))
    assert d.admit, d.reason
    assert len(roots(d)) == 1 and len(d.devices["nvidia.com/gpu"]) == 1 and len(d.devices[RDMA]) == 1
    if policy == "none":  # without the constraint, the first free GPU and NIC sit on different roots
        assert len(roots(plain)) == 2


def test_two_gpus_and_two_nics_below_one_root():
    d = decide(TOPO, LedgerState(), ask(f"pcie-root:nvidia.com/gpu,{RDMA}", gpus=2, nics=2),
               settings("single-numa-node"))
    assert d.admit and roots(d) == {NODE1_ROOT}
    assert set(d.devices[RDMA]) == {devtree.SWITCH_NIC, devtree.ROOT_NIC}


def test_numa_node_scope_follows_the_free_devices():
    busy = holding([a for a in GPUS if TOPO.device(a).numa_node == 1])
    d = decide(TOPO, busy, ask(f"numa-node:nvidia.com/gpu,{RDMA}"), settings("best-effort"))
    nodes = {TOPO.device(a).numa_node for ids in d.devices.values() for a in ids}
    assert d.admit and nodes == {TOPO.device(devtree.CX6_PF).numa_node}


@pytest.mark.parametrize("policy", ["none", "single-numa-node"])
def test_no_root_holds_them_is_a_one_line_rejection(policy):
    busy = holding([a for a in GPUS if pcie_root(TOPO, a) == NODE1_ROOT] + [GPUS[6], GPUS[7]])
    d = decide(TOPO, busy, ask(f"pcie-root:nvidia.com/gpu,{RDMA}"), settings(policy))
    assert not d.admit and "\n" not in d.reason
    if policy == "none":
        assert "colocate pcie-root: no pcie-root holds 1 example.com/rdma, 1 nvidia.com/gpu" in d.reason


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_strict_policies_refuse_colocate_root_by_root(policy):
    """Node 1's GPUs taken: node 3 still counts 2 GPUs and 1 ConnectX free, but below two roots,
    so no PCIe root holds them. The strict policies say so root by root, as best-effort does,
    rather than a generic affinity error whose per-node counts look sufficient."""
    busy = holding([a for a in GPUS if TOPO.device(a).numa_node == 1])
    node3_gpus = {pcie_root(TOPO, a) for a in GPUS if TOPO.device(a).numa_node == 3}
    assert pcie_root(TOPO, devtree.CX6_PF) not in node3_gpus  # the kit's premise
    best = decide(TOPO, busy, ask(f"pcie-root:nvidia.com/gpu,{RDMA}"), settings("best-effort"))
    d = decide(TOPO, busy, ask(f"pcie-root:nvidia.com/gpu,{RDMA}"), settings(policy))
    assert not best.admit and best.reason.startswith("colocate pcie-root: no pcie-root holds")
    assert not d.admit and "\n" not in d.reason
    assert d.reason == f"{policy} policy: {best.reason}"
    assert d.error is best.error is AllocationError
    assert "nvidia.com/gpu 1 requested, free per node: 0=2 1=0 2=2 3=2" in d.reason  # enough on node 3
    assert "example.com/rdma 1 requested, free per node: 0=0 1=2 2=0 3=1" in d.reason


def test_a_gpu_already_assigned_pins_the_root():
    gpu = GPUS[3]
    env = {"NVIDIA_VISIBLE_DEVICES": str(GPUS.index(gpu))}
    d = decide(TOPO, LedgerState(), ask(f"pcie-root:nvidia.com/gpu,{RDMA}", gpus=0, env=env), settings("none"))
    assert d.admit and d.devices["nvidia.com/gpu"] == (gpu,) and roots(d) == {pcie_root(TOPO, gpu)}


def test_socket_scope():
    d = decide(TOPO, LedgerState(), ask(f"socket:nvidia.com/gpu,{RDMA}"), settings("none"))
    sockets = {TOPO.cpus[next(iter(TOPO.nodes[TOPO.device(a).numa_node].cpus))].socket
               for ids in d.devices.values() for a in ids}
    assert d.admit and len(sockets) == 1


@pytest.mark.parametrize(
    "text, match",
    [("pcie-root:nvidia.com/gpu", "two or more"), ("rack:a.com/x,b.com/y", "unknown value"),
     ("a.com/x,b.com/y", "expected <scope>"), ("pcie-root:a.com/x,b.com/y;socket:b.com/y,c.com/z", "another group"),
     ("pcie-root:gpu,nic", "domain/name")],
    ids=["one-resource", "unknown-scope", "no-scope", "resource-twice", "bare-names"],
)
def test_bad_colocate_annotations_are_named(text, match):
    with pytest.raises(RequestError, match=match) as exc:
        parse_colocate(text, "numa-pin.io/colocate")
    assert "numa-pin.io/colocate" in str(exc.value)
