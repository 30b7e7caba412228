"""kubelet's CPU manager static-policy options (``StaticPolicyOptions``): the config's
``cpu_manager.options`` and what the CPU provider and allocators read (pure).

One record, :class:`CpuOptions` (the config exports it as ``CpuManagerOptions`` too), for the six
options of :data:`numa_pin.config.parse.CPU_MANAGER_OPTIONS`: their kubelet names, the pairs
kubelet refuses together, and kubelet's load-time checks against the machine.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base import names
from numa_pin.base.record import fields, record
from numa_pin.config.parse import CPU_MANAGER_OPTIONS
from numa_pin.errors import PolicyError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from numa_pin.topology.cpus import CpuTopology

#: kubelet's option names, keyed by :class:`CpuOptions` field
OPTION_NAMES = {name.replace("-", "_"): name for name in CPU_MANAGER_OPTIONS}

# pairs kubelet refuses together (NewStaticPolicyOptions), in its checking order
_INCOMPATIBLE = (
    ("full_pcpus_only", "distribute_cpus_across_cores"),
    ("distribute_cpus_across_numa", "distribute_cpus_across_cores"),
    ("prefer_align_cpus_by_uncorecache", "distribute_cpus_across_cores"),
    ("prefer_align_cpus_by_uncorecache", "distribute_cpus_across_numa"),
)

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


@record
class CpuOptions:
    """kubelet's ``StaticPolicyOptions``; unset is false, as in kubelet (and the config's
    defaults). Construct freely; :meth:`validate` before use."""

    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    distribute_cpus_across_cores: bool = False
    prefer_align_cpus_by_uncorecache: bool = False
    strict_cpu_reservation: bool = False
    align_by_socket: bool = False

    @classmethod
    def from_strings(cls, options: Mapping[str, str]) -> CpuOptions:
        """Parse kubelet-style ``{"full-pcpus-only": "true"}`` (Go ``ParseBool`` spellings).

        Raises :class:`~numa_pin.errors.PolicyError` for an unknown option, a value that is not
        a boolean, or an incompatible pair.
        """
        by_name = {v: k for k, v in OPTION_NAMES.items()}
        values: dict[str, bool] = {}
        for name, raw in options.items():
            if name not in by_name:
                known = ", ".join(sorted(by_name))
                raise PolicyError(f"unknown CPU manager policy option {name!r} (known: {known})")
            if raw in _TRUE:
                values[by_name[name]] = True
            elif raw in _FALSE:
                values[by_name[name]] = False
            else:
                raise PolicyError(f"CPU manager policy option {name}: {raw!r} is not a boolean")
        opts = cls(**values)
        opts.check_pairs()
        return opts

    def check_pairs(self) -> None:
        """Raise :class:`~numa_pin.errors.PolicyError` naming both options of a refused pair."""
        for a, b in _INCOMPATIBLE:
            if getattr(self, a) and getattr(self, b):
                raise PolicyError(
                    f"static policy options {OPTION_NAMES[a]} and {OPTION_NAMES[b]} "
                    "can not be used at the same time"
                )

    def validate(self, topology: CpuTopology, topology_policy_name: str) -> None:
        """All load-time checks of kubelet (pairs, then ``align-by-socket`` constraints).

        Raises :class:`~numa_pin.errors.PolicyError`.
        """
        self.check_pairs()
        if not self.align_by_socket:
            return
        if topology_policy_name == names.SINGLE_NUMA_NODE:
            raise PolicyError(
                f"topology manager policy {names.SINGLE_NUMA_NODE} is incompatible with "
                "CPU manager policy option align-by-socket"
            )
        if topology.num_sockets > topology.num_numa_nodes:
            raise PolicyError(
                "CPU manager policy option align-by-socket is not compatible with hardware "
                f"where sockets ({topology.num_sockets}) outnumber NUMA nodes "
                f"({topology.num_numa_nodes})"
            )

    def enabled(self) -> tuple[str, ...]:
        """kubelet names of the options that are on (for messages and reports)."""
        return tuple(OPTION_NAMES[f.name] for f in fields(self) if getattr(self, f.name))

    def as_kubelet(self) -> dict[str, bool]:
        """Option name (kubelet spelling) -> value, for every option."""
        return {name: getattr(self, field) for field, name in OPTION_NAMES.items()}


__all__ = ["OPTION_NAMES", "CpuOptions"]
