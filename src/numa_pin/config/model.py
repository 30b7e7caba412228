"""The typed configuration: frozen records (:mod:`numa_pin.base.record`) whose defaults come from the key table (pure).

``Config()`` is the built-in defaults (:data:`numa_pin.config.keys.ITEMS`). Build a
validated one with :func:`numa_pin.config.schema.config_from_dict` or ``load_config``;
direct construction trusts its arguments. Device selectors are
:class:`numa_pin.devices.selector.Selector`, the type the inventory uses
(``DeviceSelector`` is the same class under the name the config has always exported), and the
CPU manager's options :class:`numa_pin.config.cpu_options.CpuOptions` (``CpuManagerOptions``),
the record the CPU provider and allocators take.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base.cpuset import format_list
from numa_pin.base.record import field, fields, record
from numa_pin.config.cpu_options import CpuOptions
from numa_pin.config.keys import default
from numa_pin.devices.selector import Selector

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

#: the config's name for the one selector type
DeviceSelector = Selector


def _default_field(key: str) -> Any:
    return field(default_factory=lambda: default(key), hash=False)


#: the CPU manager's static-policy options: the record the CPU provider and allocators read
CpuManagerOptions = CpuOptions


@record
class CpuManagerConfig:
    """CPU manager settings. When ``reserved_cpus`` is set, parsing makes ``num_reserved_cpus`` its
    size, as kubelet derives it from ``--reserved-cpus``, and refuses a count written beside it
    that disagrees."""

    options: CpuManagerOptions = field(default_factory=CpuManagerOptions)
    reserved_cpus: frozenset[int] | None = _default_field("cpu_manager.reserved_cpus")
    num_reserved_cpus: int = _default_field("cpu_manager.num_reserved_cpus")


@record
class InferenceConfig:
    """What the hook may infer from an OCI spec without numa-pin annotations."""

    guaranteed_cpus: bool = _default_field("inference.guaranteed_cpus")
    guaranteed_cpus_outside_kubernetes: bool = _default_field("inference.guaranteed_cpus_outside_kubernetes")
    hugepages: bool = _default_field("inference.hugepages")
    device_plugin_env: bool = _default_field("inference.device_plugin_env")
    device_nodes: bool = _default_field("inference.device_nodes")
    strict_devices: bool = _default_field("inference.strict_devices")


@record
class IsolationConfig:
    """Node defaults of the isolation knobs (:mod:`numa_pin.requests.isolation`) for containers
    with exclusive CPUs, and how exclusive CPUs meet the kernel's isolated CPUs."""

    load_balancing: str | None = _default_field("isolation.load_balancing")
    quota: str | None = _default_field("isolation.quota")
    irq: str | None = _default_field("isolation.irq")
    c_states: str | None = _default_field("isolation.c_states")
    governor: str | None = _default_field("isolation.governor")
    exec_cpu_affinity: str | None = _default_field("isolation.exec_cpu_affinity")
    host: bool = _default_field("isolation.host")
    isolated_cpus: str = _default_field("isolation.isolated_cpus")
    shared_pool_isolated: bool = _default_field("isolation.shared_pool_isolated")


@record
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
    memory_tiers: Mapping[str, frozenset[int]] = _default_field("memory_tiers")
    devices: Mapping[str, tuple[Selector, ...]] = _default_field("devices")
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    sysfs_root: str = _default_field("sysfs_root")
    proc_root: str = _default_field("proc_root")
    dev_root: str = _default_field("dev_root")
    cdi_spec_dirs: tuple[str, ...] = _default_field("cdi_spec_dirs")
    cgroup_root: str = _default_field("cgroup_root")
    state_dir: str = _default_field("state_dir")
    kubelet_root: str = _default_field("kubelet_root")
    lock_timeout_s: float = _default_field("lock_timeout_s")
    admission_timeout_s: float = _default_field("admission_timeout_s")
    syslog: bool = _default_field("syslog")
    metrics_address: str | None = _default_field("metrics_address")
    resize_follow: str = _default_field("resize_follow")
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
            "memory_tiers": {name: format_list(nodes) for name, nodes in sorted(self.memory_tiers.items())},
            "devices": {name: [s.to_dict() for s in sels] for name, sels in sorted(self.devices.items())},
            "inference": _plain(self.inference),
            "isolation": _plain(self.isolation),
            "sysfs_root": self.sysfs_root,
            "proc_root": self.proc_root,
            "dev_root": self.dev_root,
            "cdi_spec_dirs": list(self.cdi_spec_dirs),
            "cgroup_root": self.cgroup_root,
            "state_dir": self.state_dir,
            "kubelet_root": self.kubelet_root,
            "lock_timeout_s": self.lock_timeout_s,
            "admission_timeout_s": self.admission_timeout_s,
            "syslog": self.syslog,
            "metrics_address": self.metrics_address,
            "resize_follow": self.resize_follow,
        }


def _plain(section: InferenceConfig | IsolationConfig) -> dict[str, Any]:
    """A section of plain values in its YAML/JSON form: every field by name."""
    return {f.name: getattr(section, f.name) for f in fields(section)}


__all__ = [
    "Config",
    "CpuManagerConfig",
    "CpuManagerOptions",
    "DeviceSelector",
    "InferenceConfig",
    "IsolationConfig",
]
