"""``numa-pin explain ID``: why a container was rejected, or what it was granted."""

from __future__ import annotations

import argparse
import json
import sys

from numa_pin.cli.common import add_config_argument, load, resolve_id
from numa_pin.cli.main import write_out
from numa_pin.errors import RequestError

NAME = "explain"
HELP = "show why a container was rejected, or what it holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID", nargs="?", help="a container id, or a unique prefix of one")
    parser.add_argument("--last", action="store_true", help="the most recent rejection")


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.ledger.store import Ledger
    from numa_pin.report import read_reasons

    if (args.container_id is None) == (not args.last):
        raise RequestError("give an ID or --last (not both)", annotation="ID")
    config = load(args)
    grants = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s).read().grants
    reasons = read_reasons(config.state_dir)
    if args.last:
        if not reasons:
            print("numa-pin: no recorded rejection", file=sys.stderr)
            return 1
        cid = max(reasons, key=lambda c: _time(reasons[c]))
    else:
        found = resolve_id(args.container_id, set(grants) | set(reasons))
        if found is None:
            print(f"numa-pin: no grant and no recorded rejection for {args.container_id}", file=sys.stderr)
            return 1
        cid = found
    grant = grants.get(cid)
    if grant is not None and not args.last:
        write_out(json.dumps({"granted": grant_dict(grant)}, indent=2) + "\n")
        return 0
    write_out(str(reasons[cid].get("line", "")) + "\n")
    return 0


def _time(reason: dict[str, object]) -> float:
    value = reason.get("time")
    return float(value) if isinstance(value, (int, float)) else 0.0
