"""A container's resource request, read from annotations and ``config.json`` (pure).

Annotations (all optional)::

    numa-pin.io/cpus            exclusive CPUs, an integer
    numa-pin.io/memory          memory to align, a quantity ("512Mi", "2Gi")
    numa-pin.io/hugepages-2Mi   hugepages to align, a quantity
    numa-pin.io/hugepages-1Gi   hugepages to align, a quantity
    numa-pin.io/devices         "resource=count[,resource=count]"
    numa-pin.io/colocate        "<scope>:resource,resource[;...]": the devices of those resources
                                share one ``pcie-root``, ``numa-node`` or ``socket``
    numa-pin.io/memory-policy   bind, interleave, preferred-many or weighted-interleave over
                                the granted nodes (:mod:`numa_pin.enforcer.mempolicy`)
    numa-pin.io/hugepages-spread "true": hugepages taken evenly over the granted nodes
    numa-pin.io/memory-tier     a tier of the config's ``memory_tiers`` (CPU-less CXL or HBM
                                nodes) whose nodes join the granted memory nodes
    numa-pin.io/vf-config       PF-side settings of the granted SR-IOV VFs ("vlan=100,trust=on";
                                sriov-cni's names: :mod:`numa_pin.requests.vfconfig`)
    numa-pin.io/policy          per-container/pod override of the node policy
    numa-pin.io/scope           per-container/pod override of the node scope
    numa-pin.io/pod             pod identity when no runtime sandbox id is present (recorded as
                                ``user:<value>``, so it never names a runtime sandbox's pod)
    numa-pin.io/pod-cpus        pod-scope totals (the pod's effective request); without them, the
    numa-pin.io/pod-memory      pod's own resources give the CPUs and memory (below)
    numa-pin.io/pod-devices
    numa-pin.io/cpu-load-balancing, cpu-quota, irq-load-balancing, cpu-c-states,
    cpu-freq-governor, host-services, cpu-shared
                                isolation of exclusive CPUs, and the shared pool beside them
                                (and CRI-O's ``*.crio.io`` names of the same knobs):
                                :mod:`numa_pin.requests.isolation`

Per-container form (:data:`PER_CONTAINER`): ``numa-pin.io/<key>.<container name>`` (``numa-pin.io/
cpus.app``) applies to the container of that name only (the CRI name,
``io.kubernetes.cri.container-name``) and replaces every plain per-container key for it. Under
Kubernetes the runtime copies the *pod's* annotations into every container, so a plain key asks
the same for each container of the pod; ``policy``, ``scope``, ``pod`` and ``pod-*`` are pod-wide.

When the annotations ask no CPUs, memory or hugepages, Kubernetes-compatible inference reads
the rest of ``config.json`` (:mod:`numa_pin.requests.limits`: a Guaranteed pod's CPU quota, the
hugepage limits, the devices a device plugin chose in ``process.env``, the container's own
cpuset). Devices chosen through CDI are read too: the names in ``cdi.k8s.io/*`` annotations
(always) and CDI names in ``NVIDIA_VISIBLE_DEVICES`` (:mod:`numa_pin.devices.cdi`).

Pod-scope totals come from the pod's own resources too, where the runtime says them (NRI's
``PodSandbox.linux.pod_resources``, CRI-O's ``pod-linux-resources.crio.io``), read as kubelet
reads pod-level resources: a Guaranteed pod whose CPU limit is a whole number of CPUs asks that
many exclusive CPUs and its memory limit (:func:`pod_totals`). The overhead is not counted (the
CPU and memory managers leave it to the runtime). A ``numa-pin.io/pod-*`` annotation that is set
wins for its resource.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base import names
from numa_pin.base.quantity import parse_bytes, parse_count
from numa_pin.base.record import field, record
from numa_pin.base.text import quote
from numa_pin.config.model import InferenceConfig, IsolationConfig
from numa_pin.devices.cdi import CdiDevice, devices_from_annotations
from numa_pin.devices.devnode import DeviceNode
from numa_pin.errors import RequestError
from numa_pin.requests import isolation as iso
from numa_pin.requests.kubernetes import NAME_KEYS, POD_ID_KEYS, SANDBOX_TYPE_KEYS, pod_name
from numa_pin.requests.limits import (
    HUGEPAGE_RESOURCES,
    NO_LIMITS,
    ContainerLimits,
    cpuset_constraint,
    crio_pod_limits,
    device_plugin_env,
    guaranteed_cpus,
    limit_hugepages,
    whole_pages,
)
from numa_pin.requests.pairs import split_pairs

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

PREFIX = "numa-pin.io/"
POLICIES = names.POLICIES
SCOPES = names.SCOPES
#: a sane ceiling: no machine has more exclusive CPUs or devices than this
MAX_COUNT = 1 << 16

#: prefix of a pod id taken from ``numa-pin.io/pod``: user pods and runtime sandboxes never share ids
USER_POD_PREFIX = "user:"

#: keys that may name one container (``numa-pin.io/cpus.<container>``); the rest are pod-wide
PER_CONTAINER = ("cpus", "memory", "hugepages-2Mi", "hugepages-1Gi", "devices", "colocate", "memory-policy",
                 "hugepages-spread", "memory-tier", "vf-config")
#: the memory policies a request may ask for (``numa-pin.io/memory-policy``)
MEMORY_POLICIES = ("bind", "interleave", "preferred-many", "weighted-interleave")
_KNOWN = {*PER_CONTAINER, "policy", "scope", "pod", "pod-cpus", "pod-memory", "pod-devices",
          *iso.NUMA_PIN_KEYS}


@record
class Amounts:
    """How much of each resource: exclusive CPUs, memory bytes, hugepage bytes, devices."""

    cpus: int = 0
    memory: int = 0
    hugepages: Mapping[str, int] = field(default_factory=dict)
    devices: Mapping[str, int] = field(default_factory=dict)

    @property
    def memory_resources(self) -> dict[str, int]:
        """``{"memory": bytes, "hugepages-2Mi": bytes, ...}`` for the memory provider."""
        out = {k: v for k, v in self.hugepages.items() if v > 0}
        if self.memory > 0:
            out["memory"] = self.memory
        return out

    @property
    def empty(self) -> bool:
        return self.cpus == 0 and not self.memory_resources and not any(self.devices.values())


def at_least(pod: Amounts, container: Amounts) -> Amounts:
    """Per resource, the larger of the pod's total and the container's own request."""
    devices = dict(pod.devices)
    for res, count in container.devices.items():
        devices[res] = max(devices.get(res, 0), count)
    hugepages = dict(pod.hugepages)
    for res, size in container.hugepages.items():
        hugepages[res] = max(hugepages.get(res, 0), size)
    return Amounts(max(pod.cpus, container.cpus), max(pod.memory, container.memory), hugepages, devices)


@record
class ContainerRequest:
    """Everything the admission needs to know about one container start."""

    container_id: str
    pod_id: str
    name: str
    amounts: Amounts
    pod_amounts: Amounts | None = None  # pod-scope totals, when annotated
    policy: str | None = None  # override of the node default
    scope: str | None = None
    sandbox: bool = False  # the pod's infra/pause container
    fixed_gpus: tuple[str, ...] = ()  # NVIDIA_VISIBLE_DEVICES tokens (indexes or UUIDs)
    fixed_pci: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # PCIDEVICE_<X> -> BDFs
    #: the ``numa-pin.io/pod`` value when it (not a runtime sandbox annotation) names the pod
    claimed_pod: str | None = None
    #: the CPUs the user pinned the container to (``linux.resources.cpu.cpus``, podman
    #: ``--cpuset-cpus``): a constraint, never widened or moved
    cpuset: frozenset[int] | None = None
    fixed_cdi: tuple[CdiDevice, ...] = ()  # devices chosen through CDI (cdi.k8s.io/*, CDI names in env)
    #: the pod's QoS class when CPUs were inferred from the spec (:func:`infer_qos`), and the
    #: signal it was read from; None when annotations asked or inference is off
    qos: str | None = None
    qos_signal: str | None = None
    #: ``namespace/name`` of the Kubernetes pod (the CRI sandbox annotations), when known
    pod_name: str | None = None
    #: device nodes the container already carries (``linux.devices``, the nodes of CDI names
    #: no other rule maps), located by the edge (:mod:`numa_pin.resources.node.devnodes`)
    fixed_nodes: tuple[DeviceNode, ...] = ()
    #: a fixed device numa-pin cannot place rejects the container (``inference.strict_devices``)
    strict_devices: bool = False
    #: ``(scope, resources)``: the devices of those resources share one PCIe root, NUMA node or
    #: socket (``numa-pin.io/colocate``)
    colocate: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the NUMA memory policy over the granted nodes (``numa-pin.io/memory-policy``), or None
    memory_policy: str | None = None
    #: hugepages taken evenly over the granted nodes (``numa-pin.io/hugepages-spread``)
    hugepages_spread: bool = False
    #: ``numa-pin.io/memory-tier``, and the tier's nodes once resolved (:func:`with_memory_tier`)
    memory_tier: str | None = None
    memory_tier_nodes: frozenset[int] = frozenset()
    #: what else keeps off its exclusive CPUs (annotations, else the node defaults)
    isolation: iso.IsolationRequest = iso.NONE
    #: PF-side settings of its VFs (``numa-pin.io/vf-config``: sriov-cni's names -> values), or empty
    vf_config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def exclusive(self) -> bool:
        return self.amounts.cpus > 0

    @property
    def placeable_nodes(self) -> tuple[DeviceNode, ...]:
        """The fixed device nodes that may stand for a device (not a control node, not virtual)."""
        return tuple(n for n in self.fixed_nodes if not n.nothing_to_align)

    @property
    def qualified_name(self) -> str:
        """``namespace/pod/container`` for a Kubernetes container, else the name."""
        return f"{self.pod_name}/{self.name}" if self.pod_name else self.name

    @property
    def asks_nothing(self) -> bool:
        """No CPUs, memory, hugepages or devices, for itself or its pod, and no devices a
        device plugin already chose: a container numa-pin only keeps on the shared pool."""
        pod_empty = self.pod_amounts is None or self.pod_amounts.empty
        fixed = self.fixed_gpus or any(self.fixed_pci.values()) or self.fixed_cdi or self.placeable_nodes
        return self.amounts.empty and pod_empty and not fixed


#: which Kubernetes-compatible inferences are on: the config's ``inference`` section itself
Inference = InferenceConfig
#: the inferences a request gets when its caller does not say (the config's defaults)
DEFAULT_INFERENCE = Inference()


def parse_devices(text: str, annotation: str) -> dict[str, int]:
    """``"nvidia.com/gpu=2,intel.com/sriov=1"`` -> ``{"nvidia.com/gpu": 2, ...}``."""
    out: dict[str, int] = {}
    for _, name, count in split_pairs(text, ",", "=", "resource=count", annotation):
        if any(not c.isascii() or c.isspace() or not c.isprintable() for c in name):
            raise RequestError(f"resource {quote(name)} holds a blank or non-ASCII character", annotation=annotation)
        if "/" not in name or name.startswith("/") or name.endswith("/"):
            raise RequestError(f"resource {quote(name)} is not of the form domain/name", annotation=annotation)
        if name in out:
            raise RequestError(f"resource {quote(name)} given twice", annotation=annotation)
        out[name] = _bounded_count(count, annotation)
    return out


def _bounded_count(text: str, annotation: str) -> int:
    n = parse_count(text, annotation)
    if n > MAX_COUNT:
        raise RequestError(f"{quote(text)} is larger than {MAX_COUNT}", annotation=annotation)
    return n


def _choice(value: str, allowed: tuple[str, ...], annotation: str) -> str:
    if value not in allowed:
        raise RequestError(f"unknown value {quote(value)} (expected one of {', '.join(allowed)})",
                           annotation=annotation)
    return value


def _annotation_amounts(ann: Mapping[str, str], pod: bool) -> Amounts | None:
    p = PREFIX + ("pod-" if pod else "")
    keys = ("cpus", "memory", "devices") if pod else ("cpus", "memory", "devices", "hugepages-2Mi", "hugepages-1Gi")
    if not any(p + k in ann for k in keys):
        return None
    cpus = _bounded_count(ann[p + "cpus"], p + "cpus") if p + "cpus" in ann else 0
    memory = parse_bytes(ann[p + "memory"], p + "memory") if p + "memory" in ann else 0
    devices = parse_devices(ann[p + "devices"], p + "devices") if p + "devices" in ann else {}
    huge: dict[str, int] = {}
    if not pod:
        for res in HUGEPAGE_RESOURCES:
            if PREFIX + res in ann:
                huge[res] = whole_pages(res, parse_bytes(ann[PREFIX + res], PREFIX + res), ann[PREFIX + res],
                                        PREFIX + res)
    return Amounts(cpus=cpus, memory=memory, hugepages=huge, devices=devices)


def container_annotations(annotations: Mapping[str, str], name: str) -> dict[str, str]:
    """The annotations as container ``name`` sees them: its ``numa-pin.io/<key>.<name>`` keys
    replace every plain per-container key; keys of other containers are dropped.

    Raises:
        RequestError: a ``numa-pin.io/<key>.<name>`` whose key is pod-wide or unknown, or whose
            container name is empty.
    """
    own: dict[str, str] = {}
    out: dict[str, str] = {}
    for key, value in annotations.items():
        base, dot, target = key[len(PREFIX):].partition(".") if key.startswith(PREFIX) else (key, "", "")
        if not dot:
            out[key] = value
        elif base not in PER_CONTAINER or not target:
            raise RequestError(
                f"unknown annotation (per container: {', '.join(PREFIX + k + '.<container>' for k in PER_CONTAINER)};"
                " the others are pod-wide)", annotation=key,
            )
        elif target == name:
            own[PREFIX + base] = value
    if own:
        out = {k: v for k, v in out.items() if not (k.startswith(PREFIX) and k[len(PREFIX):] in PER_CONTAINER)}
        out.update(own)
    return out


def request_from_oci(
    container_id: str,
    annotations: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    limits: ContainerLimits = NO_LIMITS,
    *,
    inference: Inference = DEFAULT_INFERENCE,
    isolation: IsolationConfig | None = None,
    pod_limits: ContainerLimits | None = None,
) -> ContainerRequest:
    """Build the request of one container. Raises :class:`RequestError` naming the annotation
    (or the ``config.json`` field). ``isolation``: the node defaults of the isolation knobs;
    ``pod_limits``: the pod's own resources where the runtime says them (NRI's pod resources;
    else CRI-O's annotation is read)."""
    env = env or {}
    name = next((annotations[k] for k in NAME_KEYS if annotations.get(k)), container_id)
    annotations = container_annotations(annotations, name)
    for key in annotations:
        if key.startswith(PREFIX) and key[len(PREFIX):] not in _KNOWN:
            raise RequestError(
                f"unknown annotation (known: {', '.join(sorted(PREFIX + k for k in _KNOWN))})", annotation=key
            )
    policy = annotations.get(PREFIX + "policy")
    if policy is not None:
        policy = _choice(policy, POLICIES, PREFIX + "policy")
    scope = annotations.get(PREFIX + "scope")
    if scope is not None:
        scope = _choice(scope, SCOPES, PREFIX + "scope")

    amounts = _annotation_amounts(annotations, pod=False)
    qos = qos_signal = None
    if amounts is None:
        # a container of a Guaranteed pod: its memory limit is aligned together with its CPUs
        cpus, qos, qos_signal = guaranteed_cpus(limits, annotations, inference)
        amounts = Amounts(cpus=cpus, memory=(limits.memory_limit or 0) if cpus else 0)
    if inference.hugepages and limits.hugepage_limits and not amounts.hugepages:
        amounts = Amounts(amounts.cpus, amounts.memory, limit_hugepages(limits), amounts.devices)
    fixed_gpus, fixed_pci, fixed_cdi = device_plugin_env(env) if inference.device_plugin_env else ((), {}, ())

    pod_id, claimed_pod = pod_identity(container_id, annotations)
    sandbox = any(annotations.get(k) == "sandbox" for k in SANDBOX_TYPE_KEYS)
    isolated = iso.NONE
    if not sandbox:  # the pod's annotations reach its sandbox too: it has no CPUs to isolate
        exclusive = amounts.cpus > 0
        iso.check_exclusive(annotations, exclusive, name)
        if exclusive:
            isolated = iso.isolation_request(annotations, isolation, name)
    return ContainerRequest(
        container_id=container_id,
        pod_id=pod_id,
        name=name,
        amounts=Amounts() if sandbox else amounts,
        pod_amounts=pod_totals(annotations, pod_limits, limits, inference),
        policy=policy,
        scope=scope,
        sandbox=sandbox,
        fixed_gpus=fixed_gpus,
        fixed_pci=fixed_pci,
        claimed_pod=claimed_pod,
        cpuset=cpuset_constraint(limits.cpuset),
        fixed_cdi=_unique_cdi(fixed_cdi + devices_from_annotations(annotations)),
        qos=qos,
        qos_signal=qos_signal,
        pod_name=pod_name(annotations),
        strict_devices=inference.strict_devices,
        colocate=_colocate(annotations),
        memory_policy=_choice(annotations[PREFIX + "memory-policy"], MEMORY_POLICIES, PREFIX + "memory-policy")
        if PREFIX + "memory-policy" in annotations else None,
        memory_tier=annotations.get(PREFIX + "memory-tier"),
        hugepages_spread=_choice(annotations.get(PREFIX + "hugepages-spread", "false"), ("true", "false"),
                                 PREFIX + "hugepages-spread") == "true",
        isolation=isolated,
        vf_config={} if sandbox else _vf_config(annotations),
    )


