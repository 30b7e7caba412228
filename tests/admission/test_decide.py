"""The pure admission decision on the kit's machine shapes (no sysfs: the spec's own model)."""

from __future__ import annotations

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import request_from_oci
from numa_pin.testing import machine, shapes


def topo(name):
    return machine.expected_topology(shapes.SHAPES[name]())


def busy(t, node, count):
    """A ledger where ``count`` CPUs of ``node`` are already exclusively granted."""
    cpus = frozenset(sorted(t.nodes[node].cpus - {0})[:count])
    return LedgerState(grants={"busy": Grant("busy", "busy", "busy", "exclusive", cpus=cpus, mems=frozenset({node}))})


def nodes_of(t, cpus):
    return {t.cpus[c].numa for c in cpus}


def test_container_scope_packs_into_the_fuller_node():
    t = topo("intel-2s-ht")
    state = busy(t, 0, 12)  # node 0 has 3 free CPUs left (CPU 0 reserved), node 1 has 16
    d = decide(t, state, request_from_oci("c", {"numa-pin.io/cpus": "2"}), NodeSettings(policy="restricted"))
    assert d.admit and nodes_of(t, d.cpus) == {0} and d.mems == frozenset({0})


def test_pod_scope_places_later_containers_inside_the_pods_affinity():
    t = topo("intel-2s-ht")
    state = busy(t, 0, 12)
    settings = NodeSettings(policy="restricted", scope="pod")
    first = decide(t, state, request_from_oci("a", {"numa-pin.io/pod": "p", "numa-pin.io/cpus": "2",
                                                     "numa-pin.io/pod-cpus": "8"}), settings)
    assert first.admit and first.pod_affinity == frozenset({1}), "the pod's 8 CPUs only fit node 1"
    assert nodes_of(t, first.cpus) == {1} and len(first.cpus) == 2
    state = state.with_grant(Grant("a", "user:p", "a", "exclusive", cpus=first.cpus, mems=first.mems)).with_pod(
        PodRecord("user:p", first.pod_affinity, "restricted", "pod"))
    second = decide(t, state, request_from_oci("b", {"numa-pin.io/pod": "p", "numa-pin.io/cpus": "2"}), settings)
    assert second.admit and nodes_of(t, second.cpus) == {1}, "container scope would have chosen node 0"
    alone = decide(t, state, request_from_oci("b", {"numa-pin.io/pod": "p", "numa-pin.io/cpus": "2"}),
                   NodeSettings(policy="restricted", scope="container"))
    assert nodes_of(t, alone.cpus) == {0}


@pytest.mark.parametrize(
    "annotations, admit",
    [
        ({"numa-pin.io/cpus": "20"}, True),
        ({"numa-pin.io/cpus": "20", "numa-pin.io/policy": "single-numa-node"}, False),
        ({"numa-pin.io/cpus": "20", "numa-pin.io/policy": "restricted"}, True),
    ],
    ids=["node-default-best-effort", "override-single-numa-node", "override-restricted"],
)
def test_policy_override_by_annotation(annotations, admit):
    t = topo("intel-2s-ht")
    d = decide(t, LedgerState(), request_from_oci("c", annotations), NodeSettings(policy="best-effort"))
    assert d.admit is admit
    if not admit:
        assert d.reason.startswith("single-numa-node policy:") and "cpu 20 requested" in d.reason


def test_sandbox_and_shared_containers_get_no_exclusive_resources():
    t = topo("laptop")
    for ann in ({}, {"io.kubernetes.cri-o.ContainerType": "sandbox", "numa-pin.io/cpus": "2"}):
        d = decide(t, LedgerState(), request_from_oci("c", ann), NodeSettings())
        assert d.admit and d.cpus == frozenset() and not d.exclusive


def test_device_plugin_gpu_pulls_cpus_and_memory_to_its_node():
    t = topo("gpu8-sriov")
    gpu = next(d for d in t.pci_devices if d.kind == "gpu" and d.numa_node == 2)
    req = request_from_oci("c", {"numa-pin.io/cpus": "4", "numa-pin.io/memory": "1Gi"},
                           {"NVIDIA_VISIBLE_DEVICES": gpu.gpu_uuid})
    d = decide(t, LedgerState(), req, NodeSettings(policy="single-numa-node"))
    assert d.admit and dict(d.devices) == {"nvidia.com/gpu": (gpu.address,)}
    assert nodes_of(t, d.cpus) == {2} and d.mems == frozenset({2})


def test_unknown_fixed_gpu_names_the_env():
    t = topo("gpu8-sriov")
    with pytest.raises(RequestError, match="NVIDIA_VISIBLE_DEVICES"):
        decide(t, LedgerState(), request_from_oci("c", {}, {"NVIDIA_VISIBLE_DEVICES": "GPU-nope"}), NodeSettings())


