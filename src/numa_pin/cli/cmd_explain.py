"""``numa-pin explain ID``: why a container was rejected, or what it was granted.

Looks up the exact id (reason files are keyed by a hash of it). Exits 0 when it has an answer,
1 when there is neither a grant nor a recorded rejection, 4 when the reason file is unreadable.
"""

from __future__ import annotations

import argparse
import json
import sys

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out
from numa_pin.errors import EXIT_ERROR
from numa_pin.text import one_line

NAME = "explain"
#: exit code when the id has neither a grant nor a recorded rejection
NOT_FOUND = 1
HELP = "show why a container was rejected, or what it holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID")


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.ledger.store import Ledger
    from numa_pin.report import read_reason, reason_path

    config = load(args)
    grant = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s).read().grants.get(args.container_id)
    if grant is not None:
        write_out(json.dumps({"granted": grant_dict(grant)}, indent=2) + "\n")
        return 0
    try:
        reason = read_reason(config.state_dir, args.container_id)
    except FileNotFoundError:  # no state directory yet
        reason = None
    except (OSError, ValueError) as exc:
        path = reason_path(config.state_dir, args.container_id)
        print(f"numa-pin: {one_line(path)}: unreadable ({one_line(exc)})", file=sys.stderr)
        return EXIT_ERROR
    if reason is None:
        print(f"numa-pin: no grant and no recorded rejection for {one_line(args.container_id)}", file=sys.stderr)
        return NOT_FOUND
    write_out(one_line(reason.get("line", "")) + "\n")
    return 0
