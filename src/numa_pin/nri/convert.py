"""Between NRI's messages and numa-pin's requests and grants.

:func:`spec_of` turns NRI's pod and container into the :class:`~numa_pin.hook.oci.OciSpec` the
hook reads from ``config.json``, so the request is built by the hook's own
:func:`~numa_pin.hook.admit.request_from_spec`: the same annotations, device-plugin environment,
``linux.devices``, ``linux.resources`` and cgroup parent (kubelet's QoS class) give the same
request. The pod's
annotations count too, under the container's: NRI hands them over, so a pod annotated
``numa-pin.io/...`` needs no ``pod_annotations`` passthrough in containerd's config. So do the
pod's own resources (``PodSandbox.linux.pod_resources``, kubelet's sum of its containers'; the
overhead apart), which give a pod-scope pod its totals as ``numa-pin.io/pod-*`` would
(:func:`~numa_pin.requests.request.pod_totals`).

:func:`fill_adjustment` writes what the resources say the runtime must apply
(:class:`~numa_pin.resources.node.runtime.RuntimeEdit`) into the adjustment at ``CreateContainer``,
and :func:`fill_update` its cpuset into an update at ``Synchronize`` and ``UpdateContainer``;
neither names a resource. :func:`check_names` refuses ids, names and cgroup paths that hold a
control character or are too long. Message objects come in from :mod:`numa_pin.nri.messages`;
nothing here imports protobuf.
"""

from __future__ import annotations

from typing import Any

from numa_pin.base.cpuset import format_list
from numa_pin.base.text import MAX_NAME, MAX_PATH, quote, unfit
from numa_pin.devices.devnode import DeviceNode
from numa_pin.errors import PathLimitError, RequestError
from numa_pin.hook.oci import MAX_DEVICES, OciSpec
from numa_pin.requests.kubernetes import NAME_KEYS, POD_ID_KEYS, POD_NAME_KEYS, SANDBOX_TYPE_KEYS
from numa_pin.requests.limits import ContainerLimits
from numa_pin.resources.node.runtime import RuntimeEdit
from numa_pin.resources.runtime import NRI

#: containerd's keys for the pod's id, namespace and name, the container's name and type (set
#: when the runtime left them out of the container's annotations)
_SANDBOX_ID = POD_ID_KEYS[1]
_SANDBOX_NS, _SANDBOX_NAME = POD_NAME_KEYS[0]
_NAME, _TYPE = NAME_KEYS[1], SANDBOX_TYPE_KEYS[1]


def _optional(parent: Any, name: str) -> int | None:
    """The value of an NRI ``Optional*`` field, or None when it is not set."""
    return int(getattr(parent, name).value) if parent.HasField(name) else None


def annotations_of(pod: Any, container: Any) -> dict[str, str]:
    """The pod's annotations under the container's, with the pod's identity filled in."""
    out = {**dict(pod.annotations), **dict(container.annotations)}
    if container.pod_sandbox_id:
        out.setdefault(_SANDBOX_ID, container.pod_sandbox_id)
    if pod.name:
        out.setdefault(_SANDBOX_NS, pod.namespace)
        out.setdefault(_SANDBOX_NAME, pod.name)
    if container.name and not any(out.get(k) for k in NAME_KEYS):
        out[_NAME] = container.name
    out.setdefault(_TYPE, "container")  # NRI asks about containers only, never a pod's sandbox
    return out


def pod_limits_of(pod: Any) -> ContainerLimits | None:
    """The pod's own resources (``linux.pod_resources``) as the request reads limits, with its
    cgroup parent (where its QoS class shows); None when the runtime sent none."""
    linux = pod.linux
    if not linux.HasField("pod_resources"):
        return None
    res = linux.pod_resources
    cpu, memory = res.cpu, res.memory
    return ContainerLimits(
        cgroups_path=linux.cgroup_parent or None,
        cpu_quota=_optional(cpu, "quota"),
        cpu_period=_optional(cpu, "period"),
        cpu_shares=_optional(cpu, "shares"),
        memory_limit=_optional(memory, "limit"),
    )


def spec_of(pod: Any, container: Any) -> OciSpec:
    """What the hook would read from the container's ``config.json``, from NRI's view of it."""
    linux = container.linux
    res = linux.resources
    cpu, memory = res.cpu, res.memory
    env: dict[str, str] = {}
    for item in container.env:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return OciSpec(
        annotations=annotations_of(pod, container),
        env=env,
        root_path=None,
        limits=ContainerLimits(
            cgroups_path=linux.cgroups_path or None,
            cpu_quota=_optional(cpu, "quota"),
            cpu_period=_optional(cpu, "period"),
            cpu_shares=_optional(cpu, "shares"),
            cpuset=cpu.cpus or None,
            memory_limit=_optional(memory, "limit"),
            hugepage_limits={h.page_size: int(h.limit) for h in res.hugepage_limits},
        ),
        netns_path=None,
        devices=devices_of(linux),
        pod_limits=pod_limits_of(pod),
    )


