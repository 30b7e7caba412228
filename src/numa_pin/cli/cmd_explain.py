"""``numa-pin explain ID``: why a container was rejected, or what it was granted."""

from __future__ import annotations

import argparse
import json
import sys

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out
from numa_pin.text import one_line

NAME = "explain"
HELP = "show why a container was rejected, or what it holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID")


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.ledger.store import Ledger
    from numa_pin.report import reason_path

    config = load(args)
    grant = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s).read().grants.get(args.container_id)
    if grant is not None:
        write_out(json.dumps({"granted": grant_dict(grant)}, indent=2) + "\n")
        return 0
    path = reason_path(config.state_dir, args.container_id)
    try:
        with open(path, encoding="utf-8") as fp:
            reason = json.load(fp)
    except FileNotFoundError:
        print(f"numa-pin: no grant and no recorded rejection for {one_line(args.container_id)}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"numa-pin: {one_line(path)}: unreadable ({one_line(exc)})", file=sys.stderr)
        return 1
    write_out(one_line(reason.get("line", "")) + "\n")
    return 0
