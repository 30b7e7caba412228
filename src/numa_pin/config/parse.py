"""Value parsers of the configuration: (raw YAML value, dotted key) -> typed value (pure).

Each parser validates one value and returns it in the type :mod:`numa_pin.config.model`
holds, or raises :class:`Invalid` naming the dotted key; :func:`numa_pin.config.schema.config_from_dict`
turns that into :class:`~numa_pin.errors.ConfigError` with the file. The vocabularies the
parsers accept (policies, scopes, option names) are here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

from numa_pin.base import names
from numa_pin.base.cpuset import parse_list
from numa_pin.base.quantity import format_bytes, parse_bytes
from numa_pin.devices.selector import Selector, check_resource_name, parse_selector
from numa_pin.errors import ConfigError, RequestError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any, TypeGuard

POLICIES = names.POLICIES
SCOPES = names.SCOPES
#: Topology Manager policy options numa-pin knows (kubelet names)
#: ``resize_follow`` values: write the ledger's CPUs back, or take a valid runtime resize as one
RESIZE_FOLLOW = ("reassert", "adopt")
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

#: isolation vocabulary (CRI-O's annotation values; :mod:`numa_pin.requests.isolation`)
DISABLE, ENABLE, HOUSEKEEPING = "disable", "enable", "housekeeping"
MAX_LATENCY = "max_latency:"
#: the largest resume latency one may name, in microseconds (the kernel's PM QoS values are s32)
MAX_LATENCY_US = (1 << 31) - 1
#: a governor name as the kernel spells them (``performance``, ``schedutil``); bounded
MAX_GOVERNOR_LEN = 15
#: where a container's exec'd processes run: on the first of its exclusive CPUs (CRI-O's
#: ``exec_cpu_affinity = "first"``), or wherever the runtime puts them (``default``: nothing written)
EXEC_FIRST, EXEC_DEFAULT = "first", "default"
#: where exclusive CPUs go relative to the kernel's isolated (isolcpus, nohz_full) CPUs
ISOLATED_CPUS = ("prefer", "require", "avoid")

# Go strconv.ParseBool
_GO_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_GO_FALSE = frozenset(("0", "f", "F", "FALSE", "false", "False"))


class Invalid(Exception):
    """A value failed validation; ``config_from_dict`` turns it into :class:`ConfigError`."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def enum_of(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def parse(value: Any, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise Invalid(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    return parse


def boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(key, f"must be true or false; got {value!r} ({type_name(value)})")
    return value


def boolish(value: Any, key: str) -> bool:
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


