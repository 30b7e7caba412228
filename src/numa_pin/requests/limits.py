"""What ``config.json`` says of a container besides its annotations, as a request reads it (pure).

The annotations (:mod:`numa_pin.requests.request`) say what a container asks; when they are
silent, Kubernetes-compatible inference reads the rest of the spec, each switchable in the
config's ``inference`` section:

* ``linux.resources.cpu`` quota/period that divide evenly, together with a memory limit, mean
  that many exclusive CPUs when the *pod* is Guaranteed (:func:`guaranteed_cpus`; the QoS class
  comes from :func:`~numa_pin.requests.kubernetes.infer_qos`), for Kubernetes containers only
  unless ``guaranteed_cpus_outside_kubernetes`` is on;
* ``linux.resources.hugepageLimits`` mean hugepages to align (:func:`limit_hugepages`);
* ``NVIDIA_VISIBLE_DEVICES`` and ``PCIDEVICE_*`` in ``process.env`` are devices a device plugin
  already chose (:func:`device_plugin_env`);
* ``linux.resources.cpu.cpus`` is a cpuset the user pinned the container to: a constraint,
  never widened or moved (:func:`cpuset_constraint`).

The pod's own resources (kubelet's sandbox resources: the sum of its containers' requests and
limits, overhead excluded) reach numa-pin as NRI's ``PodSandbox.linux.pod_resources`` and as
CRI-O's ``pod-linux-resources.crio.io`` annotation (:func:`crio_pod_limits`); they are read as one
more :class:`ContainerLimits`, the pod's, for pod-scope totals.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base.cpuset import parse_list
from numa_pin.base.record import field, record
from numa_pin.base.text import quote
from numa_pin.config.model import InferenceConfig
from numa_pin.devices.cdi import CdiDevice, devices_from_env_tokens
from numa_pin.errors import RequestError
from numa_pin.requests.kubernetes import GUARANTEED, infer_guaranteed_cpus, infer_qos, is_kubernetes

#: where a container's own cpuset comes from
CPUSET_FIELD = "linux.resources.cpu.cpus"
#: hugepage resources and their page size in KiB
HUGEPAGE_RESOURCES = {"hugepages-2Mi": 2048, "hugepages-1Gi": 1048576}
#: hugepageLimits pageSize spellings (runtime-spec uses "2MB"/"1GB") -> resource name
_PAGE_SIZES = {
    "2MB": "hugepages-2Mi", "2Mi": "hugepages-2Mi", "2048kB": "hugepages-2Mi",
    "1GB": "hugepages-1Gi", "1Gi": "hugepages-1Gi", "1048576kB": "hugepages-1Gi",
}
_HUGEPAGE_FIELD = "linux.resources.hugepageLimits"
#: CRI-O's annotation of the pod's resources (a CRI ``LinuxContainerResources`` as JSON), and its
#: older spelling; the current name wins
CRIO_POD_RESOURCES = ("pod-linux-resources.crio.io", "io.kubernetes.cri-o.PodLinuxResources")
#: how deep the annotation's JSON may nest (the object, ``hugepage_limits``, one limit)
_POD_RESOURCES_DEPTH = 4


@record
class ContainerLimits:
    """What ``config.json`` says of a container's cgroup and limits (``linux.cgroupsPath`` and
    ``linux.resources``), as a request reads them; ``None`` (empty) where it says nothing."""

    cgroups_path: str | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    cpu_shares: int | None = None
    cpuset: str | None = None  # linux.resources.cpu.cpus as written (a kernel CPU list)
    memory_limit: int | None = None
    hugepage_limits: Mapping[str, int] = field(default_factory=dict)  # pageSize ("2MB") -> bytes


NO_LIMITS = ContainerLimits()


def crio_pod_limits(annotations: Mapping[str, str], cgroups_path: str | None = None) -> ContainerLimits | None:
    """The pod's resources as CRI-O writes them (``pod-linux-resources.crio.io``: the sandbox's
    CRI ``LinuxContainerResources`` as JSON, ``cpu_period``, ``cpu_quota``, ``cpu_shares``,
    ``memory_limit_in_bytes``; zero and absent mean unset), or None without the annotation.
    ``cgroups_path``: where the pod's QoS class shows (its cgroup parent, or a container's cgroup).

    Raises:
        RequestError: not a JSON object, or a field that is not a non-negative integer (cpu_quota
            may be -1: no limit).
    """
    key = next((k for k in CRIO_POD_RESOURCES if annotations.get(k)), None)
    if key is None:
        return None
    from numa_pin.base.boundedio import json_loads_bounded

    text = annotations[key]
    try:
        doc = json_loads_bounded(text, _POD_RESOURCES_DEPTH)
    except ValueError as exc:  # UnsafeInput included
        raise RequestError(f"not the pod's resources as JSON ({exc})", annotation=key) from None
    if doc is None:  # a pod without resources: Go's nil marshalled
        return None
    if not isinstance(doc, dict):
        raise RequestError("expected a JSON object of the pod's resources", annotation=key)

    def number(name: str, low: int = 0) -> int | None:
        value = doc.get(name)
        if value is None:
            return None
        if type(value) is not int or value < low:
            raise RequestError(f"{name} {quote(str(value))} is not an integer of at least {low}", annotation=key)
        return value or None

    return ContainerLimits(cgroups_path=cgroups_path, cpu_quota=number("cpu_quota", -1),
                           cpu_period=number("cpu_period"), cpu_shares=number("cpu_shares"),
                           memory_limit=number("memory_limit_in_bytes"))


def whole_pages(resource: str, size: int, text: str, what: str) -> int:
    """``size`` bytes of ``resource`` (``hugepages-2Mi``), refused unless a whole number of pages."""
    page = HUGEPAGE_RESOURCES[resource] * 1024
    if size % page:
        raise RequestError(
            f"{quote(text)} is not a whole number of {resource[len('hugepages-'):]} pages "
            f"({size} bytes is {size / page:g} pages); hugepages come in whole pages", annotation=what,
        )
    return size


def guaranteed_cpus(
    limits: ContainerLimits, annotations: Mapping[str, str], inference: InferenceConfig,
) -> tuple[int, str | None, str | None]:
    """``(cpus, qos, signal)``: the exclusive CPUs a container of a Guaranteed pod gets from its
    quota (0 otherwise), the pod's QoS class and the signal it was read from (None, None where
    inference is off or the container is not Kubernetes')."""
    if not inference.guaranteed_cpus or not (
        inference.guaranteed_cpus_outside_kubernetes or is_kubernetes(annotations)
    ):
        return 0, None, None
    qos, signal = infer_qos(limits.cgroups_path, limits.cpu_shares, limits.cpu_quota, limits.cpu_period,
                            limits.memory_limit)
    cpus = infer_guaranteed_cpus(limits.cpu_quota, limits.cpu_period, limits.memory_limit) if qos == GUARANTEED else 0
    return cpus, qos, signal


