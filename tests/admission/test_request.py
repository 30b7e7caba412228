"""Requests from annotations, linux.resources and device-plugin env (kubelet-compatible inference)."""

import pytest

from numa_pin.errors import RequestError
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import Inference, parse_devices, request_from_oci

GI = 1 << 30
MI = 1 << 20


@pytest.mark.parametrize(
    "annotations, cpus, memory, hugepages, devices",
    [
        ({"numa-pin.io/cpus": "2"}, 2, 0, {}, {}),
        ({"numa-pin.io/cpus": "1", "numa-pin.io/memory": "512Mi"}, 1, 512 * MI, {}, {}),
        ({"numa-pin.io/hugepages-2Mi": "64Mi", "numa-pin.io/hugepages-1Gi": "2Gi"}, 0, 0,
         {"hugepages-2Mi": 64 * MI, "hugepages-1Gi": 2 * GI}, {}),
        ({"numa-pin.io/devices": "nvidia.com/gpu=2, intel.com/sriov=1"}, 0, 0, {},
         {"nvidia.com/gpu": 2, "intel.com/sriov": 1}),
        ({}, 0, 0, {}, {}),
    ],
    ids=["cpus", "cpus-memory", "hugepages", "devices", "nothing"],
)
def test_annotations(annotations, cpus, memory, hugepages, devices):
    req = request_from_oci("c1", annotations)
    assert req.amounts.cpus == cpus
    assert req.amounts.memory == memory
    assert dict(req.amounts.hugepages) == hugepages
    assert dict(req.amounts.devices) == devices


@pytest.mark.parametrize(
    "annotations, bad_key",
    [
        ({"numa-pin.io/cpus": "-1"}, "numa-pin.io/cpus"),
        ({"numa-pin.io/cpus": "two"}, "numa-pin.io/cpus"),
        ({"numa-pin.io/cpus": "99999999999999999999999"}, "numa-pin.io/cpus"),
        ({"numa-pin.io/cpus": "1.5"}, "numa-pin.io/cpus"),
        ({"numa-pin.io/memory": "lots"}, "numa-pin.io/memory"),
        ({"numa-pin.io/memory": "-5Mi"}, "numa-pin.io/memory"),
        ({"numa-pin.io/hugepages-2Mi": "1e400"}, "numa-pin.io/hugepages-2Mi"),
        ({"numa-pin.io/devices": "gpu=1"}, "numa-pin.io/devices"),
        ({"numa-pin.io/devices": "nvidia.com/gpu"}, "numa-pin.io/devices"),
        ({"numa-pin.io/devices": "nvidia.com/gpu=x"}, "numa-pin.io/devices"),
        ({"numa-pin.io/policy": "strict"}, "numa-pin.io/policy"),
        ({"numa-pin.io/scope": "node"}, "numa-pin.io/scope"),
        ({"numa-pin.io/cpu": "1"}, "numa-pin.io/cpu"),
        ({"numa-pin.io/pod-cpus": "x"}, "numa-pin.io/pod-cpus"),
    ],
    ids=["negative", "non-numeric", "huge", "fraction", "memory-garbage", "memory-negative",
         "hugepages-overflow", "device-no-domain", "device-no-count", "device-bad-count",
         "unknown-policy", "unknown-scope", "unknown-annotation", "pod-cpus-garbage"],
)
def test_malformed_annotations_name_the_annotation(annotations, bad_key):
    with pytest.raises(RequestError) as err:
        request_from_oci("c1", annotations)
    assert bad_key in str(err.value)


@pytest.mark.parametrize(
    "quota, period, limit, expect_cpus",
    [
        (200000, 100000, GI, 2),
        (150000, 100000, GI, 0),
        (200000, 100000, None, 0),
        (None, None, GI, 0),
        (-1, 100000, GI, 0),
    ],
    ids=["integer-guaranteed", "fractional", "no-memory-limit", "no-quota", "unlimited-quota"],
)
def test_guaranteed_inference(quota, period, limit, expect_cpus):
    req = request_from_oci("c", CRI, limits=ContainerLimits(cpu_quota=quota, cpu_period=period, memory_limit=limit))
    assert req.amounts.cpus == expect_cpus
    assert req.amounts.memory == (limit if expect_cpus else 0)


#: what containerd's CRI plugin puts on an app container of a pod
CRI = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "sb1",
       "io.kubernetes.cri.container-name": "app"}
#: what ``podman run --cpus 1 --memory 100m`` puts in config.json (podman 4, seen on this machine)
PODMAN = {"io.container.manager": "libpod", "io.kubernetes.cri-o.Created": "2026-11-24T16:45:15.575128905Z",
          "io.kubernetes.cri-o.TTY": "false", "io.podman.annotations.autoremove": "TRUE"}


@pytest.mark.parametrize(
    "annotations, everywhere, expect_cpus",
    [
        (CRI, False, 1),
        ({"io.kubernetes.cri-o.ContainerType": "container", "io.kubernetes.cri-o.SandboxID": "sb"}, False, 1),
        ({}, False, 0),
        (PODMAN, False, 0),
        ({**PODMAN, "io.kubernetes.cri-o.SandboxID": "pod-infra"}, False, 0),
        ({}, True, 1),
        (PODMAN, True, 1),
    ],
    ids=["containerd", "cri-o", "plain-runc", "podman", "podman-pod", "plain-switched-on", "podman-switched-on"],
)
def test_guaranteed_inference_is_for_kubernetes_containers(annotations, everywhere, expect_cpus):
    inference = Inference(guaranteed_cpus_outside_kubernetes=everywhere)
    limits = ContainerLimits(cpu_quota=100000, cpu_period=100000, memory_limit=100 * MI)
    req = request_from_oci("c", annotations, limits=limits, inference=inference)
    assert req.amounts.cpus == expect_cpus and req.exclusive is bool(expect_cpus)


def test_inference_switched_off():
    off = Inference(guaranteed_cpus=False, hugepages=False, device_plugin_env=False)
    limits = ContainerLimits(cpu_quota=100000, cpu_period=100000, memory_limit=GI, hugepage_limits={"2MB": 4 * MI})
    req = request_from_oci("c", {}, {"NVIDIA_VISIBLE_DEVICES": "0"}, limits, inference=off)
    assert req.amounts.empty and req.fixed_gpus == () and not req.fixed_pci


def test_annotations_win_over_inference():
    req = request_from_oci("c", {"numa-pin.io/cpus": "1"},
                           limits=ContainerLimits(cpu_quota=400000, cpu_period=100000, memory_limit=GI))
    assert req.amounts.cpus == 1


def test_hugepage_limits_and_device_plugin_env():
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa, 3", "PCIDEVICE_INTEL_COM_SRIOV_A": "0000:3b:02.0,0000:3b:02.1",
           "PCIDEVICE_INTEL_COM_SRIOV_A_INFO": "{}"}
    req = request_from_oci("c", {}, env, ContainerLimits(hugepage_limits={"2MB": 8 * MI, "1GB": 0}))
    assert dict(req.amounts.hugepages) == {"hugepages-2Mi": 8 * MI}
    assert req.fixed_gpus == ("GPU-aaaa", "3")
    assert dict(req.fixed_pci) == {"INTEL_COM_SRIOV_A": ("0000:3b:02.0", "0000:3b:02.1")}


@pytest.mark.parametrize("value", ["all", "none", "void", ""], ids=["all", "none", "void", "empty"])
def test_nvidia_visible_devices_special_values(value):
    assert request_from_oci("c", {}, {"NVIDIA_VISIBLE_DEVICES": value}).fixed_gpus == ()


