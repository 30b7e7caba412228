"""kubelet's CPU and memory manager policies, from its config file and its state files.

Under the ``static`` policy, kubelet's CPU manager hands out exclusive CPUs, and under
``Static`` its memory manager hands out the memory of NUMA nodes; numa-pin's NRI plugin hands
out the same CPUs and nodes, and neither allocator sees the other's grants. So ``numa-pin serve
--nri`` does not start beside either (:func:`refuse_static`, ``docs/kubernetes.md``), unless
the operator says so (``--allow-kubelet-static``: numa-pin then handles only what kubelet does
not, and the operator keeps the two apart).

Where kubelet says its policy (each file is optional: a missing one says nothing):

* its config file, a ``KubeletConfiguration`` (YAML or JSON; kubeadm writes
  ``<kubelet root>/config.yaml``): ``cpuManagerPolicy`` (``none`` unless set, or ``static``) and
  ``memoryManagerPolicy`` (``None`` unless set, or ``Static``);
* its state files ``<kubelet root>/cpu_manager_state`` and ``<kubelet root>/memory_manager_state``
  (JSON checkpoints): ``policyName``. kubelet keeps them across restarts and refuses to start
  when one disagrees with its config, so a static state file means a static manager too.

Policy names are compared without case (kubelet writes ``static`` and ``Static``). A file that
exists but cannot be read or is not what kubelet writes is a :class:`KubeletError` naming it:
numa-pin cannot tell, and does not guess. Not on the hook's path (it imports yaml).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import yaml

from numa_pin.base.boundedio import json_loads_bounded, read_regular_file
from numa_pin.base.record import record
from numa_pin.base.text import one_line, quote
from numa_pin.errors import KubeletConflictError, KubeletError

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
CONFIG = "config.yaml"
CPU_STATE, MEMORY_STATE = "cpu_manager_state", "memory_manager_state"
#: kubelet's config and checkpoints are a few KiB; a memory checkpoint of many pods is larger
MAX_BYTES = 4 << 20
STATIC = "static"


@record
class ManagerPolicy:
    """One manager's policy as one file says it. ``manager``: ``"CPU"`` or ``"memory"``;
    ``key``: the config key or the state file's ``policyName``."""

    manager: str
    policy: str
    path: str
    key: str

    @property
    def static(self) -> bool:
        return self.policy.lower() == STATIC


#: manager -> (its config key, its state file, what it hands out, the config that turns it off)
MANAGERS = {
    "CPU": ("cpuManagerPolicy", CPU_STATE, "exclusive CPUs", "cpuManagerPolicy: none"),
    "memory": ("memoryManagerPolicy", MEMORY_STATE, "the memory of NUMA nodes", "memoryManagerPolicy: None"),
}


def config_path(kubelet_root: str = DEFAULT_KUBELET_ROOT) -> str:
    """kubelet's config file as kubeadm places it under ``kubelet_root``."""
    return os.path.join(kubelet_root, CONFIG)


