"""What an OCI runtime hands a hook: the state on stdin and the bundle's config.json.

Pure parsing (``read_state`` / ``parse_spec``) sits under thin loaders (``load_spec``).
Only the fields numa-pin needs are kept; everything else in the documents is ignored, so
newer runtime-spec versions keep working.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from numa_pin.base.boundedio import UnsafeInput, json_loads_bounded, read_regular_file
from numa_pin.base.record import field, record
from numa_pin.base.text import MAX_PATH, quote, unfit
from numa_pin.devices.devnode import DeviceNode
from numa_pin.errors import HookInputError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import IO, Any

    from numa_pin.requests.limits import ContainerLimits

#: largest state / config.json numa-pin accepts (a real one is a few KiB)
MAX_DOCUMENT_BYTES = 4 << 20
#: deepest nesting of lists and objects accepted in either (a real config.json nests about 6)
MAX_DEPTH = 64
#: most ``linux.devices`` entries read (a container with a whole GPU box carries a few dozen)
MAX_DEVICES = 4096


@record
class OciState:
    """The container state a runtime writes on the hook's stdin (runtime-spec ``State``)."""

    id: str
    status: str
    pid: int | None
    bundle: str
    annotations: Mapping[str, str] = field(default_factory=dict)


@record
class OciSpec:
    """The parts of ``config.json`` numa-pin reads."""

    annotations: Mapping[str, str]
    env: Mapping[str, str]
    root_path: str | None  # absolute (resolved against the bundle)
    limits: ContainerLimits  # linux.cgroupsPath and linux.resources
    netns_path: str | None
    #: ``linux.devices``: the device nodes the runtime creates in the container
    devices: tuple[DeviceNode, ...] = ()
    #: the pod's own resources where the runtime hands them over (NRI's pod resources; the
    #: hook's ``config.json`` has none: CRI-O's annotation of them is read from the annotations)
    pod_limits: ContainerLimits | None = None


def load_object(text: bytes | str, what: str) -> dict[str, Any]:
    """A JSON object a runtime handed the hook, bounded in size (:data:`MAX_DOCUMENT_BYTES`)
    and depth (:data:`MAX_DEPTH`). Raises :class:`HookInputError` naming ``what``."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise HookInputError(f"{what}: larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        doc = json_loads_bounded(text, MAX_DEPTH)
    except UnsafeInput as exc:
        raise HookInputError(f"{what}: {exc}") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise HookInputError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise HookInputError(f"{what}: expected a JSON object")
    return doc


def _str_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HookInputError(f"{what}: expected an object of strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise HookInputError(f"{what}: key {quote(k)} must map a string to a string")
        out[k] = v
    return out


def read_state(fp: IO[bytes] | IO[str], source: str = "stdin") -> OciState:
    """Parse the OCI state JSON from a stream. Accepts the legacy ``bundlePath`` key."""
    data = fp.read(MAX_DOCUMENT_BYTES + 1)
    doc = load_object(data, f"OCI state on {source}")
    cid = doc.get("id")
    if not isinstance(cid, str) or not cid:
        raise HookInputError(f"OCI state on {source}: missing container 'id'")
    wrong = unfit(cid)
    if wrong is not None:
        raise HookInputError(f"OCI state on {source}: the container id {quote(cid)} {wrong}")
    bundle = doc.get("bundle", doc.get("bundlePath"))
    if not isinstance(bundle, str) or not bundle:
        raise HookInputError(f"OCI state on {source}: container {cid}: missing 'bundle'")
    wrong = unfit(bundle, MAX_PATH)
    if wrong is not None:
        raise HookInputError(f"OCI state on {source}: container {cid}: the bundle {quote(bundle)} {wrong}")
    pid = doc.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid < 0):
        raise HookInputError(f"OCI state on {source}: container {cid}: bad 'pid' {quote(pid)}")
    status = doc.get("status", "")
    if not isinstance(status, str):
        raise HookInputError(f"OCI state on {source}: container {cid}: bad 'status'")
    return OciState(
        id=cid,
        status=status,
        pid=pid or None,
        bundle=bundle,
        annotations=_str_map(doc.get("annotations"), f"OCI state of {cid}: annotations"),
    )


def _opt_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise HookInputError(f"{what}: expected an integer, got {quote(value)}")
    return value


def _dig(doc: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = doc
    for k in keys:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(k)
    return cur


def parse_spec(text: bytes | str, bundle: str, source: str = "config.json") -> OciSpec:
    """Parse a bundle's ``config.json``; relative ``root.path`` is resolved against ``bundle``."""
    from numa_pin.requests.limits import ContainerLimits  # what every caller goes on to read

    doc = load_object(text, source)
    env: dict[str, str] = {}
    raw_env = _dig(doc, "process", "env") or []
    if not isinstance(raw_env, list):
        raise HookInputError(f"{source}: process.env must be a list")
    for item in raw_env:
        if isinstance(item, str) and "=" in item:
            k, _, v = item.partition("=")
            env[k] = v
    root = _dig(doc, "root", "path")
    if root is not None:
        if not isinstance(root, str):
            raise HookInputError(f"{source}: root.path must be a string")
        root = os.path.normpath(os.path.join(bundle, root))
    cpu = _dig(doc, "linux", "resources", "cpu") or {}
    mem = _dig(doc, "linux", "resources", "memory") or {}
    if not isinstance(cpu, dict) or not isinstance(mem, dict):
        raise HookInputError(f"{source}: linux.resources.cpu/memory must be objects")
    hugepages: dict[str, int] = {}
    for entry in _dig(doc, "linux", "resources", "hugepageLimits") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("pageSize"), str):
            raise HookInputError(f"{source}: bad linux.resources.hugepageLimits entry {quote(entry)}")
        limit = _opt_int(entry.get("limit"), f"{source}: hugepageLimits[{entry['pageSize']}].limit")
        hugepages[entry["pageSize"]] = limit or 0
    netns = None
    for ns in _dig(doc, "linux", "namespaces") or []:
        if isinstance(ns, dict) and ns.get("type") == "network" and isinstance(ns.get("path"), str):
            netns = ns["path"]
    cgroups_path = _dig(doc, "linux", "cgroupsPath")
    wrong = unfit(cgroups_path, MAX_PATH) if isinstance(cgroups_path, str) else None
    if wrong is not None:
        raise HookInputError(f"{source}: linux.cgroupsPath {quote(cgroups_path)} {wrong}")
    cpuset_cpus = cpu.get("cpus")
    if cpuset_cpus is not None and not isinstance(cpuset_cpus, str):
        raise HookInputError(f"{source}: linux.resources.cpu.cpus must be a string, got {quote(cpuset_cpus)}")
    return OciSpec(
        devices=_devices(_dig(doc, "linux", "devices"), source),
        annotations=_str_map(doc.get("annotations"), f"{source}: annotations"),
        env=env,
        root_path=root,
        limits=ContainerLimits(
            cgroups_path=cgroups_path if isinstance(cgroups_path, str) else None,
            cpu_quota=_opt_int(cpu.get("quota"), f"{source}: linux.resources.cpu.quota"),
            cpu_period=_opt_int(cpu.get("period"), f"{source}: linux.resources.cpu.period"),
            cpu_shares=_opt_int(cpu.get("shares"), f"{source}: linux.resources.cpu.shares"),
            cpuset=cpuset_cpus,
            memory_limit=_opt_int(mem.get("limit"), f"{source}: linux.resources.memory.limit"),
            hugepage_limits=hugepages,
        ),
        netns_path=netns,
    )


def _devices(raw: Any, source: str) -> tuple[DeviceNode, ...]:
    """``linux.devices`` (at most :data:`MAX_DEVICES`); entries of other types than ``c``,
    ``u`` and ``b`` are no devices to align to."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_DEVICES:
        raise HookInputError(f"{source}: linux.devices must be a list of at most {MAX_DEVICES}")
    out = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise HookInputError(f"{source}: bad linux.devices entry {quote(entry)}")
        kind = entry.get("type")
        if kind not in ("c", "u", "b"):
            continue
        numbers = [_opt_int(entry.get(k), f"{source}: linux.devices {entry['path']}.{k}") for k in ("major", "minor")]
        out.append(DeviceNode(entry["path"], "linux.devices", "b" if kind == "b" else "c", numbers[0], numbers[1]))
    return tuple(out)


def load_spec(bundle: str) -> OciSpec:
    """Read ``<bundle>/config.json``: a regular file of at most :data:`MAX_DOCUMENT_BYTES`, opened
    without blocking (a FIFO there is refused, not waited on).

    Raises:
        HookInputError: the file is missing, unreadable, not a regular file, too large, not
            JSON or nested too deeply; the message names the path.
    """
    path = os.path.join(bundle, "config.json")
    try:
        text = read_regular_file(path, MAX_DOCUMENT_BYTES)
    except UnsafeInput as exc:
        raise HookInputError(f"{path}: {exc}") from None
    except OSError as exc:
        raise HookInputError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_spec(text, bundle, source=path)
