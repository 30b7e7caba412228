"""The admission decision: request + machine + ledger state -> grant or rejection (pure).

This is kubelet's Topology Manager admit path on one node:

1. every resource (:class:`numa_pin.resources.base.Resource`, in the order of
   ``settings.resources``) answers with hints for the request,
2. the policy merges the answers into one NUMA affinity and says admit or not,
3. if admitted, every resource takes its share inside that affinity, and may still veto the
   whole decision (:meth:`~numa_pin.resources.base.Resource.vet`).

This module names no resource: what a resource is, is the resource's own module.

Scopes: ``container`` merges each container alone. ``pod`` merges once per pod, at the pod's
first container with exclusive resources, and records the pod's affinity; every later container
of the pod is placed inside it, as kubelet stores one hint for all of a pod's containers.
numa-pin sees one container at a time, so the pod's total may be unknown or understated; the rule:

* the first merge asks, per resource, for the larger of the pod total (``numa-pin.io/pod-*``)
  and the container's own request, so a missing or understated total never lets a container
  through that the policy would refuse alone;
* under ``restricted`` and ``single-numa-node`` every container (first or later, either scope)
  takes every resource strictly inside the affinity, and what something chose before numa-pin
  (:meth:`~numa_pin.resources.base.Resource.check_inside`) must lie there too; a container that
  does not fit is rejected
  (``TopologyAffinityError``), never spilled to other nodes. ``none`` and ``best-effort`` keep
  kubelet's fallback to other nodes;
* a pod named by ``numa-pin.io/pod`` is ``user:<name>``; naming a pod that a runtime sandbox (or
  another container) owns is a :class:`~numa_pin.errors.RequestError`.

Nothing here touches the machine; :mod:`numa_pin.service.node` does the I/O around it.
"""

from __future__ import annotations

from numa_pin.base import names
from numa_pin.base.record import replace
from numa_pin.errors import AdmissionError, AllocationError, RequestError, TopologyAffinityError
from numa_pin.ledger.model import LedgerState
from numa_pin.policy import bitmask
from numa_pin.policy.hint import TopologyHint
from numa_pin.policy.options import check_machine
from numa_pin.policy.registry import merge_hints
from numa_pin.requests.request import Amounts, ContainerRequest, at_least
from numa_pin.resources.base import Decision, Need, NodeSettings, Resource, check_known, merge_fields, nodes_text
from numa_pin.topology.model import Topology

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    Views = Sequence[tuple[Resource, Any]]

#: policies that admit only aligned results: allocation never leaves their affinity
STRICT_POLICIES = (names.RESTRICTED, names.SINGLE_NUMA_NODE)


