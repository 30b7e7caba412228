"""Policy ``restricted``: best-effort's merge, admit only preferred hints.
kubelet ``policy_restricted.go`` (it embeds the best-effort policy)."""

from __future__ import annotations

from numa_pin.base import names
from numa_pin.policy.best_effort import BestEffortPolicy
from numa_pin.policy.hint import TopologyHint

NAME = names.RESTRICTED


class RestrictedPolicy(BestEffortPolicy):
    """Same merge as best-effort; admits iff the merged hint is preferred."""

    name = NAME

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred
