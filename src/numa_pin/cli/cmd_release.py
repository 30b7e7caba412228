"""``numa-pin release ID``: free a grant by hand (what the poststop hook does).

``ID`` is a container id or a unique prefix of one. A release that matches no grant exits 1.

A container that still runs is refused (exit 1): freeing its grant would hand its CPUs and
devices to the next container while it still runs there. ``--force`` takes them back anyway and
keeps tracking the container as a shared one: its cgroup goes to the shared pool and follows it
(``status`` lists it as ``shared``), its exclusive CPUs, GPUs and VFs are free again. Its grant
goes when it stops (poststop, ``reconcile``, or ``release`` again).

``--json``: ``{"container_id", "released": bool, "moved_to_shared": bool, "grant": <the freed grant
as status lists it (with --force: what it holds now), or null>}``.
"""

from __future__ import annotations

import argparse
import sys

from numa_pin.base.text import one_line
from numa_pin.cli.common import add_node_arguments, grant_dict, open_node, print_result, resolve_id

NAME = "release"
HELP = "release the grant of a container or process and return its CPUs to the shared pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print what was released as JSON")
    parser.add_argument("container_id", metavar="ID", help="a container id, or a unique prefix of one")
    parser.add_argument("--force", action="store_true",
                        help="a container that still runs: take back its exclusive CPUs and devices and keep "
                             "tracking it in the shared pool")


def run(args: argparse.Namespace) -> int:
    """Release the grant whose id is ``ID`` or starts with it; exit 1 when none does."""
    from numa_pin.reporting.report import forget_reason

    service = open_node(args)
    cid = resolve_id(args.container_id, service.ledger.read().grants)
    live = service.live_grant(cid) if cid is not None else None
    if live is not None and not args.force:
        from numa_pin.base.cpuset import format_list

        where = f"pid {live.pid or '-'}, cgroup {one_line(live.cgroup or '-')}"
        where += f", cpus {format_list(live.cpus) or 'shared'}"
        print(f"numa-pin: {one_line(cid or '')} still runs ({where}): releasing it would hand what it holds to "
              "the next container while it runs there; stop it first, or --force to move it to the shared pool "
              "(it stays tracked)", file=sys.stderr)
        return 1
    if live is not None:
        grant = service.release_to_shared(live.container_id)
        moved = grant is not None
    else:
        grant = service.release(cid) if cid is not None else None
        moved = False
    if grant is not None and not moved:
        forget_reason(service.config.state_dir, grant.container_id)
    out = {"container_id": cid or args.container_id, "released": grant is not None and not moved,
           "moved_to_shared": moved, "grant": None if grant is None else grant_dict(grant)}
    lines = []
    if moved and grant is not None:
        lines.append(f"{one_line(grant.container_id)}: still running: moved to the shared pool and still tracked; "
                     "its exclusive CPUs and devices are free")
    elif grant is not None:
        lines.append(f"{one_line(grant.container_id)}: released")
    print_result(args, out, lines)
    if grant is None and _remove_set_aside(args, service):
        return 0
    if grant is None:
        print(f"numa-pin: no grant matches {one_line(repr(args.container_id))} (already released, or a wrong id; "
              "see numa-pin status)", file=sys.stderr)
        return 1
    return 0


def _remove_set_aside(args: argparse.Namespace, service) -> bool:
    """Remove the record of a grant set aside whose id is ``ID`` or starts with it (status lists
    them); False when none is."""
    from numa_pin.reporting.report import forget_reason, read_set_aside

    records = read_set_aside(service.config.state_dir)
    cid = resolve_id(args.container_id, records)
    if cid is None:
        return False
    forget_reason(service.config.state_dir, cid)
    print_result(args, {"container_id": cid, "released": True, "moved_to_shared": False, "grant": None,
                        "set_aside": True}, [f"{one_line(cid)}: the grant set aside is removed"])
    return True
