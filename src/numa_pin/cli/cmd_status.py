"""``numa-pin status``: grants in the ledger, the shared pool, free CPUs per NUMA node, and
whether kubelet's CPU manager runs the static policy on this node too (its checkpoint under
``--kubelet-root``, default the config's ``kubelet_root``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from numa_pin.cli.common import SHORT_ID, add_config_argument, load, short_ids
from numa_pin.cli.main import write_out
from numa_pin.text import one_line

NAME = "status"
HELP = "list grants recorded in the node ledger and what is free per NUMA node"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--kubelet-root", metavar="DIR",
                        help="kubelet's root directory (default: the config's kubelet_root, /var/lib/kubelet)")


def grant_dict(g) -> dict:
    from numa_pin.cpuset import format_list

    pod, name = pod_and_name(g.container_name)
    return {
        "container_id": g.container_id, "pod_id": g.pod_id, "pod": pod, "name": name, "kind": g.kind,
        "pid": g.pid, "cgroup": g.cgroup, "cpus": format_list(g.cpus), "mems": format_list(g.mems),
        "devices": {k: list(v) for k, v in g.devices.items()},
        "affinity": None if g.affinity is None else sorted(g.affinity),
        "policy": g.policy, "scope": g.scope, "created": g.created,
        **({"isolation": dict(g.isolation)} if g.isolation else {}),
    }


def pod_and_name(container_name: str) -> tuple[str | None, str]:
    """A Kubernetes container's grant is named ``namespace/pod/container`` (namespaces, pods and
    containers have no ``/`` in their names): ``("namespace/pod", "container")``; any other
    name has no pod name."""
    pod, _, name = container_name.rpartition("/")
    return (pod, name) if pod.count("/") == 1 and all(pod.split("/")) and name else (None, container_name)


def run(args: argparse.Namespace) -> int:
    from numa_pin.cpuset import format_list
    from numa_pin.kubelet import describe
    from numa_pin.service import NodeService

    config = load(args)
    service = NodeService(config)
    from numa_pin.errors import NumaPinError

    try:
        service.drop_earlier_boots()  # a reboot ended them: never show them as holding CPUs
    except (NumaPinError, OSError):
        pass  # not root, or the ledger is locked: the next admission or reconcile drops them
    state = service.ledger.read()
    grants = [grant_dict(g) for g in sorted(state.grants.values(), key=lambda g: g.created)]
    out: dict[str, Any] = {
        "grants": grants,
        **service.describe(state),  # every resource's part: shared pool, reserved, free CPUs per node
        "kubelet": describe(args.kubelet_root or config.kubelet_root),
        "conflicts": service.config_conflicts(state),
    }
    free_per_node: dict[str, str] = out["free_exclusive_cpus_per_node"]
    kubelet: dict[str, Any] = out["kubelet"]
    if kubelet["static"]:
        from numa_pin.cpuset import parse_list

        kubelet["overlap_with_numa_pin"] = format_list(parse_list(kubelet["exclusive_cpus"]) & state.exclusive_cpus())
    if args.json:
        write_out(json.dumps(out, indent=2) + "\n")
        return 0
    from numa_pin.report import read_reasons

    # ids as short as `explain` and `release` still resolve uniquely (rejections count too)
    short = short_ids(set(state.grants) | set(read_reasons(service.config.state_dir)))
    width = max((len(short[g["container_id"]]) for g in grants), default=SHORT_ID)
    lines = [f"shared pool: {out['shared_pool']}   reserved: {out['reserved'] or '-'}"]
    lines += [f"node {n}: free for exclusive use: {c or '-'}" for n, c in free_per_node.items()]
    lines += _kubelet_lines(kubelet)
    lines += [f"conflict: {c}" for c in out["conflicts"]]
    lines += [f"blocked: {one_line(b)}" for b in out["blocked_shared"]]
    lines.append(f"{len(grants)} grant(s)")
    for g in grants:
        held = service.describe_grant(state.grants[g["container_id"]])  # memory, devices: each resource's words
        lines.append(
            f"  {one_line(short[g['container_id']]):{width}} {one_line(g['kind']):9} cpus={g['cpus'] or '-':8} "
            f"mems={g['mems'] or '-':6} pod={one_line(g['pod'] or g['pod_id'][:16])} {one_line(g['policy'])}"
            + "".join(f" {one_line(word)}" for word in held)
        )
    write_out("\n".join(lines) + "\n")
    return 0


def _kubelet_lines(kubelet: dict[str, Any]) -> list[str]:
    """Nothing when there is no kubelet checkpoint; one or two lines otherwise."""
    where = kubelet["checkpoint"]
    if kubelet["error"]:
        return [f"kubelet: {where}: unreadable ({kubelet['error']})"]
    if kubelet["policy"] is None:
        return []
    if not kubelet["static"]:
        return [f"kubelet: CPU manager policy {kubelet['policy']} ({where}): no conflict"]
    held = kubelet["exclusive_cpus"] or "none yet"
    lines = [f"kubelet: WARNING: CPU manager policy static ({where}), exclusive CPUs {held} in "
             f"{kubelet['containers']} container(s): kubelet and numa-pin both hand out exclusive CPUs"]
    if kubelet.get("overlap_with_numa_pin"):
        lines.append(f"kubelet: CPUs {kubelet['overlap_with_numa_pin']} are exclusive to both kubelet and numa-pin")
    lines.append("kubelet: supported: cpuManagerPolicy none with numa-pin aligning, or numa-pin only for "
                 "workloads kubelet does not run (README: Living next to kubelet)")
    return lines
