"""``numa-pin release ID``: free a grant by hand (what the poststop hook does).

``--json``: ``{"container_id", "released": bool, "grant": <the freed grant as status lists it, or null>}``.
"""

from __future__ import annotations

import argparse
import json

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out

NAME = "release"
HELP = "release the grant of a container or process and return its CPUs to the shared pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID")
    parser.add_argument("--json", action="store_true", help="print what was released as JSON")


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.service import NodeService

    grant = NodeService(load(args)).release(args.container_id)
    if args.json:
        out = {"container_id": args.container_id, "released": grant is not None,
               "grant": None if grant is None else grant_dict(grant)}
        write_out(json.dumps(out, indent=2) + "\n")
    elif grant is None:
        write_out(f"{args.container_id}: no grant (already released)\n")
    else:
        write_out(f"{args.container_id}: released\n")
    return 0
