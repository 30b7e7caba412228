"""``numa-pin status``: grants in the ledger, the shared pool and free CPUs per NUMA node."""

from __future__ import annotations

import argparse
import json
from typing import Any

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out
from numa_pin.text import one_line

NAME = "status"
HELP = "list grants recorded in the node ledger and what is free per NUMA node"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true")


def grant_dict(g) -> dict:
    from numa_pin.cpuset import format_list

    return {
        "container_id": g.container_id, "pod_id": g.pod_id, "name": g.container_name, "kind": g.kind,
        "pid": g.pid, "cgroup": g.cgroup, "cpus": format_list(g.cpus), "mems": format_list(g.mems),
        "devices": {k: list(v) for k, v in g.devices.items()},
        "affinity": None if g.affinity is None else sorted(g.affinity),
        "policy": g.policy, "scope": g.scope, "created": g.created,
    }


def run(args: argparse.Namespace) -> int:
    from numa_pin.cpuset import format_list
    from numa_pin.service import NodeService

    agent = NodeService(load(args))
    state = agent.ledger.read()
    pool = agent.shared_pool(state)
    topo = agent.topology
    free = {n: sorted(topo.nodes[n].cpus & (topo.cpu_ids - state.exclusive_cpus() - agent.reserved()))
            for n in topo.node_ids}
    out: dict[str, Any] = {
        "grants": [grant_dict(g) for g in sorted(state.grants.values(), key=lambda g: g.created)],
        "shared_pool": format_list(pool),
        "reserved": format_list(agent.reserved()),
        "free_exclusive_cpus_per_node": {str(n): format_list(c) for n, c in free.items()},
    }
    if args.json:
        write_out(json.dumps(out, indent=2) + "\n")
        return 0
    lines = [f"shared pool: {out['shared_pool']}   reserved: {out['reserved'] or '-'}"]
    lines += [f"node {n}: free for exclusive use: {c or '-'}" for n, c in out["free_exclusive_cpus_per_node"].items()]
    lines.append(f"{len(out['grants'])} grant(s)")
    for g in out["grants"]:
        lines.append(
            f"  {one_line(g['container_id'][:24]):24} {one_line(g['kind']):9} cpus={g['cpus'] or '-':8} "
            f"mems={g['mems'] or '-':6} pod={one_line(g['pod_id'][:16])} {one_line(g['policy'])}"
        )
    write_out("\n".join(lines) + "\n")
    return 0
