"""``numa-pin explain ID``: why a container was rejected, or what it was granted.

Text: the grant as JSON, or the rejection line. ``--json``: one object,
``{"container_id", "state": "granted" | "rejected" | "unknown", "grant", "rejection"}`` where
``grant`` is what ``status --json`` lists and ``rejection`` the reason file
(``line``, ``kind``, ``time``); exit 1 when the state is ``unknown``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out

NAME = "explain"
HELP = "show why a container was rejected, or what it holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("container_id", metavar="ID")
    parser.add_argument("--json", action="store_true", help="print one JSON object (see the module doc)")


def run(args: argparse.Namespace) -> int:
    from numa_pin.cli.cmd_status import grant_dict
    from numa_pin.ledger.store import Ledger
    from numa_pin.report import reason_path

    config = load(args)
    cid = args.container_id
    out: dict[str, Any] = {"container_id": cid, "state": "unknown", "grant": None, "rejection": None}
    grant = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s).read().grants.get(cid)
    if grant is not None:
        out.update(state="granted", grant=grant_dict(grant))
        if args.json:
            write_out(json.dumps(out, indent=2) + "\n")
        else:
            write_out(json.dumps({"granted": out["grant"]}, indent=2) + "\n")
        return 0
    path = reason_path(config.state_dir, cid)
    problem = None
    try:
        with open(path, encoding="utf-8") as fp:
            reason = json.load(fp)
        if not isinstance(reason, dict):
            raise ValueError("not a JSON object")
        out.update(state="rejected", rejection=reason)
    except FileNotFoundError:
        problem = f"no grant and no recorded rejection for {cid}"
    except (OSError, ValueError) as exc:
        problem = f"{path}: unreadable ({exc})"
    if args.json:
        if problem:
            out["error"] = problem
        write_out(json.dumps(out, indent=2) + "\n")
        return 0 if out["state"] == "rejected" else 1
    if problem:
        print(f"numa-pin: {problem}", file=sys.stderr)
        return 1
    write_out(str(out["rejection"].get("line", "")) + "\n")
    return 0
