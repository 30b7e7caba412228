"""Policy ``none``: no alignment. kubelet ``policy_none.go``."""

from __future__ import annotations

from collections.abc import Sequence

from numa_pin.base import names
from numa_pin.policy.base import NumaInfo, Policy
from numa_pin.policy.hint import ProviderHints, TopologyHint

NAME = names.NONE


class NonePolicy(Policy):
    """Returns the zero hint ``{nil, false}`` without looking at the hints; admits everything."""

    name = NAME

    def merge(self, providers_hints: Sequence[ProviderHints] | None, numa_info: NumaInfo) -> TopologyHint:
        return TopologyHint(None, False)

    def can_admit(self, hint: TopologyHint) -> bool:
        return True
