"""Kubernetes containers: the pod's QoS class, per-container annotations, the pod's name.

The oracle for the QoS class is kubelet itself, transcribed below: ``GetPodQOS``
(pkg/apis/core/v1/helper/qos), the resources it writes for a container (``MilliCPUToShares``,
``MilliCPUToQuota`` in pkg/kubelet/cm) and the pod cgroup names of both cgroup drivers
(pkg/kubelet/cm/qos_container_manager and cgroup_manager_linux). Each pod shape is turned into
the container spec kubelet and containerd would write, and numa-pin must read back the class
kubelet computed from the pod definition, and the exclusive CPUs its static CPU manager gives
(integer CPUs of a Guaranteed pod).
"""

from __future__ import annotations

import pytest

from numa_pin.errors import RequestError
from numa_pin.requests.kubernetes import BEST_EFFORT, BURSTABLE, GUARANTEED, infer_qos, qos_from_cgroups_path
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import container_annotations, request_from_oci

MI = 1 << 20
GI = 1 << 30
PERIOD = 100000  # kubelet's default CFS period
UID = "0b6a53c6-1f6e-4a8e-9d2f-3c1f8b7d9e10"
CID = "4f1d2c3b5a6978"


# ---- kubelet, transcribed ----------------------------------------------------------------------
def milli_cpu_to_shares(milli: int) -> int:
    if milli == 0:
        return 2
    return max(2, min(milli * 1024 // 1000, 262144))


def milli_cpu_to_quota(milli: int, period: int) -> int:
    if milli == 0:
        return 0
    return max(milli * period // 1000, 1000)


def pod_qos(containers: list[dict]) -> str:
    """GetPodQOS: requests default to limits (API defaulting)."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        req = {**c.get("limits", {}), **c.get("requests", {})}
        lim = c.get("limits", {})
        for res, v in req.items():
            requests[res] = requests.get(res, 0) + v
        for res, v in lim.items():
            limits[res] = limits.get(res, 0) + v
        if set(lim) != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and requests == limits:
        return GUARANTEED
    return BURSTABLE


def container_resources(c: dict) -> dict:
    req = {**c.get("limits", {}), **c.get("requests", {})}
    lim = c.get("limits", {})
    out = {"cpu_shares": milli_cpu_to_shares(req.get("cpu", 0)), "cpu_period": PERIOD, "cpu_quota": None,
           "memory_limit": lim.get("memory")}
    if "cpu" in lim:
        out["cpu_quota"] = milli_cpu_to_quota(lim["cpu"], PERIOD)
    return out


def cgroups_path(qos: str, driver: str) -> str:
    level = {GUARANTEED: [], BURSTABLE: ["burstable"], BEST_EFFORT: ["besteffort"]}[qos]
    names = ["kubepods", *level, f"pod{UID}"]
    if driver == "cgroupfs":
        return "/" + "/".join(names) + "/" + CID
    leaf = "-".join(n.replace("-", "_") for n in names) + ".slice"
    if driver == "systemd":  # what kubelet hands containerd, which adds its prefix and the id
        return f"{leaf}:cri-containerd:{CID}"
    # the expanded path, as the cgroup appears in /proc/<pid>/cgroup
    slices = ["-".join(n.replace("-", "_") for n in names[: i + 1]) + ".slice" for i in range(len(names))]
    return "/" + "/".join(slices) + f"/cri-containerd-{CID}.scope"


def static_policy_cpus(qos: str, c: dict) -> int:
    cpu = c.get("limits", {}).get("cpu", 0)
    return cpu // 1000 if qos == GUARANTEED and cpu % 1000 == 0 else 0


# ---- pods: the first container is the one admitted -------------------------------------------------
APP_G2 = {"requests": {"cpu": 2000, "memory": GI}, "limits": {"cpu": 2000, "memory": GI}}
PODS = {
    "guaranteed-2": [APP_G2],
    "guaranteed-limits-only": [{"limits": {"cpu": 1000, "memory": 512 * MI}}],
    "guaranteed-fractional": [{"limits": {"cpu": 1500, "memory": GI}}],
    "burstable-500m-limit-1": [{"requests": {"cpu": 500, "memory": GI}, "limits": {"cpu": 1000, "memory": GI}}],
    "burstable-memory-request": [{"requests": {"cpu": 1000, "memory": 512 * MI},
                                  "limits": {"cpu": 1000, "memory": GI}}],
    "burstable-sidecar": [APP_G2, {"requests": {"cpu": 100}}],
    "burstable-no-limit": [{"requests": {"cpu": 1000, "memory": GI}}],
    "besteffort": [{}],
}
CRI = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "sb1",
       "io.kubernetes.cri.container-name": "app"}


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd", "systemd-expanded"])
@pytest.mark.parametrize("pod", list(PODS), ids=list(PODS))
def test_pod_qos_from_the_cgroup_parent_matches_kubelet(pod, driver):
    containers = PODS[pod]
    qos = pod_qos(containers)
    path = cgroups_path(qos, driver)
    req = request_from_oci(CID, CRI, limits=ContainerLimits(cgroups_path=path, **container_resources(containers[0])))
    assert (req.qos, req.amounts.cpus) == (qos, static_policy_cpus(qos, containers[0]))
    assert req.qos_signal == f"linux.cgroupsPath {path}"
    assert req.amounts.memory == (containers[0]["limits"]["memory"] if req.amounts.cpus else 0)


#: kubelet without QoS cgroups (cgroupsPerQOS: false): one container's resources are all there is;
#: they cannot show a memory request below the limit nor another container of the pod
ALONE = ["guaranteed-2", "guaranteed-limits-only", "guaranteed-fractional", "burstable-500m-limit-1",
         "burstable-no-limit", "besteffort"]


@pytest.mark.parametrize("pod", ALONE, ids=ALONE)
def test_pod_qos_from_cpu_shares_against_quota(pod):
    container = PODS[pod][0]
    qos = pod_qos([container])
    req = request_from_oci(CID, CRI, limits=ContainerLimits(cgroups_path=f"/{CID}", **container_resources(container)))
    assert (req.qos, req.amounts.cpus) == (qos, static_policy_cpus(qos, container))
    assert req.qos_signal.startswith("cpu shares ")


@pytest.mark.parametrize(
    "path",
    [None, "", "/", "/system.slice/docker-1.scope", "/kubepods", "kubepods.slice:cri-containerd:x",
     "/kubepods/other/x", "/mykubepods/burstable/pod1/x"],
    ids=["none", "empty", "root", "docker", "kubepods-itself", "kubepods-slice", "unknown-level", "lookalike"],
)
def test_paths_without_a_qos_level(path):
    assert qos_from_cgroups_path(path) is None


def test_no_shares_judges_quota_and_memory_limit():
    """A runtime that writes no cpu.shares (podman --cpus 1 --memory 1g) is not kubelet."""
    assert infer_qos(None, None, 100000, 100000, GI)[0] == GUARANTEED
    assert infer_qos(None, None, None, None, None)[0] == BEST_EFFORT


# ---- per-container annotations --------------------------------------------------------------------
@pytest.mark.parametrize(
    "annotations, name, cpus, devices",
    [
        ({"numa-pin.io/cpus": "2"}, "sidecar", 2, {}),
        ({"numa-pin.io/cpus.app": "2"}, "app", 2, {}),
        ({"numa-pin.io/cpus.app": "2"}, "sidecar", 0, {}),
        ({"numa-pin.io/cpus": "4", "numa-pin.io/cpus.sidecar": "1"}, "sidecar", 1, {}),
        ({"numa-pin.io/cpus": "4", "numa-pin.io/devices": "x.io/d=1", "numa-pin.io/devices.sidecar": "x.io/d=2"},
         "sidecar", 0, {"x.io/d": 2}),
        ({"numa-pin.io/cpus": "4", "numa-pin.io/cpus.sidecar": "1"}, "app", 4, {}),
        ({"numa-pin.io/cpus.app": "2", "numa-pin.io/cpus.side.car": "1"}, "app", 2, {}),
    ],
    ids=["plain-is-every-container", "own-key", "other-containers-key", "own-key-wins",
         "own-keys-replace-all-plain", "plain-for-the-others", "dotted-name-of-another"],
)
def test_per_container_annotations(annotations, name, cpus, devices):
    req = request_from_oci("c", {**CRI, "io.kubernetes.cri.container-name": name, **annotations})
    assert (req.amounts.cpus, dict(req.amounts.devices), req.name) == (cpus, devices, name)


@pytest.mark.parametrize(
    "key",
    ["numa-pin.io/policy.app", "numa-pin.io/pod-cpus.app", "numa-pin.io/cpu.app", "numa-pin.io/cpus."],
    ids=["pod-wide-policy", "pod-wide-pod-cpus", "unknown-key", "no-container"],
)
def test_per_container_form_only_for_per_container_keys(key):
    with pytest.raises(RequestError) as err:
        request_from_oci("c", {**CRI, key: "1"})
    assert key in str(err.value)


def test_bad_value_of_another_container_is_its_own_problem():
    req = request_from_oci("c", {**CRI, "numa-pin.io/cpus.sidecar": "lots"})
    assert req.amounts.cpus == 0
    with pytest.raises(RequestError, match=r"numa-pin.io/cpus\b"):
        request_from_oci("c", {**CRI, "io.kubernetes.cri.container-name": "sidecar",
                               "numa-pin.io/cpus.sidecar": "lots"})


def test_container_annotations_keeps_everything_else():
    ann = {"a": "1", "numa-pin.io/policy": "restricted", "numa-pin.io/memory": "1Gi", "numa-pin.io/cpus.x": "1"}
    assert container_annotations(ann, "x") == {"a": "1", "numa-pin.io/policy": "restricted", "numa-pin.io/cpus": "1"}
    assert container_annotations(ann, "y") == {"a": "1", "numa-pin.io/policy": "restricted", "numa-pin.io/memory": "1Gi"}


# ---- the pod's name -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "annotations, pod_name, qualified",
    [
        ({**CRI, "io.kubernetes.cri.sandbox-namespace": "shop", "io.kubernetes.cri.sandbox-name": "web-0"},
         "shop/web-0", "shop/web-0/app"),
        ({"io.kubernetes.cri-o.SandboxID": "sb", "io.kubernetes.container.name": "app",
          "io.kubernetes.pod.namespace": "shop", "io.kubernetes.pod.name": "web-0"}, "shop/web-0", "shop/web-0/app"),
        (CRI, None, "app"),
        ({"io.container.manager": "libpod", "io.kubernetes.cri.sandbox-name": "x"}, None, "c"),
    ],
    ids=["containerd", "cri-o", "no-pod-name", "podman"],
)
def test_pod_name(annotations, pod_name, qualified):
    req = request_from_oci("c", annotations)
    assert (req.pod_name, req.qualified_name) == (pod_name, qualified)
