"""Topology Manager policies: registry, scopes and the merge engine (pure).

``get_policy(name, options)`` returns one of :data:`POLICIES`; ``check_scope(name)`` validates a
scope name. The merge engine is :mod:`numa_pin.policy.merge` (``merge_hints`` is the one-call
entry); :mod:`numa_pin.policy.reference` is the brute-force oracle used by the tests.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.errors import PolicyError
from numa_pin.policy import best_effort, none, restricted, single_numa_node
from numa_pin.policy.base import NumaInfo, Policy
from numa_pin.policy.options import PolicyOptions, check_machine, parse_options

#: policy name -> class
POLICIES: dict[str, type[Policy]] = {
    none.NAME: none.NonePolicy,
    best_effort.NAME: best_effort.BestEffortPolicy,
    restricted.NAME: restricted.RestrictedPolicy,
    single_numa_node.NAME: single_numa_node.SingleNumaNodePolicy,
}

CONTAINER_SCOPE = "container"
POD_SCOPE = "pod"
#: kubelet's topology manager scopes
SCOPES = (CONTAINER_SCOPE, POD_SCOPE)


def get_policy(name: str, options: PolicyOptions | Mapping[str, str | bool | int] | None = None) -> Policy:
    """The policy called ``name`` with ``options`` (parsed when given as a raw mapping).

    Raises :class:`PolicyError`: ``unknown policy: "x"``, or an option error.
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise PolicyError(f'unknown policy: "{name}"')
    opts = options if isinstance(options, PolicyOptions) else parse_options(options)
    return cls(opts)


def check_scope(name: str) -> str:
    """Return ``name`` if it is a scope; raises :class:`PolicyError` ``unknown scope: "x"``."""
    if name not in SCOPES:
        raise PolicyError(f'unknown scope: "{name}"')
    return name


__all__ = [
    "CONTAINER_SCOPE",
    "POD_SCOPE",
    "POLICIES",
    "SCOPES",
    "NumaInfo",
    "Policy",
    "PolicyOptions",
    "check_machine",
    "check_scope",
    "get_policy",
    "parse_options",
]
