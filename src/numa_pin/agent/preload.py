"""What the warm agent imports before its first fork, and how it notices an upgrade.

The parent imports :data:`PRELOAD` once; every forked child then starts with the hook's whole
import graph in memory. :func:`source_stamps` records the numa_pin sources as loaded and
:func:`changed_sources` tells the server when they changed on disk (an upgrade), so it sends
hooks back to run in-process until it is restarted.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping

from numa_pin.errors import AgentError

#: everything a hook can import, loaded before the first fork: what ``sys.modules`` showed after
#: in-process admissions, a rejection and a release, plus every function-level import of the
#: hook path (devices, GPUs, difflib for config errors).
#: Left out: pyroute2, which only SR-IOV moves import (in the child, ~20 ms) and which would
#: add some 250 modules to every fork; and ctypes, which only a GPU grant imports (in the forked
#: child that joins the container's mount namespace, Python 3.11 having no os.setns), with
#: platform (set_mempolicy's syscall number, only numa-pin run calls it).
#: tests/agent checks both halves of this.
PRELOAD: tuple[str, ...] = (
    "numa_pin.entry.hook",
    "numa_pin.hook.invoke",
    "numa_pin.hook.oci",
    "numa_pin.hook.admit",
    "numa_pin.hook.rootless",
    "numa_pin.hook.precreate",
    "numa_pin.hook.started",
    "numa_pin.entry.runcstage",
    "numa_pin.enforcer.devnodes",
    "numa_pin.enforcer.saved",
    "numa_pin.config.load",
    "numa_pin.config.schema",
    "numa_pin.service.node",
    "numa_pin.reporting.report",
    "numa_pin.base.text",
    "numa_pin.base.boundedio",
    "numa_pin.admission.decide",
    "numa_pin.admission.validate",
    "numa_pin.resources.cdi_map",
    "numa_pin.resources.nvidia",
    "numa_pin.resources.registry",
    "numa_pin.requests.request",
    "numa_pin.requests.colocate",
    "numa_pin.requests.vfconfig",
    "numa_pin.providers.cpu",
    "numa_pin.providers.memory",
    "numa_pin.providers.devices",
    "numa_pin.allocators.cpu",
    "numa_pin.allocators.cpu_distribute",
    "numa_pin.allocators.memory",
    "numa_pin.allocators.devices",
    "numa_pin.allocators.colocate",
    "numa_pin.devices.pcie",
    "numa_pin.enforcer.mempolicy",
    "numa_pin.resources.node.devnodes",
    "numa_pin.devices.inventory",
    "numa_pin.enforcer.gpu",
    "numa_pin.devices.devfilter",
    "numa_pin.enforcer.netdev",
    "numa_pin.enforcer.netns",
    "numa_pin.resources.node.vfjournal",
    "numa_pin.service.adopt",
    "numa_pin.topology.cache",
    "numa_pin.topology.discover",
    "numa_pin.topology.isolated",
    "numa_pin.policy.registry",
    "numa_pin.policy.none",
    "numa_pin.policy.best_effort",
    "numa_pin.policy.restricted",
    "numa_pin.policy.single_numa_node",
    "numa_pin.policy.options",
    "numa_pin.ledger.liveness",
    "numa_pin.ledger.journal",  # a busy node's ledger (from 64 KiB)
    "numa_pin.enforcer.systemd",
    "numa_pin.cluster.kubelet",
    "encodings.ascii",
    "encodings.utf_8_sig",
    "yaml",
    "syslog",
    "traceback",
    "difflib",
    "subprocess",  # systemctl, where systemd owns the containers' cgroups
    "hashlib",  # OpenSSL's SHA-256, for a busy node's ledger (numa_pin.base.digest)
    "resource",  # the descriptor limit, raised by the spare that holds shared cpusets open (enforcer.cgroups)
)


#: function-level imports of the hook path that :data:`PRELOAD` leaves out on purpose
NOT_PRELOADED = ("pyroute2", "pyroute2.netlink.exceptions", "ctypes", "platform")


def preload(names: Iterable[str] = PRELOAD) -> list[str]:
    """Import ``names``; return every module loaded afterwards. Raises NumaPinError naming a
    module that does not import (the hook would fail on it too)."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise AgentError(f"cannot preload {name}: {exc}") from exc
    return sorted(sys.modules)


def source_stamps(modules: Iterable[str]) -> dict[str, int]:
    """``{source file: st_mtime_ns}`` of the numa_pin modules among ``modules``."""
    stamps: dict[str, int] = {}
    for name in modules:
        if name != "numa_pin" and not name.startswith("numa_pin."):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            try:
                stamps[path] = os.stat(path).st_mtime_ns
            except OSError:
                stamps[path] = -1
    return stamps


def changed_sources(stamps: Mapping[str, int]) -> list[str]:
    """The files of ``stamps`` that changed (or vanished) since they were taken."""
    changed = []
    for path, mtime in stamps.items():
        try:
            now = os.stat(path).st_mtime_ns
        except OSError:
            now = -1
        if now != mtime:
            changed.append(path)
    return changed


__all__ = ["NOT_PRELOADED", "PRELOAD", "changed_sources", "preload", "source_stamps"]
