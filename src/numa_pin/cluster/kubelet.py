"""Living next to kubelet: detect its CPU manager's static policy from its checkpoint.

kubelet's CPU manager records its state in ``<kubelet root>/cpu_manager_state`` (JSON)::

    {"policyName": "static", "defaultCpuSet": "0,7-63",
     "entries": {"<pod uid>": {"<container>": "1-6"}}, "checksum": 2434113410}

(older kubelets keyed ``entries`` by container id with the cpuset as value). With
``policyName: static`` kubelet hands out exclusive CPUs itself, and numa-pin on the same node
would hand out the same CPUs again: the two allocators do not see each other. numa-pin then
says so in ``numa-pin status`` and as one warning line at each admission of the hook; it never
rejects a container because of it (``numa-pin serve --nri`` refuses to start instead:
:mod:`numa_pin.cluster.kubeletpolicy`). Supported setups (docs/kubernetes.md, "Living next to kubelet"): kubelet with
``cpuManagerPolicy: none`` and numa-pin owning alignment, or numa-pin only for workloads
kubelet does not run.

:func:`parse_cpu_manager_state` is pure; :func:`read_cpu_manager_state` reads the file; only
:mod:`os`, :mod:`json` and :mod:`numa_pin.base.cpuset` are imported (this runs on the hook path).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from numa_pin.base import names
from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.base.record import field, record

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
CHECKPOINT = names.CPU_MANAGER_CHECKPOINT
STATIC = "static"
#: the checkpoint is a few KiB; refuse to read something much larger
MAX_BYTES = 4 << 20


@record
class CpuManagerState:
    """kubelet's CPU manager checkpoint. ``exclusive``: ``"<pod>/<container>"`` (or the
    container id of the old format) -> its exclusive CPUs."""

    path: str
    policy: str
    default_cpus: frozenset[int] | None = None
    exclusive: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def static(self) -> bool:
        return self.policy == STATIC

    def exclusive_cpus(self) -> frozenset[int]:
        out: set[int] = set()
        for cpus in self.exclusive.values():
            out |= cpus
        return frozenset(out)


def checkpoint_path(kubelet_root: str = DEFAULT_KUBELET_ROOT) -> str:
    return os.path.join(kubelet_root, CHECKPOINT)


def _cpus(value: object, where: str) -> frozenset[int]:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a cpuset string, got {type(value).__name__}")
    try:
        return parse_list(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def parse_cpu_manager_state(text: str, path: str) -> CpuManagerState:
    """The checkpoint's content. Raises ValueError naming what is wrong (not JSON, no
    ``policyName``, a cpuset that does not parse)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("policyName"), str):
        raise ValueError("no policyName")
    default = doc.get("defaultCpuSet")
    default_cpus = _cpus(default, "defaultCpuSet") if default not in (None, "") else None
    entries = doc.get("entries")
    entries = {} if entries is None else entries
    if not isinstance(entries, dict):
        raise ValueError("entries is not an object")
    exclusive: dict[str, frozenset[int]] = {}
    for key, value in entries.items():
        if isinstance(value, dict):  # v2: pod uid -> container name -> cpuset
            for name, cpus in value.items():
                exclusive[f"{key}/{name}"] = _cpus(cpus, f"entries.{key}.{name}")
        else:  # v1: container id -> cpuset
            exclusive[str(key)] = _cpus(value, f"entries.{key}")
    return CpuManagerState(path, doc["policyName"], default_cpus, exclusive)


def read_cpu_manager_state(kubelet_root: str = DEFAULT_KUBELET_ROOT) -> CpuManagerState | None:
    """The checkpoint under ``kubelet_root``, or None when there is none (no kubelet).

    Raises:
        OSError: the file exists but cannot be read.
        ValueError: it is not a CPU manager checkpoint (see :func:`parse_cpu_manager_state`).
    """
    path = checkpoint_path(kubelet_root)
    try:
        with open(path, encoding="utf-8") as fp:
            text = fp.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    if len(text) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    return parse_cpu_manager_state(text, path)


def describe(kubelet_root: str = DEFAULT_KUBELET_ROOT) -> dict[str, object]:
    """What ``numa-pin status`` shows: ``{"checkpoint", "policy", "static",
    "exclusive_cpus", "containers", "error"}``; ``policy`` is None without a checkpoint."""
    path = checkpoint_path(kubelet_root)
    out: dict[str, object] = {"checkpoint": path, "policy": None, "static": False, "exclusive_cpus": "",
                              "containers": 0, "error": None}
    try:
        state = read_cpu_manager_state(kubelet_root)
    except (OSError, ValueError) as exc:
        out["error"] = str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
        return out
    if state is not None:
        out.update(policy=state.policy, static=state.static, exclusive_cpus=format_list(state.exclusive_cpus()),
                   containers=len(state.exclusive))
    return out


def conflict_warning(kubelet_root: str = DEFAULT_KUBELET_ROOT) -> str | None:
    """One line for stderr when kubelet's CPU manager runs the static policy here, else None.
    A checkpoint that cannot be read is not a conflict (nothing is known); never raises."""
    try:
        state = read_cpu_manager_state(kubelet_root)
    except (OSError, ValueError):
        return None
    if state is None or not state.static:
        return None
    held = state.exclusive_cpus()
    holding = f"holds CPUs {format_list(held)} for {len(state.exclusive)} container(s)" if held else "holds no CPUs yet"
    return (
        f"numa-pin: warning: kubelet's CPU manager runs the static policy ({state.path}; it {holding}): "
        "kubelet and numa-pin would both hand out exclusive CPUs; set cpuManagerPolicy: none "
        "or use numa-pin only for workloads kubelet does not run"
    )


__all__ = [
    "CHECKPOINT",
    "DEFAULT_KUBELET_ROOT",
    "CpuManagerState",
    "checkpoint_path",
    "conflict_warning",
    "describe",
    "parse_cpu_manager_state",
    "read_cpu_manager_state",
]
