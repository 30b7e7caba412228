"""``numa-pin-hook precreate``: decide from the proposed ``config.json`` and write the decision into it.

podman runs hooks.d hooks of the ``precreate`` stage before it calls the runtime: the hook reads
the proposed OCI config on stdin and prints the config to use on stdout. numa-pin then

1. takes the container id from ``linux.cgroupsPath`` (``machine.slice:libpod:<id>`` with the
   systemd driver, ``/libpod_parent/libpod-<id>`` with cgroupfs): the OCI state does not exist
   yet, and that id is the one the runtime and the later hooks use;
2. builds the request exactly as prestart does (annotations, ``linux.resources``, device-plugin
   env, CDI names) and admits it without a pid: the grant is recorded in the ledger under the
   container id, the shared pool shrinks, nothing else is touched;
3. writes the grant into the config: every registered resource says what the runtime must apply
   (``NodeResource.runtime``: the cpuset, device nodes with their rules and variables, the
   memory policy, VF netdevs) and :func:`edit_spec` writes the merged edit; nothing here names a
   resource. ``linux.memoryPolicy`` and ``linux.netDevices`` count only when the config says its
   runtime-spec has them (:func:`runtime_features`); a memory policy asked of an older runtime is
   refused before anything is decided.

The runtime (and systemd) then apply the values themselves, so a ``daemon-reload`` or ``runc
update`` keeps them, and GPUs work on cgroup v2. The prestart/createRuntime hook, when installed
too, finds the grant, binds it to the container's pid and cgroup and re-applies it (idempotent);
poststop releases it. A container that asks for nothing passes through unchanged and unrecorded.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from numa_pin.base.cpuset import format_list
from numa_pin.base.record import record
from numa_pin.errors import HookInputError, NumaPinError
from numa_pin.ledger.model import Grant
from numa_pin.resources.node.runtime import RuntimeEdit
from numa_pin.resources.runtime import precreate_target
from numa_pin.topology.model import PciDevice, Topology

#: the runtime-spec release that added ``linux.netDevices`` and ``linux.memoryPolicy``
NATIVE_FIELDS_SINCE = (1, 3, 0)
#: the runtime-spec release that added ``process.execCPUAffinity``
EXEC_AFFINITY_SINCE = (1, 2, 0)
_HEX_ID = re.compile(r"[0-9a-f]{12,128}")


def expected_root(doc: Mapping[str, Any]) -> str | None:
    """The container's root filesystem as the proposed config names it (podman: the mounted
    storage of the container, removed with it), when it is an absolute path that exists now;
    None otherwise (a relative or missing one is no evidence of anything later)."""
    root = doc.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    return path if isinstance(path, str) and path.startswith("/") and os.path.isdir(path) else None


def container_id_from_cgroups_path(path: str | None) -> str | None:
    """The container id in a ``linux.cgroupsPath``, or None when there is none.

    ``slice:prefix:name`` (systemd driver) gives ``name``; a path gives its last component
    without a ``<prefix>-`` in front of a hex id and without ``.scope``.
    """
    if not path:
        return None
    if ":" in path and not path.startswith("/"):
        name = path.rsplit(":", 1)[1]
    else:
        name = path.rstrip("/").rsplit("/", 1)[-1]
    name = name.removesuffix(".scope")
    prefix, sep, rest = name.rpartition("-")
    if sep and prefix and _HEX_ID.fullmatch(rest):
        name = rest
    return name or None


def expected_cgroup(path: str | None) -> str | None:
    """The cgroup (relative to the hierarchy root) a runtime makes for ``linux.cgroupsPath``.

    A path is taken as it is; ``slice:prefix:name`` (systemd driver) is
    ``/<expanded slice>/<prefix>-<name>.scope``, the slice expanded on dashes as systemd does
    (``a-b.slice`` lives in ``a.slice``). None when there is no path.
    """
    if not path:
        return None
    if path.startswith("/"):
        return os.path.normpath(path)
    parts = path.split(":")
    if len(parts) != 3:
        return None
    slice_name, prefix, name = parts
    chain: list[str] = []
    if slice_name and slice_name != "-.slice":
        stem = slice_name.removesuffix(".slice")
        pieces = stem.split("-")
        chain = ["-".join(pieces[: i + 1]) + ".slice" for i in range(len(pieces))]
    unit = name if name.endswith(".slice") else f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
    return "/" + "/".join([*chain, unit])


def _version(text: object) -> tuple[int, ...]:
    if not isinstance(text, str):
        return ()
    parts: list[int] = []
    for piece in text.split("-", 1)[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


@record
class RuntimeFeatures:
    """Which optional config fields the runtime that gets this config is known to apply."""

    net_devices: bool = False
    memory_policy: bool = False
    exec_affinity: bool = False


def runtime_features(doc: Mapping[str, Any]) -> RuntimeFeatures:
    """What the config's ``ociVersion`` promises (pure). A config of runtime-spec 1.3.0 or later
    was made for a runtime that knows ``linux.netDevices`` and ``linux.memoryPolicy``, one of
    1.2.0 or later for one that knows ``process.execCPUAffinity``; anything older (podman 4.3
    writes ``1.0.2-dev``) gets none, since an older runtime ignores them."""
    version = _version(doc.get("ociVersion"))
    new = version >= NATIVE_FIELDS_SINCE
    return RuntimeFeatures(net_devices=new, memory_policy=new, exec_affinity=version >= EXEC_AFFINITY_SINCE)


def _obj(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise HookInputError(f"proposed config: {where} must be an object")
    return value


def _list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = []
    if not isinstance(value, list):
        raise HookInputError(f"proposed config: {where} must be a list")
    return value


def _set_env(doc: dict[str, Any], key: str, value: str) -> None:
    env = _list(_obj(doc, "process", "process"), "env", "process.env")
    entry = f"{key}={value}"
    for i, item in enumerate(env):
        if isinstance(item, str) and item.partition("=")[0] == key:
            env[i] = entry
            return
    env.append(entry)


def granted_devices(grant: Grant, topology: Topology) -> list[PciDevice]:
    """The PCI devices of ``grant`` the topology knows, in grant order."""
    out: list[PciDevice] = []
    for ids in grant.devices.values():
        for address in ids:
            dev = topology.device(address)
            if dev is not None:
                out.append(dev)
    return out


def edit_spec(doc: Mapping[str, Any], edit: RuntimeEdit) -> dict[str, Any]:
    """A copy of ``doc`` carrying ``edit`` (pure): the cpuset and quota in ``linux.resources.cpu``, device
    nodes in ``linux.devices`` with their rules in ``linux.resources.devices``, variables in
    ``process.env``, ``linux.memoryPolicy``, ``linux.netDevices`` and the exec CPUs in
    ``process.execCPUAffinity.final`` (an ``initial`` the config has is kept).

    Raises HookInputError when a field numa-pin writes has the wrong shape.
    """
    from numa_pin.enforcer.devnodes import oci_allow_rule, oci_device_entry

    out: dict[str, Any] = copy.deepcopy(dict(doc))
    linux = _obj(out, "linux", "linux")
    resources = _obj(linux, "resources", "linux.resources")
    if edit.cpus is not None:
        cpu = _obj(resources, "cpu", "linux.resources.cpu")
        cpu["cpus"] = format_list(edit.cpus)
        if edit.mems:
            cpu["mems"] = format_list(edit.mems)
    if edit.cpu_quota is not None:
        _obj(resources, "cpu", "linux.resources.cpu")["quota"] = edit.cpu_quota
    if edit.memory_policy is not None and not (edit.policy_default and "memoryPolicy" in linux):
        linux["memoryPolicy"] = dict(edit.memory_policy)
    if edit.devices:
        entries = _list(linux, "devices", "linux.devices")
        present = {e.get("path") for e in entries if isinstance(e, dict)}
        rules = _list(resources, "devices", "linux.resources.devices")
        for node in edit.devices:
            if node.path not in present:
                entries.append(oci_device_entry(node))
            rules.append(oci_allow_rule(node))
    for key, value in edit.env.items():
        _set_env(out, key, value)
    if edit.net_devices:
        net = _obj(linux, "netDevices", "linux.netDevices")
        for host, name in edit.net_devices.items():
            net[host] = {"name": name}
    if edit.exec_cpus:
        process = _obj(out, "process", "process")
        _obj(process, "execCPUAffinity", "process.execCPUAffinity")["final"] = format_list(edit.exec_cpus)
    return out


def read_proposed(data: bytes) -> dict[str, Any]:
    """The proposed config podman wrote on stdin (bounded like every hook input).

    Raises HookInputError for a document that is too large, nested too deeply, not JSON or not
    an object.
    """
    from numa_pin.hook.oci import load_object

    return load_object(data, "proposed config on stdin")


@record
class Precreate:
    """What :func:`precreate` did: the config to print, and the grant it recorded (if any)."""

    container_id: str | None
    spec: dict[str, Any]
    grant: Grant | None


def precreate(data: bytes, service: Any, deadline: Any = None) -> Precreate:
    """Decide from the proposed config ``data`` through ``service`` (a NodeService), within
    ``deadline`` (a :class:`~numa_pin.base.deadline.Deadline`; None: the config's from now).

    A container that asks for nothing comes back unchanged and is not recorded. Raises
    HookInputError (bad config, no container id for a container that asks for something),
    RequestError, an AdmissionError on rejection (nothing stays allocated), LedgerError.
    """
    from numa_pin.hook.admit import request_from_spec
    from numa_pin.hook.oci import OciState, parse_spec

    doc = read_proposed(data)
    spec = parse_spec(data, "/", source="proposed config on stdin")
    cid = container_id_from_cgroups_path(spec.limits.cgroups_path)
    state = OciState(id=cid or "precreate", status="precreate", pid=None, bundle="/")
    request = request_from_spec(state, spec, service.config)
    if asks_nothing(request):
        return Precreate(cid, doc, None)
    if cid is None:
        raise HookInputError(
            "proposed config has no linux.cgroupsPath naming the container, so numa-pin cannot "
            "key its grant; run the container with cgroups enabled"
        )
    features = runtime_features(doc)
    target = precreate_target(features.memory_policy, features.net_devices, features.exec_affinity)
    admitted = service.admit(request, None, expected_cgroup=expected_cgroup(spec.limits.cgroups_path),
                             expected_root=expected_root(doc), target=target, deadline=deadline)
    grant = admitted.grant
    try:
        edit = service.runtime_edit(grant, request, target)
        spec_out = edit_spec(doc, edit)
    except NumaPinError:
        service.release(cid)
        raise
    return Precreate(cid, spec_out, service.applied(grant, edit))


def asks_nothing(request: Any) -> bool:
    """True for a request with no amounts, pod amounts or fixed devices."""
    pod_empty = request.pod_amounts is None or request.pod_amounts.empty
    return bool(request.amounts.empty and pod_empty and not _fixed(request))


def _fixed(request: Any) -> Sequence[object]:
    return [*request.fixed_gpus, *request.fixed_pci.values(), *request.fixed_cdi, *request.placeable_nodes]


__all__ = [
    "EXEC_AFFINITY_SINCE",
    "NATIVE_FIELDS_SINCE",
    "Precreate",
    "RuntimeFeatures",
    "asks_nothing",
    "container_id_from_cgroups_path",
    "edit_spec",
    "expected_cgroup",
    "expected_root",
    "granted_devices",
    "precreate",
    "read_proposed",
    "runtime_features",
]
