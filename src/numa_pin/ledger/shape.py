"""The shape checks of the ledger's values (pure): what :mod:`numa_pin.ledger.model`'s records
accept at construction (:class:`ValueError`) and what ``from_dict`` accepts from a file
(:class:`~numa_pin.errors.LedgerCorrupt`), and the frozen forms they keep.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from numa_pin.base.cpuset import parse_list
from numa_pin.errors import LedgerCorrupt
from numa_pin.ledger.migrate import MAX_RECORD_DEPTH

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any, TypeGuard, TypeVar

    V = TypeVar("V")


def set_field(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def copy_of(mapping: Mapping[str, V]) -> dict[str, V]:
    """A dict of a state's ``mapping``: a MappingProxyType's ``copy()`` is its dict's fast copy,
    where ``dict(proxy)`` goes key by key (ten times slower: a busy node's ledger has thousands)."""
    return mapping.copy() if isinstance(mapping, MappingProxyType) else dict(mapping)


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def require_str(name: str, value: object, *, nonempty: bool = False) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    if nonempty and not value:
        raise ValueError(f"{name} must not be empty")


def finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def id_set(name: str, values: Iterable[int]) -> frozenset[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a set of ids, got {type(values).__name__}")
    out = frozenset(values)
    if not all(is_int(i) and i >= 0 for i in out):
        raise ValueError(f"{name} must hold non-negative integers, got {sorted(out, key=str)!r}")
    return out


def device_map(devices: object) -> Mapping[str, tuple[str, ...]]:
    if not isinstance(devices, Mapping):
        raise ValueError(f"devices must be a mapping, got {type(devices).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for res, ids in devices.items():
        require_str("devices resource name", res, nonempty=True)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(f"devices[{res!r}] must be a list of device ids")
        tup = tuple(ids)
        for dev in tup:
            require_str(f"devices[{res!r}] entry", dev, nonempty=True)
        out[res] = tup
    return MappingProxyType(out)


def memory_map(memory: object) -> Mapping[str, Mapping[int, int]]:
    if not isinstance(memory, Mapping):
        raise ValueError(f"memory must be a mapping, got {type(memory).__name__}")
    out: dict[str, Mapping[int, int]] = {}
    for res, per_node in memory.items():
        require_str("memory resource name", res, nonempty=True)
        if not isinstance(per_node, Mapping):
            raise ValueError(f"memory[{res!r}] must map NUMA node -> bytes")
        inner: dict[int, int] = {}
        for node, size in per_node.items():
            if not (is_int(node) and node >= 0 and is_int(size) and size >= 0):
                raise ValueError(f"memory[{res!r}] must map node id -> bytes, got {node!r}: {size!r}")
            inner[node] = size
        out[res] = MappingProxyType(inner)
    return MappingProxyType(out)


def netdev_entries(netdevs: object) -> tuple[Mapping[str, Any], ...]:
    if isinstance(netdevs, (str, bytes, Mapping)) or not isinstance(netdevs, Iterable):
        raise ValueError("netdevs must be a sequence of records")
    out = []
    for rec in netdevs:
        if not isinstance(rec, Mapping) or not all(
            isinstance(k, str) and (isinstance(v, Mapping) if k == "record" else isinstance(v, str))
            for k, v in rec.items()
        ):
            raise ValueError(f"netdevs records must map strings to strings (\"record\": to an undo record, "
                             f"a JSON object), got {rec!r}")
        out.append(MappingProxyType({k: undo_record(f"netdevs {k}", v) if k == "record" else v
                                     for k, v in rec.items()}))
    return tuple(out)


def undo_record(name: str, value: object, depth: int = 1) -> Mapping[str, Any]:
    """A netdev undo record: a JSON object (string keys; strings, numbers, booleans, nulls,
    lists and objects, at most :data:`MAX_RECORD_DEPTH` deep), frozen."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    if depth > MAX_RECORD_DEPTH:
        raise ValueError(f"{name} nests more than {MAX_RECORD_DEPTH} levels")
    return MappingProxyType({k: json_value(name, v, depth) for k, v in value.items()})


def json_value(name: str, value: object, depth: int) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, Mapping):
        return undo_record(name, value, depth + 1)
    if isinstance(value, (list, tuple)):
        return tuple(json_value(name, v, depth + 1) for v in value)
    raise ValueError(f"{name} holds a {type(value).__name__}, not a JSON value")


def plain(value: Any) -> Any:
    """A frozen record as plain JSON-ready dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


#: the isolation knobs a grant may record (:mod:`numa_pin.requests.isolation` checks the values)
ISOLATION_KNOBS = frozenset(("load_balancing", "quota", "irq", "c_states", "governor", "host", "shared"))
#: the knobs recorded as a bool (the others are short strings)
_BOOL_KNOBS = frozenset(("host", "shared"))


def isolation_map(knobs: object) -> Mapping[str, Any]:
    """A grant's isolation knobs: knob name -> a short string (``host`` and ``shared``: a bool)."""
    if not isinstance(knobs, Mapping):
        raise ValueError(f"isolation must be a mapping, got {type(knobs).__name__}")
    for key, value in knobs.items():
        if key not in ISOLATION_KNOBS:
            raise ValueError(f"isolation: unknown knob {key!r}")
        if not (isinstance(value, bool) if key in _BOOL_KNOBS else isinstance(value, str) and 0 < len(value) <= 64):
            raise ValueError(f"isolation.{key} has a bad value {value!r}")
    return MappingProxyType(dict(knobs))


#: the VF settings a grant may record, and their JSON types (:mod:`numa_pin.requests.vfconfig`
#: checks the values)
VF_SETTINGS: Mapping[str, type] = MappingProxyType({
    "vlan": int, "vlanQoS": int, "mac": str, "spoofchk": bool, "trust": bool, "min_tx_rate": int,
    "max_tx_rate": int, "link_state": str,
})


def vf_config_map(settings: object) -> Mapping[str, Any]:
    """A grant's VF settings: sriov-cni's name -> an int, bool or short string."""
    if not isinstance(settings, Mapping):
        raise ValueError(f"vf_config must be a mapping, got {type(settings).__name__}")
    for key, value in settings.items():
        kind = VF_SETTINGS.get(key)
        if kind is None:
            raise ValueError(f"vf_config: unknown setting {key!r}")
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not ok or (kind is int and not 0 <= value < 1 << 32) or (kind is str and not 0 < len(value) <= 64):
            raise ValueError(f"vf_config.{key} has a bad value {value!r}")
    return MappingProxyType(dict(settings))


def strings(name: str, values: object) -> tuple[str, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list of strings, got {type(values).__name__}")
    out = tuple(values)
    if not all(isinstance(v, str) for v in out):
        raise ValueError(f"{name} must hold strings, got {out!r}")
    return out


def exact_keys(what: str, d: object, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise LedgerCorrupt(f"{what} must be a JSON object, got {type(d).__name__}")
    missing = keys - d.keys()
    extra = d.keys() - keys
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(sorted(missing))}")
        if extra:
            parts.append(f"unknown {', '.join(sorted(map(str, extra)))}")
        raise LedgerCorrupt(f"{what}: {'; '.join(parts)}")
    return d


def json_field(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    value = obj[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise LedgerCorrupt(f"{where}: {key} has the wrong type (bool)")
    if not isinstance(value, types):
        raise LedgerCorrupt(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def as_dict(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LedgerCorrupt(f"{where}: memory entries must be objects")
    return value


def node_key(key: str) -> int:
    if not (key.isascii() and key.isdigit()) or str(int(key)) != key:
        raise ValueError(f"memory node id {key!r} is not a non-negative integer")
    return int(key)


def opt_list(text: str | None) -> frozenset[int] | None:
    return None if text is None else parse_list(text)


__all__ = [
    "as_dict",
    "copy_of",
    "device_map",
    "exact_keys",
    "finite",
    "id_set",
    "is_int",
    "json_field",
    "json_value",
    "memory_map",
    "netdev_entries",
    "node_key",
    "opt_list",
    "plain",
    "require_str",
    "set_field",
    "strings",
    "undo_record",
]
