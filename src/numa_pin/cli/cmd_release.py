"""``numa-pin release ID``: free a grant by hand (what the poststop hook does).

``ID`` is a container id or a unique prefix of one. A release that matches no grant exits 1.
``--json``: ``{"container_id", "released": bool, "grant": <the freed grant as status lists it, or null>}``.
"""

from __future__ import annotations

import argparse
import json
import sys

from numa_pin.cli.common import add_config_argument, load, resolve_id
from numa_pin.cli.main import write_out
from numa_pin.text import one_line

NAME = "release"
HELP = "release the grant of a container or process and return its CPUs to the shared pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID", help="a container id, or a unique prefix of one")
    parser.add_argument("--json", action="store_true", help="print what was released as JSON")


def run(args: argparse.Namespace) -> int:
    """Release the grant whose id is ``ID`` or starts with it; exit 1 when none does."""
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.report import forget_reason
    from numa_pin.service import NodeService

    service = NodeService(load(args))
    cid = resolve_id(args.container_id, service.ledger.read().grants)
    grant = service.release(cid) if cid is not None else None
    if grant is not None:
        forget_reason(service.config.state_dir, grant.container_id)
    if args.json:
        out = {"container_id": cid or args.container_id, "released": grant is not None,
               "grant": None if grant is None else grant_dict(grant)}
        write_out(json.dumps(out, indent=2) + "\n")
    elif grant is not None:
        write_out(f"{one_line(grant.container_id)}: released\n")
    if grant is None:
        print(f"numa-pin: no grant matches {one_line(repr(args.container_id))} (already released, or a wrong id; "
              "see numa-pin status)", file=sys.stderr)
        return 1
    return 0
