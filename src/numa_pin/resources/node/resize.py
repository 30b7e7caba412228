"""Resizing an exclusive grant in place: the changes
:meth:`~numa_pin.service.node.NodeService.update_grant` applies under the ledger lock.

``numa-pin resize`` asks a count (:func:`resize_change`); ``resize_follow: adopt`` takes a cpuset a
runtime wrote (:func:`adopt_change`) or the CPUs of kubelet's in-place resize through NRI
(:func:`follow_resize`). Every one follows KEP-5554 (:mod:`numa_pin.allocators.resize`): the
CPUs the grant was admitted with stay, growth stays on its NUMA affinity, anything else is
refused in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numa_pin.allocators.resize import MEMORY, check_adoptable, resized_cpus, resized_memory
from numa_pin.base.record import replace
from numa_pin.errors import AllocationError
from numa_pin.ledger.model import Grant
from numa_pin.resources.node.cpu import reserved
from numa_pin.topology.memory import build_memory_state

if TYPE_CHECKING:
    from typing import Any

#: ``resize_follow``: record a valid runtime resize as the grant's (else: write the grant back)
ADOPT = "adopt"


def resize_change(service: Any, cpus: int | None, memory: int | None) -> Any:
    """The function :meth:`~numa_pin.service.node.NodeService.update_grant` applies under the lock."""

    topology, settings = service.topology, service.settings

    def change(grant: Any, state: Any) -> Any:
        new = grant
        if cpus is not None:
            now = resized_cpus(topology, settings.cpu_options, state, grant, cpus, reserved(service))
            baseline = grant.baseline_cpus if grant.baseline_cpus is not None else grant.cpus
            nodes = frozenset(topology.cpus[c].numa for c in now) - {None}
            new = replace(new, cpus=now, baseline_cpus=None if now == baseline else baseline,
                          mems=grant.mems | nodes, affinity=_expanded(grant.affinity, nodes))
        if memory is not None:
            per_node = resized_memory(grant, memory, memory_free(service, state, grant))
            new = replace(new, memory={**grant.memory, MEMORY: per_node})
        return new

    return change


def _expanded(affinity: frozenset[int] | None, nodes: frozenset[int]) -> frozenset[int] | None:
    """A grant's affinity after a resize onto CPUs of ``nodes``: every node it had, and any
    the resize expanded it to (KEP-5554); no affinity stays none."""
    return None if affinity is None else affinity | nodes


def adopt_change(service: Any, seen: frozenset[int]) -> Any:
    """The change that records ``seen`` (a cpuset a runtime wrote) as the grant's CPUs, when
    :func:`~numa_pin.allocators.resize.check_adoptable` lets it."""

    topology = service.topology

    def change(grant: Any, state: Any) -> Any:
        check_adoptable(topology, state, grant, seen, reserved(service))
        baseline = grant.baseline_cpus if grant.baseline_cpus is not None else grant.cpus
        nodes = frozenset(topology.cpus[c].numa for c in seen) - {None}
        return replace(grant, cpus=seen, baseline_cpus=None if seen == baseline else baseline,
                       mems=grant.mems | nodes, affinity=_expanded(grant.affinity, nodes))

    return change


def memory_free(service: Any, state: Any, grant: Any) -> dict[int, int]:
    """Free ``memory`` per node for ``grant`` (every other grant and the system's reservation counted)."""

    assignments = [(g.container_id, g.memory, frozenset(n for per in g.memory.values() for n in per))
                   for g in state.grants.values() if g.memory and g.container_id != grant.container_id]
    mem = build_memory_state(service.topology, service.settings.reserved_memory, assignments)
    return {n: mem.free(n, MEMORY) for n in service.topology.node_ids}


def follow_resize(service: Any, grant: Grant, cpus: int) -> Grant:
    """The grant after kubelet's in-place resize of its container to ``cpus`` exclusive CPUs (NRI's
    ``UpdateContainer``): unchanged when the count is, resized through the ledger under
    ``resize_follow: adopt``, else refused (:class:`~numa_pin.errors.AllocationError`, one line
    naming the setting), never written back in silence."""
    if not grant.cpus or cpus == len(grant.cpus):
        return grant
    cid = grant.container_id
    if not cpus:
        raise AllocationError(f"{cid}: an in-place resize to a CPU count that is not a whole number of exclusive "
                              f"CPUs: it holds {len(grant.cpus)} and cannot become shared while it runs")
    baseline = grant.baseline_cpus if grant.baseline_cpus is not None else grant.cpus
    if cpus < len(baseline):
        raise AllocationError(f"{cid}: an in-place resize to {cpus} exclusive CPUs would give up CPUs it was "
                              f"admitted with ({len(baseline)}); KEP-5554 keeps them, so recreate the pod")
    if service.config.resize_follow != ADOPT:
        raise AllocationError(f"{cid}: an in-place resize from {len(grant.cpus)} to {cpus} exclusive CPUs is not "
                              "followed (resize_follow: reassert); set resize_follow: adopt, or recreate the pod")
    return service.update_grant(cid, resize_change(service, cpus, None))[1]


__all__ = ["ADOPT", "adopt_change", "follow_resize", "memory_free", "resize_change"]
