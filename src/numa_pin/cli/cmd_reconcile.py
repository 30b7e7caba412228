"""``numa-pin reconcile``: drop grants of dead containers and repair drifted cpusets.

With ``resize_follow: adopt`` an exclusive container whose ``cpuset.cpus`` a runtime changed
(``runc update --cpuset-cpus``) is first resized to it through the ledger when that is a valid
resize (:func:`numa_pin.cli.cmd_resize.follow_runtime_resizes`); otherwise (and by default) the
repair writes the ledger's CPUs back.

A shared container the kernel would not shrink (a nested cpuset cgroup it keeps busy, a cgroup v2
partition) is left as it was and listed as blocked; every reconcile tries it again.

``--json``: ``{"dropped": [<grant as status lists it>], "repaired": [container id], "conflicts": [line],
"blocked_shared": [line], "adopted": [container id], "not_adopted": [line]}``.
"""

from __future__ import annotations

import argparse

from numa_pin.base.text import one_line
from numa_pin.cli.common import grant_dict, node_arguments, open_node, print_result

NAME = "reconcile"
HELP = "drop grants whose process and cgroup are gone; re-assert cpusets that drifted"
add_arguments = node_arguments("print what was dropped and repaired as JSON")


def run(args: argparse.Namespace) -> int:
    from numa_pin.resources.node.cpu import blocked_shared

    service = open_node(args)
    adopted: list[str] = []
    not_adopted: list[str] = []
    if service.config.resize_follow == "adopt":
        from numa_pin.cli.cmd_resize import follow_runtime_resizes

        adopted, not_adopted = follow_runtime_resizes(service)
    removed, repaired = service.reconcile()
    state = service.ledger.read()
    conflicts = service.config_conflicts(state)
    blocked = blocked_shared(service, state)
    from numa_pin.cli.cmd_status import _set_aside

    set_aside = _set_aside(service)
    out = {"dropped": [grant_dict(g) for g in removed], "repaired": list(repaired), "conflicts": conflicts,
           "blocked_shared": blocked, "adopted": adopted, "not_adopted": not_adopted, "set_aside": set_aside}
    lines = [f"adopted the runtime's resize of {one_line(cid)}" for cid in adopted]
    lines += [one_line(line) for line in not_adopted]
    lines += [f"dropped {one_line(g.container_id)} (process and cgroup gone)" for g in removed]
    lines += [f"repaired cpuset of {one_line(cid)}" for cid in repaired]
    lines += [f"conflict: {one_line(c)}" for c in conflicts]
    lines += [f"blocked: {one_line(b)}" for b in blocked]
    lines += [f"set aside: {one_line(line)}" for line in set_aside]
    print_result(args, out, lines or ["nothing to do"])
    return 0
