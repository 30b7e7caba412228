"""``numa-pin release ID``: free a grant by hand (what the poststop hook does)."""

from __future__ import annotations

import argparse

from numa_pin.cli.common import add_config_argument, load
from numa_pin.text import one_line

NAME = "release"
HELP = "release the grant of a container or process and return its CPUs to the shared pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID")


def run(args: argparse.Namespace) -> int:
    from numa_pin.report import forget_reason
    from numa_pin.service import NodeService

    config = load(args)
    grant = NodeService(config).release(args.container_id)
    if grant is not None:
        forget_reason(config.state_dir, args.container_id)
    if grant is None:
        print(f"{one_line(args.container_id)}: no grant (already released)")
    else:
        print(f"{one_line(args.container_id)}: released")
    return 0