@pytest.mark.parametrize(
    "annotations, pod_id, name, sandbox",
    [
        ({"io.kubernetes.cri-o.SandboxID": "sb1", "io.kubernetes.container.name": "app"}, "sb1", "app", False),
        ({"io.kubernetes.cri.sandbox-id": "sb2", "io.kubernetes.cri.container-name": "db"}, "sb2", "db", False),
        ({"io.kubernetes.pod.uid": "uid3"}, "uid3", "c", False),
        ({"numa-pin.io/pod": "mypod"}, "user:mypod", "c", False),
        ({"io.kubernetes.pod.uid": "uid4", "numa-pin.io/pod": "mypod"}, "uid4", "c", False),
        ({}, "c", "c", False),
        ({"io.kubernetes.cri-o.SandboxID": "sb", "io.kubernetes.cri-o.ContainerType": "sandbox",
          "numa-pin.io/cpus": "2"}, "sb", "c", True),
    ],
    ids=["cri-o", "containerd", "pod-uid", "annotation", "sandbox-wins", "own-pod", "sandbox-infra"],
)
def test_pod_identity(annotations, pod_id, name, sandbox):
    req = request_from_oci("c", annotations)
    assert (req.pod_id, req.name, req.sandbox) == (pod_id, name, sandbox)
    if sandbox:
        assert req.amounts.empty


def test_pod_totals():
    req = request_from_oci("c", {"numa-pin.io/cpus": "1", "numa-pin.io/pod-cpus": "3",
                                 "numa-pin.io/pod-devices": "nvidia.com/gpu=2"})
    assert req.pod_amounts.cpus == 3 and dict(req.pod_amounts.devices) == {"nvidia.com/gpu": 2}


def test_parse_devices_duplicate():
    with pytest.raises(RequestError, match="given twice"):
        parse_devices("a.io/x=1,a.io/x=2", "numa-pin.io/devices")


@pytest.mark.parametrize(
    "annotations, limits, message",
    [
        ({"numa-pin.io/hugepages-2Mi": "3Mi"}, None,
         "numa-pin.io/hugepages-2Mi: '3Mi' is not a whole number of 2Mi pages (3145728 bytes is 1.5 pages); "
         "hugepages come in whole pages"),
        ({"numa-pin.io/hugepages-1Gi": "1536Mi"}, None, "is not a whole number of 1Gi pages"),
        ({}, {"2MB": 3 * MI}, "linux.resources.hugepageLimits: '3145728' is not a whole number of 2Mi pages"),
    ],
    ids=["2Mi-annotation", "1Gi-annotation", "spec-limit"],
)
def test_hugepages_come_in_whole_pages(annotations, limits, message):
    with pytest.raises(RequestError) as err:
        request_from_oci("c", annotations, limits=ContainerLimits(hugepage_limits=limits or {}))
    assert message in str(err.value)


def test_whole_hugepages_pass():
    req = request_from_oci("c", {"numa-pin.io/hugepages-2Mi": "4Mi", "numa-pin.io/hugepages-1Gi": "2Gi"})
    assert dict(req.amounts.hugepages) == {"hugepages-2Mi": 4 * MI, "hugepages-1Gi": 2 * GI}


@pytest.mark.parametrize("key, value", [("numa-pin.io/cpus", "2\u00a0"), ("numa-pin.io/devices", "a.b/c=1\u00a0"),
                                        ("numa-pin.io/devices", "a.b/c\u00a0=1")], ids=["cpus", "count", "name"])
def test_unicode_whitespace_is_not_trimmed(key, value):
    with pytest.raises(RequestError, match=f"^{key}: "):
        request_from_oci("c", {key: value})


def test_the_request_reads_the_config_inference_section_itself():
    """One record for the inference switches: a config section goes to the request as it is,
    and a request built without one gets the config's defaults (the key table's)."""
    from numa_pin.config import config_from_dict
    from numa_pin.requests.request import DEFAULT_INFERENCE

    assert DEFAULT_INFERENCE == config_from_dict({}).inference
    cfg = config_from_dict({"inference": {"hugepages": False, "guaranteed_cpus_outside_kubernetes": True}})
    assert isinstance(cfg.inference, Inference)
