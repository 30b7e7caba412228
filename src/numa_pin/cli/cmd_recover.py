"""``numa-pin recover``: rebuild a lost or corrupt ledger from what runs on the node.

The damaged file is kept as ``ledger.json.corrupt-<unix time>``; the new ledger holds the grants
of the damaged file that the machine confirms and grants for the container cgroups it finds (see
:mod:`numa_pin.ledger.recovery`, and docs/ledger-config.md for what cannot be recovered). A valid
ledger is left alone; a missing one (deleted: it then reads as empty) is rebuilt the same way.
Run it before anything else once a command reports a corrupt ledger.

``--fold`` (before going back to a release from before the ledger's journal; the package's prerm
runs it on such a downgrade): the journal ``ledger.log`` is written into one version-4 snapshot,
which those releases read, and removed (:meth:`~numa_pin.ledger.store.Ledger.fold`). Nothing to
fold (no ledger at all included) is not an error.

``--json``: ``{"recovered": bool, "aside": path or null, "salvaged": [id], "found": [id],
"dropped": [id], "grants": [<grant as status lists it>]}``; with ``--fold``, ``{"folded": bool,
"grants": [...]}``.
"""

from __future__ import annotations

import argparse
import os

from numa_pin.base.text import one_line
from numa_pin.cli.common import add_node_arguments, grant_dict, load, open_node, print_result

NAME = "recover"
HELP = "rebuild a lost or corrupt ledger from the containers that run (the damaged file is kept aside)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print what was recovered (or folded) as JSON")
    parser.add_argument("--fold", action="store_true",
                        help="write the ledger's journal into one snapshot that releases from before the journal "
                             "read, and remove it (before a downgrade; the package does it)")


def run(args: argparse.Namespace) -> int:
    if args.fold:
        return fold(args)
    from numa_pin.errors import NumaPinError
    from numa_pin.ledger.liveness import cgroup_dir
    from numa_pin.ledger.recovery import Recovery, rebuild
    from numa_pin.resources.node.cpu import reserved as reserved_of

    service = open_node(args)
    cfg = service.config
    online, reserved = service.topology.cpu_ids, reserved_of(service)
    made: list[Recovery] = []

    def alive(grant) -> bool:
        # the service's own notion: a grant made at precreate (no pid, its cgroup not made yet)
        # lives through its grace period, so its CPUs are not handed out again under it
        try:
            return service.alive(grant)
        except (NumaPinError, OSError):  # a grant whose files cannot be read is not confirmed
            return False

    def cgroup_cpus(grant) -> frozenset[int] | None:
        from numa_pin.base.cpuset import parse_list

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
    out = {"recovered": result is not None, "aside": aside,
           "salvaged": list(result.salvaged) if result else [], "found": list(result.found) if result else [],
           "dropped": list(result.dropped) if result else [], "grants": [grant_dict(g) for g in grants]}
    if result is None:
        print_result(args, out, [f"the ledger is valid ({len(grants)} grant(s)): nothing to recover"])
        return 0
    lines = [f"damaged ledger kept as {one_line(aside)}" if aside else "no ledger file: rebuilt from what runs"]
    lines += [f"kept {one_line(cid)} (from the damaged ledger, confirmed running)" for cid in result.salvaged]
    lines += [f"found {one_line(cid)} ({state.grants[cid].kind}, cgroup {one_line(state.grants[cid].cgroup or '-')})"
              for cid in result.found]
    lines += [f"dropped {one_line(cid)} (in the damaged ledger, not running)" for cid in result.dropped]
    lines.append(f"{len(grants)} grant(s) recovered; see numa-pin status")
    print_result(args, out, lines)
    return 0


def fold(args: argparse.Namespace) -> int:
    from numa_pin.ledger.store import Ledger

    cfg = load(args)
    state, folded = Ledger(cfg.state_dir, lock_timeout=cfg.lock_timeout_s).fold()
    grants = sorted(state.grants.values(), key=lambda g: g.container_id)
    line = (f"the ledger's journal is folded into one version-4 snapshot ({len(grants)} grant(s)): "
            "a release from before the journal reads it" if folded else
            f"nothing to fold ({len(grants)} grant(s)): a release from before the journal reads this ledger")
    print_result(args, {"folded": folded, "grants": [grant_dict(g) for g in grants]}, [line])
    return 0