# The two parsers below are loaded only by a request that asks for what they parse (a hook
# imports what its request needs; agent/preload.py lists them for the agent).

def _colocate(annotations: Mapping[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if PREFIX + "colocate" not in annotations:
        return ()
    from numa_pin.requests.colocate import parse_colocate

    return parse_colocate(annotations[PREFIX + "colocate"], PREFIX + "colocate")


def _vf_config(annotations: Mapping[str, str]) -> dict[str, Any]:
    if PREFIX + "vf-config" not in annotations:
        return {}
    from numa_pin.requests.vfconfig import parse_vf_config

    return parse_vf_config(annotations[PREFIX + "vf-config"], PREFIX + "vf-config")


def pod_totals(annotations: Mapping[str, str], pod_limits: ContainerLimits | None,
               limits: ContainerLimits = NO_LIMITS, inference: Inference = DEFAULT_INFERENCE) -> Amounts | None:
    """The pod-scope totals: each ``numa-pin.io/pod-*`` annotation that is set, else what the
    pod's own resources give (``pod_limits``, else CRI-O's ``pod-linux-resources.crio.io``): a
    Guaranteed pod with a whole number of CPUs as its limit asks them exclusive, with its memory
    limit. The pod's QoS class shows in its cgroup parent, else in the container's cgroup.

    Raises:
        RequestError: an annotation that is not a count, quantity or device list, or CRI-O's
            annotation that is not the pod's resources.
    """
    annotated = _annotation_amounts(annotations, pod=True)
    if pod_limits is None:
        pod_limits = crio_pod_limits(annotations, limits.cgroups_path)
    elif not pod_limits.cgroups_path:
        from numa_pin.base.record import replace

        pod_limits = replace(pod_limits, cgroups_path=limits.cgroups_path)
    if pod_limits is None:
        return annotated
    cpus = guaranteed_cpus(pod_limits, annotations, inference)[0]
    if not cpus:
        return annotated
    derived = Amounts(cpus=cpus, memory=pod_limits.memory_limit or 0)
    if annotated is None:
        return derived
    p = PREFIX + "pod-"
    return Amounts(cpus=annotated.cpus if p + "cpus" in annotations else derived.cpus,
                   memory=annotated.memory if p + "memory" in annotations else derived.memory,
                   devices=annotated.devices)


def with_memory_tier(request: ContainerRequest, tiers: Mapping[str, frozenset[int]]) -> ContainerRequest:
    """``request`` with the nodes of the tier it names (the config's ``memory_tiers``).

    Raises:
        RequestError: the tier is not configured (the known ones are listed).
    """
    if request.memory_tier is None:
        return request
    nodes = tiers.get(request.memory_tier)
    if nodes is None:
        known = ", ".join(sorted(tiers)) or "none configured"
        raise RequestError(f"no memory tier {quote(request.memory_tier)} (memory_tiers: {known})",
                           annotation=PREFIX + "memory-tier")
    from numa_pin.base.record import replace

    return replace(request, memory_tier_nodes=frozenset(nodes))


def _unique_cdi(devices: tuple[CdiDevice, ...]) -> tuple[CdiDevice, ...]:
    seen: dict[str, CdiDevice] = {}
    for dev in devices:
        seen.setdefault(str(dev), dev)
    return tuple(seen.values())


def pod_identity(container_id: str, annotations: Mapping[str, str]) -> tuple[str, str | None]:
    """``(pod_id, claimed)``: the runtime's sandbox id when any sandbox annotation is set (a
    ``numa-pin.io/pod`` beside it is ignored); else ``user:<numa-pin.io/pod>``, with the claimed
    value returned so the decision can refuse a claim on another sandbox's pod; else the container
    alone. Raises :class:`RequestError` for an empty ``numa-pin.io/pod``."""
    sandbox = next((annotations[k] for k in POD_ID_KEYS if annotations.get(k)), None)
    if sandbox:
        return sandbox, None
    claimed = annotations.get(PREFIX + "pod")
    if claimed is None:
        return container_id, None
    if not claimed or claimed != claimed.strip() or not claimed.isprintable():
        raise RequestError(f"{quote(claimed)} is not a pod name (empty, blank or unprintable)",
                           annotation=PREFIX + "pod")
    return USER_POD_PREFIX + claimed, claimed
