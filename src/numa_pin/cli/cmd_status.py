"""``numa-pin status``: grants in the ledger, the shared pool, free CPUs per NUMA node, and
whether kubelet's CPU manager runs the static policy on this node too (its checkpoint under
``--kubelet-root``, default the config's ``kubelet_root``).

Each grant says whether its container runs (``state`` in ``--json``): ``running`` (its process
or cgroup lives), ``pending`` (made at podman's precreate, the runtime has not created its
cgroup yet), ``exited`` (nothing of it runs, but no poststop came: CRI-O runs poststop only when
the container is removed, so a stopped container that CRI-O keeps holds its grant until then;
an admission that needs its CPUs reclaims them, as does ``reconcile``), or ``unknown`` (its
record cannot be checked)."""

from __future__ import annotations

import argparse
from typing import Any

from numa_pin.base.text import one_line
from numa_pin.cli.common import SHORT_ID, add_node_arguments, grant_dict, open_node, print_result, short_ids
from numa_pin.cli.main import write_out

NAME = "status"
HELP = "list grants recorded in the node ledger and what is free per NUMA node (--map: draw it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print one JSON object")
    parser.add_argument("--map", action="store_true",
                        help="draw each NUMA node: CPUs as a core-by-thread grid marked by holder, memory, devices "
                        "(colour on a terminal unless NO_COLOR is set)")
    parser.add_argument("--map-file", metavar="PATH",
                        help="write the same picture as one standalone HTML page (no external assets) to PATH")
    parser.add_argument("--kubelet-root", metavar="DIR",
                        help="kubelet's root directory (default: the config's kubelet_root, /var/lib/kubelet)")


def run(args: argparse.Namespace) -> int:
    from numa_pin.base.cpuset import format_list
    from numa_pin.cluster.kubelet import describe
    from numa_pin.errors import NumaPinError

    service = open_node(args)

    try:
        service.drop_earlier_boots()  # a reboot ended them: never show them as holding CPUs
    except (NumaPinError, OSError):
        pass  # not root, or the ledger is locked: the next admission or reconcile drops them
    state = service.set_aside(service.ledger.read())  # a grant no check can be made of: reported below
    if getattr(args, "map", False) or getattr(args, "map_file", None):
        return _draw(args, service, state)
    grants = [{**grant_dict(g), "state": _running(service, g)}
              for g in sorted(state.grants.values(), key=lambda g: g.created)]
    out: dict[str, Any] = {
        "grants": grants,
        **service.describe(state),  # every resource's part: shared pool, reserved, free CPUs per node
        "kubelet": describe(args.kubelet_root or service.config.kubelet_root),
        "conflicts": service.config_conflicts(state),
        "set_aside": _set_aside(service),
    }
    kubelet: dict[str, Any] = out["kubelet"]
    if kubelet["static"]:
        from numa_pin.base.cpuset import parse_list

        kubelet["overlap_with_numa_pin"] = format_list(parse_list(kubelet["exclusive_cpus"]) & state.exclusive_cpus())
    print_result(args, out, () if args.json else _lines(service, state, out))
    return 0


#: what the text lines add for a grant in each state (a running one: nothing)
_STATE_WORDS = {"running": "", "pending": " not-started-yet", "exited": " exited:held-until-removed",
                "unknown": " state-unknown"}


def _running(service, grant) -> str:
    """``running``, ``pending``, ``exited`` or ``unknown``: see the module doc."""
    from numa_pin.errors import NumaPinError

    try:
        if service.running(grant):
            return "running"
        return "pending" if service.alive(grant) else "exited"
    except (NumaPinError, OSError):
        return "unknown"


def _set_aside(service) -> list[str]:
    """The lines of the grants set aside (no check could be made of them; ``release`` removes them)."""
    from numa_pin.reporting.report import read_set_aside

    return sorted(str(doc.get("line", "")) for doc in read_set_aside(service.config.state_dir).values())


