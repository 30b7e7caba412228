"""``numa-pin resize ID --cpus N [--memory Q]``: grow or shrink a running grant in place.

``ID`` is a container id (or a unique prefix of one) whose container or process still runs. The
new grant keeps every CPU the old one has and follows KEP-5554
(:mod:`numa_pin.allocators.resize`): it never gives up the CPUs it was admitted with, grows on
its NUMA affinity (expanding it, keeping every node, only under ``best-effort`` or ``none``
when the affinity has too few free), and is refused with one line otherwise. It is one ledger transaction with
the cgroup write and its undo (:meth:`numa_pin.service.node.NodeService.update_grant`): the
container's ``cpuset.cpus`` (and ``cpuset.mems``) change, the shared pool shrinks or grows with
it, and a failure leaves everything as it was.

``--json``: ``{"container_id", "before": grant, "after": grant}`` (grants as ``status`` lists them).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from numa_pin.base.text import one_line
from numa_pin.cli.common import add_config_argument, load, resolve_id
from numa_pin.cli.main import write_out
from numa_pin.errors import RequestError
from numa_pin.resources.node.resize import adopt_change, resize_change

NAME = "resize"
HELP = "grow or shrink the exclusive CPUs (and aligned memory) of a running container or process in place"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID", help="a container id, or a unique prefix of one")
    parser.add_argument("--cpus", metavar="N", type=int, help="the exclusive CPUs it should hold")
    parser.add_argument("--memory", metavar="QTY", help="the aligned memory it should hold, e.g. 4Gi")
    parser.add_argument("--json", action="store_true", help="print the grant before and after as JSON")


def follow_runtime_resizes(service: Any) -> tuple[list[str], list[str]]:
    """``resize_follow: adopt``: every running exclusive grant whose ``cpuset.cpus`` a runtime
    changed is resized to it through the ledger when that is a valid resize. Returns the ids
    adopted and one line per change refused (reconcile then writes the ledger's CPUs back)."""
    import os

    from numa_pin.base.cpuset import format_list, parse_list
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


def run(args: argparse.Namespace) -> int:
    from numa_pin.base.cpuset import format_list
    from numa_pin.base.quantity import parse_bytes
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.service.node import open_service

    if args.cpus is None and args.memory is None:
        raise RequestError("nothing to change: give --cpus N and/or --memory Q", annotation="--cpus")
    memory = parse_bytes(args.memory, "--memory") if args.memory is not None else None
    service = open_service(load(args))
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
