"""Policy ``single-numa-node``: one NUMA node or nothing. kubelet ``policy_single_numa_node.go``."""

from __future__ import annotations

from collections.abc import Sequence

from numa_pin.base import names
from numa_pin.policy.base import NumaInfo, Policy, filter_single_numa, flatten_providers
from numa_pin.policy.hint import ProviderHints, TopologyHint
from numa_pin.policy.merge import merge_lists

NAME = names.SINGLE_NUMA_NODE


class SingleNumaNodePolicy(Policy):
    """Flatten, keep only preferred don't-cares and preferred single-node hints, merge with
    prefer-closest forced off, then turn an all-nodes result into ``nil`` (keeping Preferred).

    Results: ``{node, true}`` aligned; ``{nil, true}`` nobody cares (or a 1-node machine);
    ``{nil, false}`` nothing fits. Admits iff preferred.
    """

    name = NAME

    def merge(self, providers_hints: Sequence[ProviderHints] | None, numa_info: NumaInfo) -> TopologyHint:
        default = numa_info.default_mask
        filtered = filter_single_numa(flatten_providers(providers_hints))
        if filtered is None:
            hint = TopologyHint.from_mask(default, False)  # no permutation at all
        else:
            hint = merge_lists(filtered, numa_info, False)
        if hint.mask == default:
            return TopologyHint(None, hint.preferred)
        return hint

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred
