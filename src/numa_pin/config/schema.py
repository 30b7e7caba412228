"""The configuration schema: validate a parsed YAML/JSON document into a :class:`Config`.

The schema is spread over modules that each read in one sitting:

* :mod:`numa_pin.config.keys`: :data:`ITEMS`, the one table of keys with their types,
  built-in defaults (as written in YAML), meanings and parsers;
* :mod:`numa_pin.config.parse`: the value parsers and the vocabularies they accept;
* :mod:`numa_pin.config.model`: the frozen records (:class:`Config` and its sections);
* :mod:`numa_pin.config.render`: ``packaging/config.yaml`` and the docs' table;
* :class:`numa_pin.devices.selector.Selector`: device selectors, shared with the inventory.

This module holds :func:`config_from_dict`; code imports every other name from the module that
defines it, and the package :mod:`numa_pin.config` re-exports the public ones for users.

Validation is strict: an unknown key anywhere, a wrong type, a bad enum value, a bad
quantity, cpulist, resource name or selector value raises
:class:`numa_pin.errors.ConfigError` naming the dotted key (``cpu_manager.options.full-pcpus-only``,
``devices.intel.com/sriov_vf[0].pf_names[0]``) and the file. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base.cpuset import format_list
from numa_pin.config.keys import BY_KEY, CHILDREN, ITEMS, default
from numa_pin.config.model import Config, CpuManagerConfig, CpuManagerOptions, InferenceConfig, IsolationConfig
from numa_pin.config.parse import CPU_MANAGER_OPTIONS, Invalid, mapping, type_name
from numa_pin.errors import ConfigError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any


def config_from_dict(d: object, source: str | None = None) -> Config:
    """Validate a parsed YAML/JSON document into a :class:`Config`.

    ``None`` (an empty file) is the defaults. ``source`` names the file in errors.

    Raises:
        ConfigError: unknown key, wrong type, bad enum value, quantity, cpulist,
            resource name or selector value; the message names the dotted key and ``source``.
    """
    if d is None:
        d = {}
    if not isinstance(d, Mapping):
        raise ConfigError(f"the document must be a mapping of keys; got {type_name(d)}", path=source)
    raw: dict[str, Any] = {}
    try:
        _collect(d, "", raw)
        values = {item.key: item.parse(raw[item.key], item.key) if item.key in raw else default(item.key)
                  for item in ITEMS}
    except Invalid as exc:
        raise ConfigError(exc.message, key=exc.key, path=source) from None
    return _build(values, source, explicit=frozenset(raw))


def _collect(section: Mapping[Any, Any], prefix: str, raw: dict[str, Any]) -> None:
    """Walk the fixed part of the tree, storing leaf values by dotted key."""
    known = CHILDREN[prefix]
    for name, value in section.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if not isinstance(name, str) or name not in known:
            raise Invalid(key, "unknown key" + _suggest(name, known))
        if key in BY_KEY:
            raw[key] = value
        else:
            _collect(mapping(value, key), key, raw)


def _suggest(name: object, known: tuple[str, ...]) -> str:
    text = f"; known keys here: {', '.join(known)}"
    if isinstance(name, str):
        import difflib  # error path only

        close = difflib.get_close_matches(name, known, n=1)
        if close:
            return f" (did you mean {close[0]}?)" + text
    return text


def _build(v: Mapping[str, Any], source: str | None, explicit: frozenset[str]) -> Config:
    opts = CpuManagerOptions(
        **{name.replace("-", "_"): v[f"cpu_manager.options.{name}"] for name in CPU_MANAGER_OPTIONS}
    )
    reserved = v["cpu_manager.reserved_cpus"]
    num_reserved = _num_reserved(reserved, v["cpu_manager.num_reserved_cpus"],
                                 "cpu_manager.num_reserved_cpus" in explicit, source)
    return Config(
        **_leaves(v, ""),
        cpu_manager=CpuManagerConfig(options=opts, reserved_cpus=reserved, num_reserved_cpus=num_reserved),
        inference=InferenceConfig(**_leaves(v, "inference")),
        isolation=IsolationConfig(**_leaves(v, "isolation")),
        source=source,
    )


def _num_reserved(reserved: frozenset[int] | None, num: int, num_set: bool, source: str | None) -> int:
    """How many CPUs are reserved. kubelet derives the count from --reserved-cpus when it is
    given, and its static policy refuses a list whose size is not the count it was handed
    (``TestStaticPolicyStartWithResvList``); so a list wins over the default count, and a count
    written in the file that disagrees with the list is refused."""
    if reserved is None:
        return num
    if num_set and num != len(reserved):
        raise ConfigError(
            f"unable to reserve the required amount of CPUs (size of {format_list(reserved)} did not "
            f"equal {num}); remove num_reserved_cpus or make it the list's size",
            key="cpu_manager.reserved_cpus", path=source)
    return len(reserved)


def _leaves(v: Mapping[str, Any], section: str) -> dict[str, Any]:
    """The values of the keys directly under ``section`` ("" for the top level) that are not
    sections themselves, by name: the fields of that section's record."""
    dot = f"{section}." if section else ""
    return {name: v[dot + name] for name in CHILDREN[section] if dot + name in BY_KEY}

#: ``Config`` and ``ITEMS`` are also importable from here, where the hook and the service find them
__all__ = ["ITEMS", "Config", "config_from_dict"]
