"""``numa-pin release ID``: free a grant by hand (what the poststop hook does)."""

from __future__ import annotations

import argparse

from numa_pin.cli.common import add_config_argument, load, resolve_id

NAME = "release"
HELP = "release the grant of a container or process and return its CPUs to the shared pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID", help="a container id, or a unique prefix of one")


def run(args: argparse.Namespace) -> int:
    """Release the grant whose id is ``ID`` or starts with it; exit 1 when none does."""
    import sys

    from numa_pin.service import NodeService

    service = NodeService(load(args))
    cid = resolve_id(args.container_id, service.ledger.read().grants)
    grant = service.release(cid) if cid is not None else None
    if grant is None:
        print(f"numa-pin: no grant matches {args.container_id!r} (already released, or a wrong id; "
              "see numa-pin status)", file=sys.stderr)
        return 1
    print(f"{grant.container_id}: released")
    return 0