def test_64_nodes_need_the_option_and_then_work():
    from numa_pin.errors import PolicyError

    t = topo("big-64node")
    req = request_from_oci("c", {"numa-pin.io/cpus": "2"})
    with pytest.raises(PolicyError, match="more than 8 NUMA Nodes"):
        decide(t, LedgerState(), req, NodeSettings(policy="single-numa-node"))
    d = decide(t, LedgerState(), req, NodeSettings(policy="single-numa-node",
                                                   policy_options={"max-allowable-numa-nodes": "64"}))
    assert d.admit and len(nodes_of(t, d.cpus)) == 1


def test_exclusive_cpus_come_from_the_users_cpuset():
    """``linux.resources.cpu.cpus`` 8-15 (node 0's second half): the grant stays inside, where the
    packed allocator alone starts at CPU 1."""
    t = topo("intel-2s-ht")
    d = decide(t, LedgerState(), request_from_oci("c", {"numa-pin.io/cpus": "4"}, limits=ContainerLimits(cpuset="8-11,24-27")),
               NodeSettings(policy="restricted"))
    assert d.admit and len(d.cpus) == 4 and d.cpus <= frozenset({8, 9, 10, 11, 24, 25, 26, 27})


def test_a_users_cpuset_without_free_cpus_rejects():
    t = topo("intel-2s-ht")
    d = decide(t, LedgerState(), request_from_oci("c", {"numa-pin.io/cpus": "1"}, limits=ContainerLimits(cpuset="0")),
               NodeSettings(policy="best-effort"))
    assert not d.admit and d.cpus == frozenset()
    assert d.reason.endswith("only inside the container's cpuset 0 (linux.resources.cpu.cpus))"), d.reason


def test_shared_container_with_no_pool_cpu_in_its_cpuset_is_rejected():
    t = topo("intel-2s-ht")
    state = LedgerState({"x": Grant("x", "x", "x", "exclusive", cpus=frozenset({5}), mems=frozenset({0}))})
    d = decide(t, state, request_from_oci("s", {}, limits=ContainerLimits(cpuset="5")), NodeSettings())
    assert not d.admit and d.reason.startswith("the container's cpuset 5 (linux.resources.cpu.cpus) holds no CPU of "
                                               "the shared pool (0-4,6-31)")
    assert decide(t, state, request_from_oci("s", {}, limits=ContainerLimits(cpuset="5-6")), NodeSettings()).admit


def test_an_exclusive_grant_may_not_starve_a_pinned_shared_container():
    t = topo("intel-2s-ht")
    state = LedgerState({"s": Grant("s", "s", "s", "shared", cpuset_limit=frozenset({1}))})
    d = decide(t, state, request_from_oci("x", {"numa-pin.io/cpus": "1"}, limits=ContainerLimits(cpuset="1")), NodeSettings())
    assert not d.admit and d.reason == (
        "exclusive cpus 1 would leave shared container s without a CPU of its own cpuset 1 (linux.resources.cpu.cpus)")


def _busy_node(t, node, count):
    return LedgerState({"busy": Grant("busy", "busy", "busy", "exclusive",
                                      cpus=frozenset(sorted(t.nodes[node].cpus - {0})[:count]))})


def test_rejection_names_a_device_plugin_gpu_and_its_node():
    """The GPU's node has 4 free CPUs: the per-node counts alone would look as if 8 fit elsewhere."""
    t = topo("gpu8-sriov")
    gpu = next(d for d in t.pci_devices if d.kind == "gpu" and d.numa_node == 2)
    req = request_from_oci("c", {"numa-pin.io/cpus": "8"}, {"NVIDIA_VISIBLE_DEVICES": gpu.gpu_uuid})
    d = decide(t, _busy_node(t, 2, 12), req, NodeSettings(policy="single-numa-node"))
    assert not d.admit
    assert d.reason.endswith(f"; nvidia.com/gpu {gpu.address} already assigned by the device plugin, "
                             "on NUMA node(s) 2)"), d.reason


def test_rejection_names_a_device_plugin_vf_and_its_node():
    from numa_pin.config.schema import config_from_dict
    from numa_pin.service.node import settings_from_config

    t = topo("gpu8-sriov")
    vf = next(d for d in t.pci_devices if d.is_vf and d.numa_node is not None)
    settings = settings_from_config(config_from_dict({"policy": "single-numa-node",
                                                      "devices": {"example.com/vf": [{"is_vf": True}]}}))
    req = request_from_oci("c", {"numa-pin.io/cpus": "8"}, {"PCIDEVICE_EXAMPLE_COM_VF": vf.address})
    d = decide(t, _busy_node(t, vf.numa_node, 12), req, settings)
    assert not d.admit
    assert f"example.com/vf {vf.address} already assigned by the device plugin, on NUMA node(s) {vf.numa_node}" \
        in d.reason, d.reason
