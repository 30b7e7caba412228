"""``numa-pin resize ID --cpus N [--memory Q]``: grow or shrink a running grant in place.

``ID`` is a container id (or a unique prefix of one) whose container or process still runs. The
new grant keeps every CPU the old one has and follows KEP-5554
(:mod:`numa_pin.allocators.resize`): it never gives up the CPUs it was admitted with, grows on
its NUMA affinity (expanding it, keeping every node, only under ``best-effort`` or ``none``
when the affinity has too few free), and is refused with one line otherwise. It is one ledger transaction with
the cgroup write and its undo (:meth:`numa_pin.service.NodeService.update_grant`): the
container's ``cpuset.cpus`` (and ``cpuset.mems``) change, the shared pool shrinks or grows with
it, and a failure leaves everything as it was.

``--json``: ``{"container_id", "before": grant, "after": grant}`` (grants as ``status`` lists them).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from numa_pin.cli.common import add_config_argument, load, resolve_id
from numa_pin.cli.main import write_out
from numa_pin.errors import RequestError
from numa_pin.text import one_line

NAME = "resize"
HELP = "grow or shrink the exclusive CPUs (and aligned memory) of a running container or process in place"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID", help="a container id, or a unique prefix of one")
    parser.add_argument("--cpus", metavar="N", type=int, help="the exclusive CPUs it should hold")
    parser.add_argument("--memory", metavar="QTY", help="the aligned memory it should hold, e.g. 4Gi")
    parser.add_argument("--json", action="store_true", help="print the grant before and after as JSON")


def resize_change(service: Any, cpus: int | None, memory: int | None) -> Any:
    """The function :meth:`~numa_pin.service.NodeService.update_grant` applies under the lock."""
    from numa_pin.allocators.resize import MEMORY, resized_cpus, resized_memory
    from numa_pin.record import replace
    from numa_pin.resources.node.cpu import reserved

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
    from numa_pin.allocators.resize import check_adoptable
    from numa_pin.record import replace
    from numa_pin.resources.node.cpu import reserved

    topology = service.topology

    def change(grant: Any, state: Any) -> Any:
        check_adoptable(topology, state, grant, seen, reserved(service))
        baseline = grant.baseline_cpus if grant.baseline_cpus is not None else grant.cpus
        nodes = frozenset(topology.cpus[c].numa for c in seen) - {None}
        return replace(grant, cpus=seen, baseline_cpus=None if seen == baseline else baseline,
                       mems=grant.mems | nodes, affinity=_expanded(grant.affinity, nodes))

    return change


def follow_runtime_resizes(service: Any) -> tuple[list[str], list[str]]:
    """``resize_follow: adopt``: every running exclusive grant whose ``cpuset.cpus`` a runtime
    changed is resized to it through the ledger when that is a valid resize. Returns the ids
    adopted and one line per change refused (reconcile then writes the ledger's CPUs back)."""
    import os

    from numa_pin.cpuset import format_list, parse_list
    from numa_pin.enforcer.cgroups import read_cgroup_file
    from numa_pin.errors import NumaPinError

    adopted: list[str] = []
    refused: list[str] = []
    for grant in service.ledger.read().grants.values():
        ref = service.live_cgroup_ref(grant) if grant.cpus else None
        if ref is None:
            continue
        try:
            seen = parse_list(read_cgroup_file(os.path.join(ref.cpuset_dir, "cpuset.cpus")))
        except (OSError, ValueError, NumaPinError):
            continue  # unreadable now: the repair that follows reports it
        if not seen or seen == grant.cpus:
            continue
        try:
            service.update_grant(grant.container_id, adopt_change(service, seen))
        except NumaPinError as exc:
            refused.append(f"{grant.container_id}: not adopted, cpus {format_list(grant.cpus)} written back: {exc}")
        else:
            adopted.append(grant.container_id)
    return adopted, refused


def memory_free(service: Any, state: Any, grant: Any) -> dict[int, int]:
    """Free ``memory`` per node for ``grant`` (every other grant and the system's reservation counted)."""
    from numa_pin.topology.memory import MEMORY, build_memory_state

    assignments = [(g.container_id, g.memory, frozenset(n for per in g.memory.values() for n in per))
                   for g in state.grants.values() if g.memory and g.container_id != grant.container_id]
    mem = build_memory_state(service.topology, service.settings.reserved_memory, assignments)
    return {n: mem.free(n, MEMORY) for n in service.topology.node_ids}


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.cpuset import format_list
    from numa_pin.quantity import parse_bytes
    from numa_pin.service import NodeService

    if args.cpus is None and args.memory is None:
        raise RequestError("nothing to change: give --cpus N and/or --memory Q", annotation="--cpus")
    memory = parse_bytes(args.memory, "--memory") if args.memory is not None else None
    service = NodeService(load(args))
    cid = resolve_id(args.container_id, service.ledger.read().grants)
    if cid is None:
        raise RequestError(f"no grant matches {args.container_id!r} (see numa-pin status)", annotation="ID")
    before, after = service.update_grant(cid, resize_change(service, args.cpus, memory))
    if args.json:
        write_out(json.dumps({"container_id": cid, "before": grant_dict(before), "after": grant_dict(after)},
                             indent=2) + "\n")
    else:
        mem = after.memory.get("memory")
        write_out(f"{one_line(cid)}: cpus {format_list(before.cpus)} -> {format_list(after.cpus)}"
                  + (f", memory {sum(mem.values())} bytes" if mem and memory is not None else "") + "\n")
    return 0
