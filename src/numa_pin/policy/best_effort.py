"""Policy ``best-effort``: merge, prefer aligned, admit anyway. kubelet ``policy_best_effort.go``."""

from __future__ import annotations

from collections.abc import Sequence

from numa_pin.base import names
from numa_pin.policy.base import NumaInfo, Policy, flatten_providers
from numa_pin.policy.hint import ProviderHints, TopologyHint
from numa_pin.policy.merge import merge_lists

NAME = names.BEST_EFFORT


class BestEffortPolicy(Policy):
    """Flatten (§2), merge (§3-§4, narrowest or closest), always admit."""

    name = NAME

    def merge(self, providers_hints: Sequence[ProviderHints] | None, numa_info: NumaInfo) -> TopologyHint:
        lists = flatten_providers(providers_hints)
        return merge_lists(lists, numa_info, self.options.prefer_closest_numa_nodes)

    def can_admit(self, hint: TopologyHint) -> bool:
        return True
