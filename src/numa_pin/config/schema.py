"""The configuration schema: one table of keys with their defaults, and frozen dataclasses.

:data:`ITEMS` is the single source of truth: every key's dotted name, type, built-in
default (as written in YAML) and meaning, plus the parser that validates it. The
dataclasses below take their defaults from that table, :func:`config_from_dict`
validates against it, :func:`sample_yaml` renders ``packaging/config.yaml`` from it and
:func:`reference_table` renders the table in the docs.

Validation is strict: an unknown key anywhere, a wrong type, a bad enum value, a bad
quantity or a bad cpulist raises :class:`numa_pin.errors.ConfigError` naming the dotted
key (``cpu_manager.options.full-pcpus-only``, ``devices.nvidia.com/gpu[0].vendors``) and
the file. Nothing here does I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeGuard

from numa_pin.cpuset import format_list, parse_list
from numa_pin.errors import ConfigError, RequestError
from numa_pin.quantity import format_bytes, parse_bytes

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")
#: Topology Manager policy options numa-pin knows (kubelet names)
POLICY_OPTIONS = ("prefer-closest-numa-nodes", "max-allowable-numa-nodes")
#: CPU manager static-policy options (kubelet names), each a Go-ParseBool boolean
CPU_MANAGER_OPTIONS = (
    "full-pcpus-only",
    "distribute-cpus-across-numa",
    "distribute-cpus-across-cores",
    "prefer-align-cpus-by-uncorecache",
    "strict-cpu-reservation",
    "align-by-socket",
)
#: keys of one device selector; list-valued unless noted in SELECTOR_BOOL_KEYS
SELECTOR_KEYS = ("vendors", "devices", "classes", "drivers", "pf_names", "is_vf", "has_netdev", "addresses")
SELECTOR_BOOL_KEYS = ("is_vf", "has_netdev")

# Go strconv.ParseBool
_GO_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_GO_FALSE = frozenset(("0", "f", "F", "FALSE", "false", "False"))

_RESOURCE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?(/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_HEX = re.compile(r"(?:0[xX])?([0-9a-fA-F]+)")
_PCI_ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


class Invalid(Exception):
    """A value failed validation; ``config_from_dict`` turns it into :class:`ConfigError`."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