def abs_path(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise Invalid(key, f"must be an absolute path; got {value!r}")
    return value


def split_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` as (host, port); raises ValueError (pure)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in " /[]"):
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host, int(port)


def listen_address(value: Any, key: str) -> str | None:
    """``null`` (off) or ``HOST:PORT`` (``[IPV6]:PORT``), e.g. ``127.0.0.1:9464``."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 300:
        raise Invalid(key, f"must be HOST:PORT or null; got {value!r} ({type_name(value)})")
    try:
        split_address(value)
    except ValueError:
        raise Invalid(key, f"must be HOST:PORT (e.g. 127.0.0.1:9464) or null; got {value!r}") from None
    return value


def abs_paths(value: Any, key: str) -> tuple[str, ...]:
    """A list of at most 16 absolute paths."""
    if not isinstance(value, list) or len(value) > 16:
        raise Invalid(key, f"must be a list of at most 16 absolute paths; got {type_name(value)}")
    return tuple(abs_path(v, key) for v in value)


def seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(key, f"must be a number of seconds; got {value!r} ({type_name(value)})")
    if not math.isfinite(value) or value < 0 or value > 3600:
        raise Invalid(key, f"must be between 0 and 3600 seconds; got {value!r}")
    return float(value)


def count(value: Any, key: str) -> int:
    if not _is_int(value) or value < 0:
        raise Invalid(key, f"must be a non-negative integer; got {value!r} ({type_name(value)})")
    return value


def cpulist(value: Any, key: str) -> frozenset[int] | None:
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
        shown = value if len(value) <= 60 else value[:60] + "..."  # the message stays one short line
        raise Invalid(key, f"bad cpulist {shown!r}: {exc}") from None


def memory_tiers(value: Any, key: str) -> Mapping[str, frozenset[int]]:
    """``{tier name: NUMA node list}`` (``{"cxl": "2-3"}``): at most 16 tiers."""
    out: dict[str, frozenset[int]] = {}
    for name, nodes in mapping(value, key).items():
        where = child_key(key, name)
        if not isinstance(name, str) or not name or len(name) > 63 or not name.replace("-", "").isalnum():
            raise Invalid(where, "a tier name is 1-63 letters, digits or '-'")
        parsed = cpulist(nodes, where)
        if not parsed:
            raise Invalid(where, "must name at least one NUMA node")
        out[name] = parsed
    if len(out) > 16:
        raise Invalid(key, "at most 16 tiers")
    return out


def mapping(value: Any, key: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Invalid(key, f"must be a mapping; got {type_name(value)}")
    return value


def child_key(key: str, name: object) -> str:
    if not isinstance(name, (str, int)) or isinstance(name, bool):
        raise Invalid(key, f"keys must be strings; got {name!r}")
    return f"{key}.{name}"


def policy_options(value: Any, key: str) -> Mapping[str, str | bool | int]:
    out: dict[str, str | bool | int] = {}
    for name, raw in mapping(value, key).items():
        sub = child_key(key, name)
        if name not in POLICY_OPTIONS:
            raise Invalid(sub, f"unknown policy option; known: {', '.join(POLICY_OPTIONS)}")
        if not isinstance(raw, (str, bool, int)):
            raise Invalid(sub, f"must be a string, boolean or integer; got {raw!r} ({type_name(raw)})")
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


def reserved_memory(value: Any, key: str) -> Mapping[int, Mapping[str, int]]:
    out: dict[int, Mapping[str, int]] = {}
    for name, per_node in mapping(value, key).items():
        node = _node_id(name, key)
        node_key = f"{key}.{name}"
        if node in out:
            raise Invalid(node_key, f"NUMA node {node} is listed twice")
        resources: dict[str, int] = {}
        for res_name, amount in mapping(per_node, node_key).items():
            res = _memory_resource(res_name, node_key)
            res_key = f"{node_key}.{res_name}"
            if res in resources:
                raise Invalid(res_key, f"{res} is listed twice for node {node}")
            resources[res] = _quantity(amount, res_key)
        out[node] = MappingProxyType(resources)
    return MappingProxyType(out)


def devices(value: Any, key: str) -> Mapping[str, tuple[Selector, ...]]:
    """Resource name -> its selectors (:func:`numa_pin.devices.selector.parse_selector`)."""
    out: dict[str, tuple[Selector, ...]] = {}
    for name, selectors in mapping(value, key).items():
        sub = child_key(key, name)
        try:
            check_resource_name(name, sub)
            if not isinstance(selectors, list) or not selectors:
                raise Invalid(sub, f"must be a non-empty list of selectors; got {type_name(selectors)}")
            out[name] = tuple(parse_selector(sel, f"{sub}[{i}]") for i, sel in enumerate(selectors))
        except ConfigError as exc:
            raise Invalid(exc.key or sub, str(exc).removeprefix(f"{exc.key}: ")) from None
    return MappingProxyType(out)


def knob_value(knob: str, text: str) -> str | bool | None:
    """One isolation knob's value (an annotation's text, or the config's), as the request holds
    it: ``None`` is the knob's default (nothing asked); ``host`` is a bool, ``shared`` True or
    None; ``exec_cpu_affinity`` keeps ``default`` (an annotation's ``default`` overrides the
    node's ``first``). Raises ValueError with a one-line message."""
    value = text.strip()
    if knob in ("load_balancing", "quota"):
        return DISABLE if _one_of(value, (DISABLE, ENABLE)) == DISABLE else None
    if knob == "irq":
        choice = _one_of(value, (DISABLE, HOUSEKEEPING, ENABLE))
        return None if choice == ENABLE else choice
    if knob == "host":
        return _one_of(value, (DISABLE, ENABLE)) == DISABLE
    if knob == "shared":  # CRI-O's cpu-shared.crio.io says enable, numa-pin.io/cpu-shared true
        return True if _one_of(value, (ENABLE, "true", DISABLE, "false")) in (ENABLE, "true") else None
    if knob == "c_states":
        if value.startswith(MAX_LATENCY):
            number = value[len(MAX_LATENCY):]
            if not (number.isascii() and number.isdigit()) or len(number) > 10 or int(number) > MAX_LATENCY_US:
                raise ValueError(f"{value[:40]!r}: max_latency takes microseconds, 0 to {MAX_LATENCY_US}")
            return MAX_LATENCY + str(int(number))
        return _one_of(value, (ENABLE, DISABLE), MAX_LATENCY + "N")
    if knob == "exec_cpu_affinity":
        return _one_of(value, (EXEC_FIRST, EXEC_DEFAULT))
    if knob == "governor":
        if not value or len(value) > MAX_GOVERNOR_LEN or not all(c.isascii() and (c.isalnum() or c in "_-")
                                                                 for c in value):
            raise ValueError(f"{value[:40]!r} is not a cpufreq governor name")
        return value
    raise ValueError(f"unknown isolation knob {knob!r}")


def _one_of(value: str, allowed: tuple[str, ...], *more: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown value {value[:40]!r} (expected one of {', '.join(allowed + more)})")
    return value


def isolation_knob(knob: str) -> Callable[[Any, str], str | None]:
    """The config parser of one isolation knob's node default: null, or a value as the annotation takes."""
    def parse(value: Any, key: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise Invalid(key, f"must be null or a string; got {value!r} ({type_name(value)})")
        try:
            out = knob_value(knob, value)
        except ValueError as exc:
            raise Invalid(key, str(exc)) from None
        assert not isinstance(out, bool)
        return out

    return parse
