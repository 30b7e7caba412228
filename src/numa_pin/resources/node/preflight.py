"""What the isolation knobs check before any resource writes: the first registered resource.

The knobs write after the CPU resource (an isolated partition needs the container's cpuset in
place), but what makes a container impossible to isolate on this node (a kernel without cpuset
partitions, a cgroup v1 root that balances everything, an irqbalance that cannot be told) is
known before anything is written. Checking it here rejects such a container with one line
before the first write, so nothing is ever half-applied and nothing has to be rolled back (on
cgroup v2 a populated cgroup's cpuset cannot always be emptied again).
"""

from __future__ import annotations

from numa_pin.resources.node import irq, partition
from numa_pin.resources.node.base import Admission, Node, NodeResource

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from numa_pin.ledger.model import Grant


class IsolationPreflight(NodeResource):
    """Runs each isolation knob's ``preflight``; writes nothing."""

    name = "isolation-preflight"

    def enforce(self, node: Node, admission: Admission, decided: Grant) -> Admission:
        if admission.grant.isolation:
            partition.preflight(node, admission)
            irq.preflight(node, admission)
        return admission


__all__ = ["IsolationPreflight"]