# ---- value parsers: (raw value, dotted key) -> typed value, raise Invalid ---------------


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _enum(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def parse(value: Any, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise Invalid(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    return parse


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(key, f"must be true or false; got {value!r} ({_type_name(value)})")
    return value


def _boolish(value: Any, key: str) -> bool:
    """A kubelet option value: a YAML boolean, 0/1, or a Go ParseBool string."""
    if isinstance(value, bool):
        return value
    if _is_int(value) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        if value in _GO_TRUE:
            return True
        if value in _GO_FALSE:
            return False
    raise Invalid(key, f"must be a boolean (true/false, 1/0, \"t\"/\"f\"); got {value!r}")


def _abs_path(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise Invalid(key, f"must be an absolute path; got {value!r}")
    return value


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(key, f"must be a number of seconds; got {value!r} ({_type_name(value)})")
    if not math.isfinite(value) or value < 0 or value > 3600:
        raise Invalid(key, f"must be between 0 and 3600 seconds; got {value!r}")
    return float(value)


def _count(value: Any, key: str) -> int:
    if not _is_int(value) or value < 0:
        raise Invalid(key, f"must be a non-negative integer; got {value!r} ({_type_name(value)})")
    return value


def _cpulist(value: Any, key: str) -> frozenset[int] | None:
    if value is None:
        return None
    if _is_int(value) and 0 <= value < 10**9:  # YAML reads "reserved_cpus: 0" as an int
        value = str(value)
    if not isinstance(value, str):
        raise Invalid(key, f"must be a cpulist string such as \"0-1,8\" or null; got {value!r}")
    if not value.strip():
        raise Invalid(key, "must not be empty (use null to reserve num_reserved_cpus CPUs instead)")
    try:
        return parse_list(value)
    except ValueError as exc:
        raise Invalid(key, f"bad cpulist {value!r}: {exc}") from None


def _mapping(value: Any, key: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Invalid(key, f"must be a mapping; got {_type_name(value)}")
    return value


def _child(key: str, name: object) -> str:
    if not isinstance(name, (str, int)) or isinstance(name, bool):
        raise Invalid(key, f"keys must be strings; got {name!r}")
    return f"{key}.{name}"


def _policy_options(value: Any, key: str) -> Mapping[str, str | bool | int]:
    out: dict[str, str | bool | int] = {}
    for name, raw in _mapping(value, key).items():
        sub = _child(key, name)
        if name not in POLICY_OPTIONS:
            raise Invalid(sub, f"unknown policy option; known: {', '.join(POLICY_OPTIONS)}")
        if not isinstance(raw, (str, bool, int)):
            raise Invalid(sub, f"must be a string, boolean or integer; got {raw!r} ({_type_name(raw)})")
        out[name] = raw
    return MappingProxyType(out)


def _node_id(name: object, key: str) -> int:
    if _is_int(name) and name >= 0:
        return name
    if isinstance(name, str) and name.isascii() and name.isdigit() and str(int(name)) == name:
        return int(name)
    raise Invalid(f"{key}.{name}", "NUMA node ids must be non-negative integers")


def _memory_resource(name: object, key: str) -> str:
    """``memory`` or ``hugepages-<size>``, the size normalised (``hugepages-2048Ki`` -> ``-2Mi``)."""
    sub = f"{key}.{name}"
    if name == "memory":
        return "memory"
    if isinstance(name, str) and name.startswith("hugepages-"):
        try:
            size = parse_bytes(name[len("hugepages-") :], sub)
        except RequestError:
            size = 0
        if size > 0:
            return f"hugepages-{format_bytes(size)}"
    raise Invalid(sub, "resource must be memory or hugepages-<size> (hugepages-2Mi, hugepages-1Gi)")


def _quantity(value: Any, key: str) -> int:
    try:
        return parse_bytes(value, key)
    except RequestError as exc:
        message = str(exc)
        raise Invalid(key, message.removeprefix(f"{key}: ")) from None


def _reserved_memory(value: Any, key: str) -> Mapping[int, Mapping[str, int]]:
    out: dict[int, Mapping[str, int]] = {}
    for name, per_node in _mapping(value, key).items():
        node = _node_id(name, key)
        node_key = f"{key}.{name}"
        if node in out:
            raise Invalid(node_key, f"NUMA node {node} is listed twice")
        resources: dict[str, int] = {}
        for res_name, amount in _mapping(per_node, node_key).items():
            res = _memory_resource(res_name, node_key)
            res_key = f"{node_key}.{res_name}"
            if res in resources:
                raise Invalid(res_key, f"{res} is listed twice for node {node}")
            resources[res] = _quantity(amount, res_key)
        out[node] = MappingProxyType(resources)
    return MappingProxyType(out)


def _devices(value: Any, key: str) -> Mapping[str, tuple[DeviceSelector, ...]]:
    out: dict[str, tuple[DeviceSelector, ...]] = {}
    for name, selectors in _mapping(value, key).items():
        sub = _child(key, name)
        if not isinstance(name, str) or not _RESOURCE_NAME.fullmatch(name):
            raise Invalid(sub, "resource names look like vendor.com/name (e.g. nvidia.com/gpu)")
        if not isinstance(selectors, list) or not selectors:
            raise Invalid(sub, f"must be a non-empty list of selectors; got {_type_name(selectors)}")
        out[name] = tuple(_selector(sel, f"{sub}[{i}]") for i, sel in enumerate(selectors))
    return MappingProxyType(out)


def _selector(value: Any, key: str) -> DeviceSelector:
    if not isinstance(value, Mapping):
        raise Invalid(key, f"a selector must be a mapping; got {_type_name(value)}")
    if not value:
        raise Invalid(key, "an empty selector would match every PCI device")
    fields: dict[str, Any] = {}
    for name, raw in value.items():
        sub = _child(key, name)
        if name not in SELECTOR_KEYS:
            raise Invalid(sub, f"unknown selector key; known: {', '.join(SELECTOR_KEYS)}")
        if name in SELECTOR_BOOL_KEYS:
            fields[name] = _bool(raw, sub)
        else:
            fields[name] = _string_list(raw, sub, _SELECTOR_NORMALISERS.get(name))
    return DeviceSelector(**fields)


def _string_list(value: Any, key: str, normalise: Callable[[str, str], str] | None) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise Invalid(key, f"must be a non-empty list of strings; got {value!r}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise Invalid(f"{key}[{i}]", f"must be a non-empty string; got {item!r}")
        out.append(normalise(item, f"{key}[{i}]") if normalise else item)
    return tuple(out)


def _hex_id(digits: int) -> Callable[[str, str], str]:
    """Vendor/device ids: 1-4 hex digits, optional 0x -> ``0x10de`` (the sysfs form)."""

    def normalise(text: str, key: str) -> str:
        match = _HEX.fullmatch(text.strip())
        if match is None or len(match[1]) > digits:
            raise Invalid(key, f"must be a hex id of up to {digits} digits such as 0x10de; got {text!r}")
        return f"0x{int(match[1], 16):0{digits}x}"

    return normalise


def _class_prefix(text: str, key: str) -> str:
    """PCI class: 2, 4 or 6 hex digits (class, +subclass, +prog-if) -> ``0x0302``."""
    match = _HEX.fullmatch(text.strip())
    if match is None or len(match[1]) not in (2, 4, 6):
        raise Invalid(key, f"must be a PCI class of 2, 4 or 6 hex digits such as 0x0302; got {text!r}")
    return "0x" + match[1].lower()


def _pci_address(text: str, key: str) -> str:
    """``0000:3b:00.1`` or ``3b:00.1`` -> ``0000:3b:00.1``."""
    match = _PCI_ADDRESS.fullmatch(text.strip())
    if match is None:
        raise Invalid(key, f"must be a PCI address such as 0000:3b:00.1; got {text!r}")
    domain, bus, dev, fn = match.groups()
    return f"{(domain or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"


_SELECTOR_NORMALISERS: dict[str, Callable[[str, str], str]] = {
    "vendors": _hex_id(4),
    "devices": _hex_id(4),
    "classes": _class_prefix,
    "addresses": _pci_address,
}


# ---- the table ---------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigItem:
    """One configuration key: dotted name, type, default (as YAML writes it), meaning."""

    key: str
    type: str
    default: Any
    meaning: str
    parse: Callable[[Any, str], Any] = field(repr=False, compare=False)
    example: str = ""  # a commented YAML snippet for the sample file


_BOOLISH = "bool (true/false, 1/0, Go ParseBool strings)"

ITEMS: tuple[ConfigItem, ...] = (
    ConfigItem(
        "policy", "one of " + ", ".join(POLICIES), "best-effort",
        "Topology Manager policy, with kubelet's semantics.", _enum(POLICIES),
    ),
    ConfigItem(
        "scope", "one of " + ", ".join(SCOPES), "container",
        "Topology Manager scope: align each container, or a whole pod at once.", _enum(SCOPES),
    ),
    ConfigItem(
        "policy_options", "mapping option name -> string, bool or int", {},
        "Topology Manager policy options by kubelet name (" + ", ".join(POLICY_OPTIONS) + "). "
        "Values are kept as written; the policy parses them as kubelet does.",
        _policy_options,
        example="policy_options:\n  prefer-closest-numa-nodes: \"true\"\n  max-allowable-numa-nodes: 16",
    ),
    *(
        ConfigItem(f"cpu_manager.options.{name}", _BOOLISH, False, meaning, _boolish)
        for name, meaning in (
            ("full-pcpus-only", "Give exclusive CPUs as whole physical cores only; a request "
             "that is not a multiple of the threads per core fails (SMTAlignmentError)."),
            ("distribute-cpus-across-numa", "Spread exclusive CPUs evenly over the NUMA nodes "
             "a container needs instead of filling one node first."),
            ("distribute-cpus-across-cores", "Spread exclusive CPUs over physical cores, one "
             "thread per core first."),
            ("prefer-align-cpus-by-uncorecache", "Prefer exclusive CPUs that share an uncore "
             "(L3) cache."),
            ("strict-cpu-reservation", "Keep the reserved CPUs out of the shared pool too."),
            ("align-by-socket", "Align exclusive CPUs to whole sockets rather than NUMA nodes "
             "(refused with single-numa-node)."),
        )
    ),
    ConfigItem(
        "cpu_manager.reserved_cpus", "cpulist string or null", None,
        "CPUs kept out of exclusive allocation (kubelet reservedSystemCPUs). "
        "When set, num_reserved_cpus is ignored.", _cpulist,
    ),
    ConfigItem(
        "cpu_manager.num_reserved_cpus", "int >= 0", 1,
        "How many CPUs to reserve when reserved_cpus is null, picked as kubelet does; "
        "1 keeps the shared pool from ever emptying.", _count,
    ),
    ConfigItem(
        "reserved_memory", "mapping NUMA node -> {resource: quantity}", {},
        "Memory kept from the memory manager per node; resources are memory and "
        "hugepages-<size>; quantities are Kubernetes quantities (1Gi).", _reserved_memory,
        example="reserved_memory:\n  0:\n    memory: 1Gi\n    hugepages-2Mi: 256Mi",
    ),
    ConfigItem(
        "devices", "mapping resource name -> list of selectors", {},
        "Device resources numa-pin allocates and the PCI devices that belong to each. "
        "A device matches a selector when it matches every key given (any value in a "
        "list); it belongs to the resource when it matches any selector. Keys: "
        + ", ".join(SELECTOR_KEYS) + ".", _devices,
        example=(
            "devices:\n  nvidia.com/gpu:\n    - vendors: [\"0x10de\"]\n      classes: [\"0x0302\"]\n"
            "  intel.com/sriov_netdevice:\n    - vendors: [\"8086\"]\n      drivers: [iavf]\n"
            "      pf_names: [ens1f0]\n      is_vf: true"
        ),
    ),
    ConfigItem(
        "inference.guaranteed_cpus", "bool", True,
        "Without a numa-pin annotation, treat a container whose CPU quota is a whole "
        "number of CPUs as a Guaranteed pod would be: give it exclusive CPUs.", _bool,
    ),
    ConfigItem(
        "inference.hugepages", "bool", True,
        "Infer hugepage requests from the OCI spec's hugepage limits.", _bool,
    ),
    ConfigItem(
        "inference.device_plugin_env", "bool", True,
        "Infer device requests from device-plugin environment variables "
        "(NVIDIA_VISIBLE_DEVICES, PCIDEVICE_*).", _bool,
    ),
    ConfigItem("sysfs_root", "absolute path", "/sys", "Where sysfs is mounted.", _abs_path),
    ConfigItem("proc_root", "absolute path", "/proc", "Where procfs is mounted.", _abs_path),
    ConfigItem(
        "cgroup_root", "absolute path", "/sys/fs/cgroup",
        "The cgroup mount root (v2), or the directory holding the v1 hierarchies.", _abs_path,
    ),
    ConfigItem(
        "state_dir", "absolute path", "/var/lib/numa-pin",
        "Directory of the node ledger (ledger.json, ledger.lock).", _abs_path,
    ),
    ConfigItem(
        "kubelet_root", "absolute path", "/var/lib/kubelet",
        "kubelet's root directory; numa-pin warns when its cpu_manager_state checkpoint shows the "
        "static CPU manager policy (two allocators for the same CPUs).", _abs_path,
    ),
    ConfigItem(
        "lock_timeout_s", "number of seconds (0-3600)", 10,
        "How long an admission waits for the ledger lock before failing.", _seconds,
    ),
    ConfigItem(
        "syslog", "bool", True,
        "Also log decisions and errors to syslog (runtimes often drop hook stderr).", _bool,
    ),
)

_BY_KEY: dict[str, ConfigItem] = {item.key: item for item in ITEMS}


def _children() -> dict[str, tuple[str, ...]]:
    """Section prefix ("" for the top) -> its child names, in table order."""
    out: dict[str, list[str]] = {}
    for item in ITEMS:
        parts = item.key.split(".")
        for depth in range(len(parts)):
            prefix = ".".join(parts[:depth])
            names = out.setdefault(prefix, [])
            if parts[depth] not in names:
                names.append(parts[depth])
    return {prefix: tuple(names) for prefix, names in out.items()}


_CHILDREN = _children()


def _default(key: str) -> Any:
    item = _BY_KEY[key]
    return item.parse(item.default, key)


def _default_field(key: str) -> Any:
    return field(default_factory=lambda: _default(key), hash=False)


# ---- the typed configuration ------------------------------------------------------


@dataclass(frozen=True)
class DeviceSelector:
    """Which PCI devices belong to a resource. Unset keys (empty tuple / None) match any.

    Ids are normalised to sysfs's form: vendors/devices ``0x10de``, classes a lower-case
    ``0x`` prefix of the 6-digit class, addresses ``0000:3b:00.1``.
    """

    vendors: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    pf_names: tuple[str, ...] = ()
    is_vf: bool | None = None
    has_netdev: bool | None = None
    addresses: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The set keys only, as YAML writes them."""
        out: dict[str, Any] = {}
        for name in SELECTOR_KEYS:
            value = getattr(self, name)
            if value is None or value == ():
                continue
            out[name] = value if isinstance(value, bool) else list(value)
        return out


@dataclass(frozen=True)
class CpuManagerOptions:
    """CPU manager static-policy options; unset is false, as in kubelet."""

    full_pcpus_only: bool = _default_field("cpu_manager.options.full-pcpus-only")
    distribute_cpus_across_numa: bool = _default_field("cpu_manager.options.distribute-cpus-across-numa")
    distribute_cpus_across_cores: bool = _default_field("cpu_manager.options.distribute-cpus-across-cores")
    prefer_align_cpus_by_uncorecache: bool = _default_field(
        "cpu_manager.options.prefer-align-cpus-by-uncorecache"
    )
    strict_cpu_reservation: bool = _default_field("cpu_manager.options.strict-cpu-reservation")
    align_by_socket: bool = _default_field("cpu_manager.options.align-by-socket")

    def as_kubelet(self) -> dict[str, bool]:
        """Option name (kubelet spelling) -> value, for every option."""
        return {name: getattr(self, name.replace("-", "_")) for name in CPU_MANAGER_OPTIONS}

    def enabled(self) -> frozenset[str]:
        """Kubelet names of the options that are on."""
        return frozenset(name for name, on in self.as_kubelet().items() if on)


@dataclass(frozen=True)
class CpuManagerConfig:
    """CPU manager settings. ``reserved_cpus`` wins over ``num_reserved_cpus`` when set."""

    options: CpuManagerOptions = field(default_factory=CpuManagerOptions)
    reserved_cpus: frozenset[int] | None = _default_field("cpu_manager.reserved_cpus")
    num_reserved_cpus: int = _default_field("cpu_manager.num_reserved_cpus")


@dataclass(frozen=True)
class InferenceConfig:
    """What the hook may infer from an OCI spec without numa-pin annotations."""

    guaranteed_cpus: bool = _default_field("inference.guaranteed_cpus")
    hugepages: bool = _default_field("inference.hugepages")
    device_plugin_env: bool = _default_field("inference.device_plugin_env")


@dataclass(frozen=True)
class Config:
    """The whole numa-pin configuration. ``source`` is the file it came from (None: defaults).

    Construct it through :func:`config_from_dict` (or ``load_config``) to have it
    validated; direct construction trusts its arguments. ``Config()`` is the built-in
    defaults. ``source`` does not take part in equality.
    """

    policy: str = _default_field("policy")
    scope: str = _default_field("scope")
    policy_options: Mapping[str, str | bool | int] = _default_field("policy_options")
    cpu_manager: CpuManagerConfig = field(default_factory=CpuManagerConfig)
    reserved_memory: Mapping[int, Mapping[str, int]] = _default_field("reserved_memory")
    devices: Mapping[str, tuple[DeviceSelector, ...]] = _default_field("devices")
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    sysfs_root: str = _default_field("sysfs_root")
    proc_root: str = _default_field("proc_root")
    cgroup_root: str = _default_field("cgroup_root")
    state_dir: str = _default_field("state_dir")
    kubelet_root: str = _default_field("kubelet_root")
    lock_timeout_s: float = _default_field("lock_timeout_s")
    syslog: bool = _default_field("syslog")
    source: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form; ``config_from_dict(c.to_dict()) == c``."""
        cpu = self.cpu_manager
        return {
            "policy": self.policy,
            "scope": self.scope,
            "policy_options": dict(self.policy_options),
            "cpu_manager": {
                "options": cpu.options.as_kubelet(),
                "reserved_cpus": None if cpu.reserved_cpus is None else format_list(cpu.reserved_cpus),
                "num_reserved_cpus": cpu.num_reserved_cpus,
            },
            "reserved_memory": {node: dict(res) for node, res in sorted(self.reserved_memory.items())},
            "devices": {name: [s.to_dict() for s in sels] for name, sels in sorted(self.devices.items())},
            "inference": {
                "guaranteed_cpus": self.inference.guaranteed_cpus,
                "hugepages": self.inference.hugepages,
                "device_plugin_env": self.inference.device_plugin_env,
            },
            "sysfs_root": self.sysfs_root,
            "proc_root": self.proc_root,
            "cgroup_root": self.cgroup_root,
            "state_dir": self.state_dir,
            "kubelet_root": self.kubelet_root,
            "lock_timeout_s": self.lock_timeout_s,
            "syslog": self.syslog,
        }


# ---- validation --------------------------------------------------------------------


def config_from_dict(d: object, source: str | None = None) -> Config:
    """Validate a parsed YAML/JSON document into a :class:`Config`.

    ``None`` (an empty file) is the defaults. ``source`` names the file in errors.

    Raises:
        ConfigError: unknown key, wrong type, bad enum value, quantity or cpulist; the
            message names the dotted key and ``source``.
    """
    if d is None:
        d = {}
    if not isinstance(d, Mapping):
        raise ConfigError(f"the document must be a mapping of keys; got {_type_name(d)}", path=source)
    raw: dict[str, Any] = {}
    try:
        _collect(d, "", raw)
        values = {item.key: item.parse(raw[item.key], item.key) if item.key in raw else _default(item.key)
                  for item in ITEMS}
    except Invalid as exc:
        raise ConfigError(exc.message, key=exc.key, path=source) from None
    return _build(values, source)


def _collect(section: Mapping[Any, Any], prefix: str, raw: dict[str, Any]) -> None:
    """Walk the fixed part of the tree, storing leaf values by dotted key."""
    known = _CHILDREN[prefix]
    for name, value in section.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if not isinstance(name, str) or name not in known:
            raise Invalid(key, "unknown key" + _suggest(name, known))
        if key in _BY_KEY:
            raw[key] = value
        else:
            _collect(_mapping(value, key), key, raw)


def _suggest(name: object, known: tuple[str, ...]) -> str:
    text = f"; known keys here: {', '.join(known)}"
    if isinstance(name, str):
        import difflib  # error path only

        close = difflib.get_close_matches(name, known, n=1)
        if close:
            return f" (did you mean {close[0]}?)" + text
    return text


def _build(v: Mapping[str, Any], source: str | None) -> Config:
    opts = CpuManagerOptions(
        **{name.replace("-", "_"): v[f"cpu_manager.options.{name}"] for name in CPU_MANAGER_OPTIONS}
    )
    return Config(
        policy=v["policy"],
        scope=v["scope"],
        policy_options=v["policy_options"],
        cpu_manager=CpuManagerConfig(
            options=opts,
            reserved_cpus=v["cpu_manager.reserved_cpus"],
            num_reserved_cpus=v["cpu_manager.num_reserved_cpus"],
        ),
        reserved_memory=v["reserved_memory"],
        devices=v["devices"],
        inference=InferenceConfig(
            guaranteed_cpus=v["inference.guaranteed_cpus"],
            hugepages=v["inference.hugepages"],
            device_plugin_env=v["inference.device_plugin_env"],
        ),
        sysfs_root=v["sysfs_root"],
        proc_root=v["proc_root"],
        cgroup_root=v["cgroup_root"],
        state_dir=v["state_dir"],
        kubelet_root=v["kubelet_root"],
        lock_timeout_s=v["lock_timeout_s"],
        syslog=v["syslog"],
        source=source,
    )


# ---- rendering ---------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z/][-A-Za-z0-9_./]*")
_YAML_WORDS = frozenset(("y", "n", "yes", "no", "on", "off", "true", "false", "null", "none"))


def yaml_scalar(value: Any) -> str:
    """``value`` as a YAML flow scalar (defaults only: null, bool, number, string, {})."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
            return value
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping) and not value:
        return "{}"
    raise TypeError(f"no YAML rendering for {value!r}")


def sample_yaml() -> str:
    """The commented sample configuration (``packaging/config.yaml``): every key, its default."""
    lines = [
        "# numa-pin configuration: /etc/numa-pin/config.yaml",
        "#",
        "# Every key is listed with its built-in default; delete what you do not change.",
        "# Precedence: numa-pin --config PATH, then $NUMA_PIN_CONFIG, then this file,",
        "# then the built-in defaults. Unknown keys and bad values are errors.",
        "# Generated from numa_pin.config.schema.ITEMS; see docs/ledger-config.md.",
    ]
    _render_section("", 0, lines)
    return "\n".join(lines) + "\n"


def _render_section(prefix: str, depth: int, lines: list[str]) -> None:
    indent = "  " * depth
    for name in _CHILDREN[prefix]:
        key = f"{prefix}.{name}" if prefix else name
        item = _BY_KEY.get(key)
        if item is None:
            if depth == 0:
                lines.append("")
            lines.append(f"{indent}{name}:")
            _render_section(key, depth + 1, lines)
            continue
        if depth == 0:
            lines.append("")
        for text_line in _wrap(f"{item.meaning} Type: {item.type}.", 88 - len(indent)):
            lines.append(f"{indent}# {text_line}")
        lines.append(f"{indent}{name}: {yaml_scalar(item.default)}")
        if item.example:
            lines.append(f"{indent}# Example:")
            lines.extend(f"{indent}#   {ex}" for ex in item.example.splitlines())


def _wrap(text: str, width: int) -> list[str]:
    out: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out


def reference_table() -> str:
    """The key table in Markdown (name, type, default, meaning) for the docs."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for item in ITEMS:
        meaning = item.meaning.replace("|", "\\|")
        rows.append(f"| `{item.key}` | {item.type} | `{yaml_scalar(item.default)}` | {meaning} |")
    return "\n".join(rows) + "\n"


__all__ = [
    "CPU_MANAGER_OPTIONS",
    "ITEMS",
    "POLICIES",
    "POLICY_OPTIONS",
    "SCOPES",
    "SELECTOR_KEYS",
    "Config",
    "ConfigItem",
    "CpuManagerConfig",
    "CpuManagerOptions",
    "DeviceSelector",
    "InferenceConfig",
    "config_from_dict",
    "reference_table",
    "sample_yaml",
]
