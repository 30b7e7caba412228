"""The names kubelet gives Topology Manager policies and scopes and its CPU manager's checkpoint,
in one place. Imports nothing.

Every module that accepts, prints or compares a policy or scope name takes it from here: the
policy registry, the config schema, annotation parsing, the CLI and the reference merge.
"""

from __future__ import annotations

NONE = "none"
BEST_EFFORT = "best-effort"
RESTRICTED = "restricted"
SINGLE_NUMA_NODE = "single-numa-node"
#: kubelet's ``topologyManagerPolicy`` values, in kubelet's documentation order
POLICIES = (NONE, BEST_EFFORT, RESTRICTED, SINGLE_NUMA_NODE)

CONTAINER_SCOPE = "container"
POD_SCOPE = "pod"
#: kubelet's ``topologyManagerScope`` values
SCOPES = (CONTAINER_SCOPE, POD_SCOPE)

#: numa-pin's node defaults when the config names none
DEFAULT_POLICY = BEST_EFFORT
DEFAULT_SCOPE = CONTAINER_SCOPE

#: kubelet's CPU manager checkpoint, in kubelet's root directory (``/var/lib/kubelet``)
CPU_MANAGER_CHECKPOINT = "cpu_manager_state"

__all__ = [
    "BEST_EFFORT",
    "CONTAINER_SCOPE",
    "CPU_MANAGER_CHECKPOINT",
    "DEFAULT_POLICY",
    "DEFAULT_SCOPE",
    "NONE",
    "POD_SCOPE",
    "POLICIES",
    "RESTRICTED",
    "SCOPES",
    "SINGLE_NUMA_NODE",
]
