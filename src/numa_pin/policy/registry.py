"""The policy registry and the one-call merge. Pure code.

``get_policy(name, options)`` returns the policy of one of the names in :data:`POLICIES`;
``check_scope(name)`` validates a scope name; :func:`merge_hints` merges one container's provider
hints under a named policy. The names themselves are :mod:`numa_pin.base.names`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numa_pin.base import names
from numa_pin.errors import PolicyError
from numa_pin.policy.base import NumaInfo, Policy
from numa_pin.policy.hint import ProviderHints, TopologyHint
from numa_pin.policy.options import PolicyOptions, parse_options

POLICIES = names.POLICIES
SCOPES = names.SCOPES


def policy_class(name: str) -> type[Policy]:
    """The class of the policy called ``name``, imported when first asked for: a hook runs one
    policy, the node's, and need not load the others.

    Raises :class:`PolicyError` ``unknown policy: "x"``."""
    if name == names.NONE:
        from numa_pin.policy.none import NonePolicy

        return NonePolicy
    if name == names.BEST_EFFORT:
        from numa_pin.policy.best_effort import BestEffortPolicy

        return BestEffortPolicy
    if name == names.RESTRICTED:
        from numa_pin.policy.restricted import RestrictedPolicy

        return RestrictedPolicy
    if name == names.SINGLE_NUMA_NODE:
        from numa_pin.policy.single_numa_node import SingleNumaNodePolicy

        return SingleNumaNodePolicy
    raise PolicyError(f'unknown policy: "{name}"')


def get_policy(name: str, options: PolicyOptions | Mapping[str, str | bool | int] | None = None) -> Policy:
    """The policy called ``name`` with ``options`` (parsed when given as a raw mapping).

    Raises :class:`PolicyError`: ``unknown policy: "x"``, or an option error.
    """
    cls = policy_class(name)
    opts = options if isinstance(options, PolicyOptions) else parse_options(options)
    return cls(opts)


def check_scope(name: str) -> str:
    """Return ``name`` if it is a scope; raises :class:`PolicyError` ``unknown scope: "x"``."""
    if name not in names.SCOPES:
        raise PolicyError(f'unknown scope: "{name}"')
    return name


def merge_hints(
    policy: str,
    providers_hints: Sequence[ProviderHints] | None,
    numa_nodes: Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
    prefer_closest: bool = False,
) -> tuple[TopologyHint, bool]:
    """Merge one container's (or pod's) provider hints under ``policy``; return ``(hint, admit)``.

    ``providers_hints`` has one entry per provider: ``None`` or ``{resource: hints}`` where
    hints is a list of :class:`TopologyHint`, a :class:`CapacityFamily` or ``None``.
    ``distances[node]`` lists the distance to each node of ``sorted(numa_nodes)``.

    Raises :class:`PolicyError` for an unknown policy, malformed hints, or prefer-closest without
    distances; :class:`TopologyError` for bad node ids or distance values.
    """
    pol = get_policy(policy, PolicyOptions(prefer_closest_numa_nodes=prefer_closest))
    info = NumaInfo.build(numa_nodes, distances)
    hint = pol.merge(providers_hints, info)
    return hint, pol.can_admit(hint)


__all__ = ["POLICIES", "SCOPES", "check_scope", "get_policy", "merge_hints", "policy_class"]