def limit_hugepages(limits: ContainerLimits) -> dict[str, int]:
    """``{resource: bytes}`` of the hugepage limits (``hugepages-2Mi``), each a whole number of pages.

    Raises:
        RequestError: a page size numa-pin does not know, or a limit that is not whole pages.
    """
    huge: dict[str, int] = {}
    for size, limit in limits.hugepage_limits.items():
        res = _PAGE_SIZES.get(size)
        if res is None:
            raise RequestError(f"unsupported hugepage size {quote(size)}", annotation=_HUGEPAGE_FIELD)
        if limit > 0:
            huge[res] = whole_pages(res, limit, str(limit), _HUGEPAGE_FIELD)
    return huge


def device_plugin_env(
    env: Mapping[str, str],
) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]], tuple[CdiDevice, ...]]:
    """``(gpus, pci, cdi)``: the devices a device plugin chose, from ``process.env``: the
    ``NVIDIA_VISIBLE_DEVICES`` tokens (indexes or UUIDs; ``none``, ``void`` and ``all`` choose
    none), ``{X: BDFs}`` of every ``PCIDEVICE_<X>``, and the CDI names in ``NVIDIA_VISIBLE_DEVICES``."""
    gpus: tuple[str, ...] = ()
    cdi: tuple[CdiDevice, ...] = ()
    value = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value and value not in ("none", "void", "all"):
        tokens = tuple(t.strip() for t in value.split(",") if t.strip())
        cdi = devices_from_env_tokens(tokens, "NVIDIA_VISIBLE_DEVICES")
        gpus = tuple(t for t in tokens if not any(t == str(d) for d in cdi))
    pci = {
        key[len("PCIDEVICE_"):]: tuple(v.strip() for v in ids.split(",") if v.strip())
        for key, ids in env.items()
        if key.startswith("PCIDEVICE_") and not key.endswith("_INFO") and ids.strip()
    }
    return gpus, pci, cdi


def cpuset_constraint(text: str | None) -> frozenset[int] | None:
    """``linux.resources.cpu.cpus`` as CPUs; unset or empty means no constraint.

    Raises:
        RequestError: not a kernel CPU list.
    """
    if text is None or not text.strip():
        return None
    try:
        return parse_list(text)
    except ValueError as exc:
        raise RequestError(f"{quote(text)} is not a CPU list ({exc})", annotation=CPUSET_FIELD) from exc


__all__ = ["CPUSET_FIELD", "CRIO_POD_RESOURCES", "HUGEPAGE_RESOURCES", "NO_LIMITS", "ContainerLimits",
           "cpuset_constraint", "crio_pod_limits", "device_plugin_env", "guaranteed_cpus", "limit_hugepages",
           "whole_pages"]