def _lines(service, state, out: dict[str, Any]) -> list[str]:
    """What ``status`` prints without ``--json``."""
    from numa_pin.reporting.report import read_reasons

    grants: list[dict[str, Any]] = out["grants"]
    free_per_node: dict[str, str] = out["free_exclusive_cpus_per_node"]

    # ids as short as `explain` and `release` still resolve uniquely (rejections count too)
    short = short_ids(set(state.grants) | set(read_reasons(service.config.state_dir)))
    width = max((len(short[g["container_id"]]) for g in grants), default=SHORT_ID)
    lines = [f"shared pool: {out['shared_pool']}   reserved: {out['reserved'] or '-'}"]
    lines += [f"node {n}: free for exclusive use: {c or '-'}" for n, c in free_per_node.items()]
    lines += _kubelet_lines(out["kubelet"])
    lines += [f"conflict: {c}" for c in out["conflicts"]]
    lines += [f"blocked: {one_line(b)}" for b in out["blocked_shared"]]
    lines += [f"set aside: {one_line(line)}" for line in out["set_aside"]]
    lines.append(f"{len(grants)} grant(s)")
    for g in grants:
        held = service.describe_grant(state.grants[g["container_id"]])  # memory, devices: each resource's words
        lines.append(
            f"  {one_line(short[g['container_id']]):{width}} {one_line(g['kind']):9} cpus={g['cpus'] or '-':8} "
            f"mems={g['mems'] or '-':6} pod={one_line(g['pod'] or g['pod_id'][:16])} {one_line(g['policy'])}"
            + "".join(f" {one_line(word)}" for word in held) + _STATE_WORDS[g["state"]]
        )
    return lines


def _draw(args: argparse.Namespace, service, state) -> int:
    """``--map`` on stdout and/or ``--map-file`` (atomically, 0644)."""
    import os
    import sys

    from numa_pin.cli.nodemap import picture, render_html, render_text
    from numa_pin.cluster.nrt import reserved_cpus_of
    from numa_pin.devices.inventory import inventory
    from numa_pin.reporting.report import read_reasons
    from numa_pin.resources.base import NodeView
    from numa_pin.resources.memory import MemoryResource

    topology, settings = service.topology, service.settings
    reserved = reserved_cpus_of(topology, settings)
    devices = inventory(topology, settings.device_resources)
    zones = MemoryResource().zones(NodeView(topology, settings, state, devices, reserved))
    isolated, offline = kernel_cpus(service.config.sysfs_root)
    pic = picture(topology, state, short=short_ids(set(state.grants) | set(read_reasons(service.config.state_dir))),
                  reserved=reserved, isolated=isolated, offline=offline, devices=devices, memory_zones=zones)
    if args.map_file:
        from numa_pin.base.safefs import replace_private

        path = os.path.abspath(args.map_file)
        replace_private(os.path.dirname(path), path, render_html(pic).encode("utf-8"),
                        prefix=f".{os.path.basename(path)}.", mode=0o644)
    if args.map or not args.map_file:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        write_out(render_text(pic, colour=colour))
    return 0


def kernel_cpus(sysfs_root: str) -> tuple[frozenset[int], dict[int, int | None]]:
    """The kernel's isolated CPUs (``cpu/isolated``) and its offline CPUs with their node (the
    ``cpuN/nodeM`` link; None without one). Files that are missing or unreadable say none."""
    import os

    from numa_pin.base.boundedio import read_regular_file
    from numa_pin.base.cpuset import parse_list

    base = os.path.join(sysfs_root, "devices/system/cpu")

    def cpus(name: str) -> frozenset[int]:
        try:
            return parse_list(read_regular_file(os.path.join(base, name), 64 << 10).decode().strip("\x00\n "))
        except (OSError, ValueError):
            return frozenset()

    offline: dict[int, int | None] = {}
    for cpu in sorted(cpus("offline")):
        try:
            links = [n for n in os.listdir(os.path.join(base, f"cpu{cpu}")) if n.startswith("node")]
        except OSError:
            links = []
        nodes = [int(n[4:]) for n in links if n[4:].isdigit()]
        offline[cpu] = nodes[0] if len(nodes) == 1 else None
    return cpus("isolated"), offline


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
                 "workloads kubelet does not run (docs/kubernetes.md: Living next to kubelet)")
    return lines