def devices_of(linux: Any) -> tuple[DeviceNode, ...]:
    """The device nodes the runtime makes in NRI's container (``linux.devices``), as the hook reads
    them from ``config.json``: character and block nodes, the others no device to align to.
    Raises RequestError for more than :data:`~numa_pin.hook.oci.MAX_DEVICES` of them."""
    if len(linux.devices) > MAX_DEVICES:
        raise RequestError(f"the runtime's linux.devices has more than {MAX_DEVICES} entries")
    return tuple(DeviceNode(d.path, "linux.devices", "b" if d.type == "b" else "c", int(d.major), int(d.minor))
                 for d in linux.devices if d.type in ("c", "u", "b"))


def fill_update(resources: Any, edit: RuntimeEdit) -> bool:
    """Write the cpuset and quota of ``edit`` into an NRI ``LinuxResources`` (an update at
    ``Synchronize`` and ``UpdateContainer``, or the adjustment's). False when it has neither."""
    if edit.cpus is not None:
        resources.cpu.cpus = format_list(edit.cpus)
        if edit.mems:
            resources.cpu.mems = format_list(edit.mems)
    if edit.cpu_quota is not None:
        resources.cpu.quota.value = edit.cpu_quota
    return edit.cpus is not None or edit.cpu_quota is not None


def fill_adjustment(adjust: Any, edit: RuntimeEdit) -> None:
    """Write ``edit`` into an NRI ``ContainerAdjustment``: the cpuset, device nodes
    (:class:`~numa_pin.enforcer.devnodes.DeviceNode`) with their allow rules, variables, the
    memory policy and netdevs to move in. Raises PathLimitError for exec CPUs: the adjustment has
    no field for ``process.execCPUAffinity`` (the NRI target says so, so no resource asks it)."""
    if edit.exec_cpus is not None:
        raise PathLimitError(NRI.cannot_exec("process.execCPUAffinity"))
    fill_update(adjust.linux.resources, edit)
    for node in edit.devices:
        dev = adjust.linux.devices.add()
        dev.path, dev.type, dev.major, dev.minor = node.path, node.type, node.major, node.minor
        dev.file_mode.value = node.mode
        dev.uid.value = 0
        dev.gid.value = 0
        rule = adjust.linux.resources.devices.add()
        rule.allow, rule.type, rule.access = True, node.type, "rwm"
        rule.major.value, rule.minor.value = node.major, node.minor
    for key, value in edit.env.items():
        kv = adjust.env.add()
        kv.key, kv.value = key, value
    if edit.memory_policy is not None:
        policy = adjust.linux.memory_policy
        policy.mode = type(policy).DESCRIPTOR.fields_by_name["mode"].enum_type.values_by_name[
            edit.memory_policy["mode"]].number
        policy.nodes = edit.memory_policy.get("nodes", "")
    for host, name in edit.net_devices.items():
        adjust.linux.net_devices[host].name = name


def check_names(pod: Any, container: Any) -> None:
    """Refuse (RequestError) a container whose ids, names or cgroup paths, as the runtime sent
    them, hold a NUL or another control character or are too long (:func:`numa_pin.base.text.unfit`):
    they would reach the ledger, reason files and cgroup paths, where they break every later look."""
    linux = container.linux
    for what, value, limit in (
        ("container id", container.id, MAX_NAME), ("container name", container.name, MAX_NAME),
        ("container's pod id", container.pod_sandbox_id, MAX_NAME), ("cgroups_path", linux.cgroups_path, MAX_PATH),
        ("pod id", pod.id, MAX_NAME), ("pod name", pod.name, MAX_NAME), ("pod namespace", pod.namespace, MAX_NAME),
        ("pod uid", pod.uid, MAX_NAME), ("pod's cgroup_parent", pod.linux.cgroup_parent, MAX_PATH),
    ):
        wrong = unfit(value, limit)
        if wrong is not None:
            raise RequestError(f"the runtime's {what} {quote(value)} {wrong}")


__all__ = ["annotations_of", "check_names", "fill_adjustment", "fill_update", "pod_limits_of", "spec_of"]