def _read(path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist. Raises KubeletError naming it."""
    try:
        return read_regular_file(path, MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise KubeletError(f"cannot read kubelet's file: {exc.strerror or exc}", path=path) from exc
    except ValueError as exc:  # not a regular file, or too large
        raise KubeletError(f"cannot read kubelet's file: {one_line(exc)}", path=path) from exc


def read_config(path: str) -> list[ManagerPolicy]:
    """The policies kubelet's config file ``path`` sets (none when it does not exist).
    Raises KubeletError naming the file: not YAML, not a mapping, a policy that is not a string."""
    data = _read(path)
    if data is None:
        return []
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise KubeletError(f"not kubelet's config (not YAML: {one_line(str(exc).splitlines()[0])})",
                           path=path) from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise KubeletError("not kubelet's config (not a mapping)", path=path)
    out = []
    for manager, (key, *_rest) in MANAGERS.items():
        value = doc.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise KubeletError(f"not kubelet's config ({key} is {quote(value)}, not a string)", path=path)
        out.append(ManagerPolicy(manager, value, path, key))
    return out


def read_state(path: str, manager: str) -> ManagerPolicy | None:
    """The policy of ``manager``'s state file ``path`` (None when it does not exist). Raises
    KubeletError naming the file: not JSON, not an object, no ``policyName`` string."""
    data = _read(path)
    if data is None:
        return None
    try:
        doc = json_loads_bounded(data)
    except ValueError as exc:
        raise KubeletError(f"not kubelet's {manager} manager state (not JSON: {one_line(exc)})", path=path) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("policyName"), str):
        raise KubeletError(f"not kubelet's {manager} manager state (no policyName)", path=path)
    return ManagerPolicy(manager, doc["policyName"], path, "policyName")


def _each(kubelet_root: str, kubelet_config: str | None) -> Iterator[ManagerPolicy]:
    """The policies the config and then each state file say, read one file at a time."""
    yield from read_config(kubelet_config or config_path(kubelet_root))
    for manager, (_key, state, *_rest) in MANAGERS.items():
        found = read_state(os.path.join(kubelet_root, state), manager)
        if found is not None:
            yield found


def policies(kubelet_root: str = DEFAULT_KUBELET_ROOT, kubelet_config: str | None = None) -> list[ManagerPolicy]:
    """Every policy kubelet's config (``kubelet_config``, default :func:`config_path`) and its
    state files under ``kubelet_root`` say, config first. Raises KubeletError (see above)."""
    return list(_each(kubelet_root, kubelet_config))


def conflict(found: ManagerPolicy) -> str:
    """Why a static manager and numa-pin do not mix, and how kubelet's side is turned off."""
    _key, state, what, off = MANAGERS[found.manager]
    return (f"kubelet's {found.manager} manager runs the {found.policy} policy ({found.key}): kubelet and numa-pin "
            f"would both hand out {what}; set {off} in kubelet's config and remove {state}")


def refuse_static(kubelet_root: str = DEFAULT_KUBELET_ROOT, kubelet_config: str | None = None,
                  override: str = "--allow-kubelet-static") -> None:
    """Raise :class:`KubeletConflictError` (one line naming the file) when kubelet's CPU or
    memory manager is static, and :class:`KubeletError` when a file cannot be read (numa-pin
    cannot tell); both lines name ``override``, what starts numa-pin anyway."""
    anyway = f"or start with {override} when numa-pin handles only what kubelet does not"
    try:
        for one in _each(kubelet_root, kubelet_config):  # a static manager is said before a later unreadable file
            if one.static:
                raise KubeletConflictError(f"{conflict(one)}, {anyway}", path=one.path)
    except KubeletConflictError:
        raise
    except KubeletError as exc:
        reason = str(exc).removeprefix(f"{exc.path}: ")
        raise KubeletError(f"{reason}: numa-pin cannot tell whether kubelet's CPU or memory manager is static; "
                           f"fix the file, {anyway}", path=exc.path) from exc


def static_warnings(kubelet_root: str = DEFAULT_KUBELET_ROOT, kubelet_config: str | None = None,
                    override: str = "--allow-kubelet-static") -> list[str]:
    """What :func:`refuse_static` would refuse, as warning lines for a start the operator
    allowed with ``override`` (empty: nothing to warn about). Never raises."""
    lines = []
    try:
        for one in _each(kubelet_root, kubelet_config):
            if one.static:
                lines.append(f"numa-pin: warning: {one.path}: {conflict(one)}; started anyway ({override})")
    except KubeletError as exc:
        lines.append(f"numa-pin: warning: {exc}; started anyway ({override})")
    return lines


__all__ = ["CONFIG", "CPU_STATE", "DEFAULT_KUBELET_ROOT", "MANAGERS", "MEMORY_STATE", "ManagerPolicy", "config_path",
           "conflict", "policies", "read_config", "read_state", "refuse_static", "static_warnings"]
