"""``numa-pin serve [--socket PATH] [--log PATH]``: the optional warm agent for the OCI hook.

``numa-pin-hook`` hands its admission to this server when the socket answers and runs
in-process otherwise; see :mod:`numa_pin.agent.server` and ``docs/agent.md``. A hook that finds
no agent starts ``numa-pin serve --idle-exit 600`` itself.
"""

from __future__ import annotations

import argparse
import os

NAME = "serve"
HELP = "serve hook admissions from a warm process on a Unix socket (the hook falls back without it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="Unix socket to listen on (default: $NUMA_PIN_AGENT_SOCKET, else /run/numa-pin/agent.sock)",
    )
    parser.add_argument("--log", metavar="PATH", help="append one JSON line per request to PATH")
    parser.add_argument(
        "--idle-exit",
        metavar="SECONDS",
        type=float,
        help="stop after SECONDS without a hook, or when numa-pin's files change on disk "
        "(how numa-pin-hook starts an agent on demand)",
    )


def run(args: argparse.Namespace) -> int:
    from numa_pin.agent.protocol import socket_path
    from numa_pin.agent.server import serve

    if args.idle_exit is not None and not args.idle_exit > 0:
        from numa_pin.errors import RequestError

        raise RequestError(f"--idle-exit: {args.idle_exit:g} is not a positive number of seconds")
    _drop_earlier_boots()
    return serve(socket_path(os.environ, args.socket), log_path=args.log, idle_exit_s=args.idle_exit,
                 metrics_address=_metrics_address())


def _metrics_address() -> str | None:
    """The config's ``metrics_address`` (None: off, or a config that cannot be read now: each
    admission reports that itself)."""
    from numa_pin.config.load import load_config
    from numa_pin.errors import NumaPinError

    try:
        return load_config(None, os.environ).metrics_address
    except (NumaPinError, OSError):
        return None


def _drop_earlier_boots() -> None:
    """Grants of an earlier boot go (with a ``released`` line) as the agent starts; best effort:
    a config or ledger that cannot be read now is the first admission's to report."""
    from numa_pin.config.load import load_config
    from numa_pin.errors import NumaPinError
    from numa_pin.service import NodeService

    try:
        NodeService(load_config(None, os.environ)).drop_earlier_boots()
    except (NumaPinError, OSError):
        pass
