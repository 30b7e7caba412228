"""``numa-pin recover``: rebuild a lost or corrupt ledger from what runs on the node.

The damaged file is kept as ``ledger.json.corrupt-<unix time>``; the new ledger holds the grants
of the damaged file that the machine confirms and grants for the container cgroups it finds (see
:mod:`numa_pin.ledger.recovery`, and docs/ledger-config.md for what cannot be recovered). A valid
ledger is left alone; a missing one (deleted: it then reads as empty) is rebuilt the same way.
Run it before anything else once a command reports a corrupt ledger.

``--json``: ``{"recovered": bool, "aside": path or null, "salvaged": [id], "found": [id],
"dropped": [id], "grants": [<grant as status lists it>]}``.
"""

from __future__ import annotations

import argparse
import json
import os

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out
from numa_pin.text import one_line

NAME = "recover"
HELP = "rebuild a lost or corrupt ledger from the containers that run (the damaged file is kept aside)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print what was recovered as JSON")


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.errors import NumaPinError
    from numa_pin.ledger.liveness import cgroup_dir, is_alive
    from numa_pin.ledger.recovery import Recovery, rebuild
    from numa_pin.resources.node.cpu import reserved as reserved_of
    from numa_pin.service import NodeService

    service = NodeService(load(args))
    cfg = service.config
    online, reserved = service.topology.cpu_ids, reserved_of(service)
    made: list[Recovery] = []

    def alive(grant) -> bool:
        try:
            return is_alive(grant, cfg.proc_root, cfg.cgroup_root)
        except (NumaPinError, OSError):  # a grant whose files cannot be read is not confirmed
            return False

    def cgroup_cpus(grant) -> frozenset[int] | None:
        from numa_pin.cpuset import parse_list

        try:
            with open(os.path.join(cgroup_dir(grant.cgroup, cfg.cgroup_root), "cpuset.cpus"), "rb") as fp:
                return parse_list(fp.read(65536).decode("ascii", "replace").strip())
        except (OSError, ValueError, TypeError):
            return None

    def build(raw: bytes | None):
        made.append(rebuild(raw, alive, cgroup_cpus, cfg.cgroup_root, online, reserved))
        return made[-1].state

    state, aside, rebuilt = service.ledger.rebuild(build)
    result = made[-1] if rebuilt and made else None
    grants = sorted(state.grants.values(), key=lambda g: g.container_id)
    if args.json:
        out = {"recovered": result is not None, "aside": aside,
               "salvaged": list(result.salvaged) if result else [], "found": list(result.found) if result else [],
               "dropped": list(result.dropped) if result else [], "grants": [grant_dict(g) for g in grants]}
        write_out(json.dumps(out, indent=2) + "\n")
        return 0
    if result is None:
        write_out(f"the ledger is valid ({len(grants)} grant(s)): nothing to recover\n")
        return 0
    lines = [f"damaged ledger kept as {one_line(aside)}" if aside else "no ledger file: rebuilt from what runs"]
    lines += [f"kept {one_line(cid)} (from the damaged ledger, confirmed running)" for cid in result.salvaged]
    lines += [f"found {one_line(cid)} ({state.grants[cid].kind}, cgroup {one_line(state.grants[cid].cgroup or '-')})"
              for cid in result.found]
    lines += [f"dropped {one_line(cid)} (in the damaged ledger, not running)" for cid in result.dropped]
    lines.append(f"{len(grants)} grant(s) recovered; see numa-pin status")
    write_out("\n".join(lines) + "\n")
    return 0