def decide(
    topology: Topology,
    state: LedgerState,
    request: ContainerRequest,
    settings: NodeSettings,
) -> Decision:
    """Decide one container. Returns a rejected :class:`Decision` rather than raising when the
    policy says no; raises :class:`~numa_pin.errors.RequestError` / ``PolicyError`` for bad input."""
    policy = request.policy or settings.policy
    scope = request.scope or settings.scope
    options = check_machine(policy, settings.policy_options, topology.node_ids, topology.distance_rows())
    others = state.without(request.container_id)
    need = Need(topology, others, request, settings, policy)
    views: Views = [(res, res.view(need)) for res in settings.resources or _pure_resources()]
    all_nodes = frozenset(topology.node_ids)

    _check_claimed_pod(state, request)
    check_known(views, request.amounts, counted_only=True)
    if not any(res.wants(view) for res, view in views):
        hint = TopologyHint(None, True)
        empty = Decision(request.container_id, True, policy, scope, hint, mems=frozenset())
        return _vetted(views, empty, True)

    pod = state.pods.get(request.pod_id) if scope == names.POD_SCOPE else None
    pod_affinity: frozenset[int] | None = None
    if pod is not None:
        # later containers of a pod live inside the pod's affinity; no new merge
        hint = TopologyHint(pod.affinity, True)
    else:
        amounts = request.amounts
        if scope == names.POD_SCOPE and request.pod_amounts is not None:
            amounts = at_least(request.pod_amounts, request.amounts)
        check_known(views, amounts)
        hint, admit = merge_hints(
            policy,
            [res.hints(view, amounts) for res, view in views],
            topology.node_ids,
            distances=topology.distance_rows(),
            prefer_closest=options.prefer_closest_numa_nodes,
        )
        if not admit:
            why = _free_summary(views, amounts)
            cause = next((e for res, view in views if (e := res.unplaceable(view, amounts)) is not None), None)
            if cause is not None:  # no affinity could hold it (a colocate constraint): say that
                return Decision(request.container_id, False, policy, scope, hint,
                                reason=f"{policy} policy: {cause} ({why})", error=type(cause))
            return Decision(
                request.container_id, False, policy, scope, hint,
                reason=f"{policy} policy: resources cannot be aligned on "
                f"{'one NUMA node' if policy == names.SINGLE_NUMA_NODE else 'their preferred NUMA nodes'} ({why})",
            )
        if scope == names.POD_SCOPE:
            pod_affinity = hint.affinity if hint.affinity is not None else all_nodes

    affinity = hint.affinity if policy != names.NONE else None
    strict = policy in STRICT_POLICIES and affinity is not None
    fields: dict[str, Any] = {}
    try:
        if strict:
            assert affinity is not None
            for res, view in views:
                res.check_inside(view, affinity)
        for res, view in views:
            merge_fields(fields, res.allocate(view, request.amounts, affinity, strict))
    except (AllocationError, TopologyAffinityError) as exc:
        why = _free_summary(views, request.amounts)
        reason = f"{exc} ({why})" if why else str(exc)
        if isinstance(exc, TopologyAffinityError):
            where = f"pod {request.pod_id} is aligned to" if pod is not None else "the merged affinity is"
            reason = f"{policy} policy: {where} NUMA node(s) {nodes_text(affinity or all_nodes)}, and {reason}"
        return Decision(request.container_id, False, policy, scope, hint, reason=reason, error=type(exc))
    admitted = Decision(
        request.container_id, True, policy, scope, hint, pod_affinity=pod_affinity,
        reason=f"{policy}/{scope}: affinity {bitmask.format_mask(hint.mask)}", **fields,
    )
    return _vetted(views, admitted, False)


def _pure_resources() -> tuple[Resource, ...]:
    """The pure halves, for a decision made without a node service (its settings name none)."""
    from numa_pin.resources.registry import pure_resources

    return pure_resources()


def _vetted(views: Views, decision: Decision, empty: bool) -> Decision:
    """``decision`` with every resource's notes, or its rejection by the first resource that
    vetoes it."""
    for res, view in views:
        veto = res.vet(view, decision, empty)
        if veto is not None:
            error, reason = veto
            return Decision(decision.container_id, False, decision.policy, decision.scope, decision.hint,
                            error=error, reason=reason)
    notes = tuple(note for res, view in views for note in res.notes(view))
    return replace(decision, notes=notes) if notes else decision


def _free_summary(views: Views, amounts: Amounts) -> str:
    """What is free per node, in every resource's own words, then what bounds the request."""
    summary = "; ".join(part for res, view in views for part in res.free_summary(view, amounts))
    return summary + "".join(f"; {bound}" for res, view in views for bound in res.bounds(view))


def _check_claimed_pod(state: LedgerState, request: ContainerRequest) -> None:
    """``numa-pin.io/pod`` may name a user pod, never a pod a runtime sandbox (or another
    container alone) owns. Raises :class:`RequestError` naming the annotation."""
    claimed = request.claimed_pod
    if claimed is None:
        return
    if claimed in state.pods or any(g.pod_id == claimed for g in state.grants.values()):
        raise RequestError(
            f"pod {claimed!r} belongs to another sandbox or container; a container without the runtime's "
            "sandbox annotations cannot join it",
            annotation="numa-pin.io/pod",
        )


def reject(decision: Decision) -> AdmissionError:
    """The error the entry points print for a rejected decision (same kind kubelet reports)."""
    return decision.error(decision.reason)


__all__ = ["STRICT_POLICIES", "Decision", "NodeSettings", "at_least", "decide", "reject"]
