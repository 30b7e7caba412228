"""What a kubelet-driven CRI runtime tells a container about its pod (pure).

containerd and CRI-O copy the pod's identity into every container's annotations (sandbox id,
container name and type, namespace and name), and kubelet's cgroup hierarchy and CPU settings
show the pod's QoS class. Podman sets a few ``io.kubernetes.cri-o.*`` keys too, so a container
counts as Kubernetes' only through :data:`KUBERNETES_KEYS` and never when podman manages it.
:mod:`numa_pin.requests.request` reads these to name a container and to infer the exclusive
CPUs of a Guaranteed pod.
"""

from __future__ import annotations

from collections.abc import Mapping

#: runtime annotations naming the pod (sandbox), in precedence order
POD_ID_KEYS = ("io.kubernetes.cri-o.SandboxID", "io.kubernetes.cri.sandbox-id", "io.kubernetes.pod.uid")
NAME_KEYS = ("io.kubernetes.container.name", "io.kubernetes.cri.container-name")
SANDBOX_TYPE_KEYS = ("io.kubernetes.cri-o.ContainerType", "io.kubernetes.cri.container-type")
#: annotations only a kubelet-driven CRI runtime (containerd, CRI-O) sets; podman sets some
#: ``io.kubernetes.cri-o.*`` keys too (``Created``, ``TTY``), but none of these
KUBERNETES_KEYS = POD_ID_KEYS + NAME_KEYS + SANDBOX_TYPE_KEYS
#: ``io.container.manager`` value of podman's containers
PODMAN_MANAGER = "libpod"
#: (namespace, name) annotations of the pod, set in every container's spec by the CRI runtime
POD_NAME_KEYS = (("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name"),  # containerd
                 ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name"))  # CRI-O

#: kubelet's pod QoS classes
GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
#: kubelet's cgroup level of each class below ``kubepods`` (Guaranteed pods sit right under it)
_QOS_LEVELS = {"burstable": BURSTABLE, "besteffort": BEST_EFFORT}
#: kubelet's MilliCPUToShares floor and the shares a CPU request of 1000m gives
_MIN_SHARES, _SHARES_PER_CPU = 2, 1024


def is_kubernetes(annotations: Mapping[str, str]) -> bool:
    """True for a container a kubelet asked a CRI runtime for (not a podman container)."""
    if annotations.get("io.container.manager") == PODMAN_MANAGER:
        return False
    return any(annotations.get(k) for k in KUBERNETES_KEYS)


def qos_from_cgroups_path(path: str | None) -> str | None:
    """The pod QoS class that kubelet's cgroup hierarchy gives a container's cgroup, or None
    when the path has no ``kubepods`` level (another manager, or kubelet without per-QoS cgroups).

    cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>``, ``/kubepods/besteffort/...``, a
    Guaranteed pod right under ``/kubepods/pod<uid>``. systemd driver: the runtime's
    ``kubepods-burstable-pod<uid>.slice:cri-containerd:<id>``, or the expanded path
    (``/kubepods.slice/kubepods-burstable.slice/...``): a slice's name spells its ancestry.
    """
    if not path:
        return None
    if "/" not in path and path.count(":") == 2:  # systemd: slice:prefix:name
        path = path.split(":", 1)[0]
    chain: list[str] = []
    for segment in path.split("/"):
        if segment.endswith(".slice"):
            chain = segment[: -len(".slice")].split("-")
        elif segment:
            chain.append(segment)
    if "kubepods" not in chain:
        return None
    below = chain[len(chain) - chain[::-1].index("kubepods"):] or [""]  # what the last kubepods holds
    return _QOS_LEVELS.get(below[0], GUARANTEED if below[0].startswith("pod") else None)


def infer_qos(
    cgroups_path: str | None,
    cpu_shares: int | None,
    cpu_quota: int | None,
    cpu_period: int | None,
    memory_limit: int | None,
) -> tuple[str, str]:
    """``(class, signal)``: the pod's QoS class as kubelet decided it, and what showed it.

    The cgroup parent is the pod's class (:func:`qos_from_cgroups_path`). Without one, the
    container's own resources: kubelet writes ``cpu.shares`` from the CPU request and the quota
    from the limit, so equal request and limit give ``shares == quota * 1024 / period``
    (kubelet's MilliCPUToShares of the limit); that, with a memory limit, is Guaranteed. A
    runtime that sets no shares at all (not kubelet) is judged by quota and memory limit alone.
    """
    level = qos_from_cgroups_path(cgroups_path)
    if level is not None:
        return level, f"linux.cgroupsPath {cgroups_path}"
    quota, period, memory = max(cpu_quota or 0, 0), max(cpu_period or 0, 0), max(memory_limit or 0, 0)
    limited = quota > 0 and period > 0 and memory > 0
    if cpu_shares is None:
        klass = GUARANTEED if limited else BURSTABLE if (quota or memory) else BEST_EFFORT
        return klass, "cpu quota and memory limit (no cpu shares)"
    signal = f"cpu shares {cpu_shares} against quota {cpu_quota}/{cpu_period}"
    if limited:
        expected = max(_MIN_SHARES, quota * 1000 // period * _SHARES_PER_CPU // 1000)
        return (GUARANTEED if cpu_shares == expected else BURSTABLE), signal
    return (BEST_EFFORT if cpu_shares <= _MIN_SHARES and not quota and not memory else BURSTABLE), signal


def infer_guaranteed_cpus(quota: int | None, period: int | None, memory_limit: int | None) -> int:
    """Exclusive CPUs kubelet would give: integer quota/period with a memory limit, else 0."""
    if not quota or not period or quota <= 0 or period <= 0 or not memory_limit or memory_limit <= 0:
        return 0
    if quota % period:
        return 0
    return quota // period


def pod_name(annotations: Mapping[str, str]) -> str | None:
    """``namespace/name`` of a Kubernetes pod from the CRI annotations (containerd's, else
    CRI-O's), or None outside Kubernetes."""
    if not is_kubernetes(annotations):
        return None
    for ns_key, name_key in POD_NAME_KEYS:
        if annotations.get(name_key):
            return f"{annotations.get(ns_key) or '-'}/{annotations[name_key]}"
    return None
