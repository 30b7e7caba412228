"""``numa-pin serve [--socket PATH] [--log PATH]``: the optional warm agent for the OCI hook;
``numa-pin serve --nri [--nri-socket PATH]``: numa-pin as an NRI plugin of containerd or CRI-O.

``numa-pin-hook`` hands its admission to this server when the socket answers and runs
in-process otherwise; see :mod:`numa_pin.agent.server` and ``docs/agent.md``. A hook that finds
no agent starts ``numa-pin serve --idle-exit 600`` itself. With ``--nri`` the runtime asks
instead of a hook (:mod:`numa_pin.nri.plugin`, ``docs/nri.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

NAME = "serve"
HELP = ("serve hook admissions from a warm process on a Unix socket (the hook falls back without it), "
        "or run as the runtime's NRI plugin (--nri)")


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
    parser.add_argument("--nri", action="store_true",
                        help="run as an NRI plugin: the runtime (containerd 1.7+, CRI-O) asks numa-pin at every "
                        "container creation and applies the answer itself")
    parser.add_argument("--nri-socket", metavar="PATH",
                        help="the runtime's NRI socket (default: /var/run/nri/nri.sock)")
    parser.add_argument("--nri-index", metavar="NN", help="the plugin's two-digit invocation index (default: 50)")
    parser.add_argument("--kubelet-config", metavar="PATH",
                        help="with --nri: kubelet's config file, read for its CPU and memory manager policies "
                        "(default: <kubelet_root>/config.yaml)")
    parser.add_argument("--allow-kubelet-static", action="store_true",
                        help="with --nri: start even when kubelet's CPU or memory manager runs the static policy "
                        "(its config or state files say so); numa-pin must then be kept off what kubelet pins")
    parser.add_argument("--nri-request-timeout", metavar="SECONDS", type=float, default=2.0,
                        help="the runtime's NRI request timeout when it does not announce one (containerd's "
                        "plugin_request_timeout; default: NRI's 2); an admission gets three quarters of it")
    from numa_pin.cli import serve_nrt

    serve_nrt.add_arguments(parser)  # --publish-nrt and its options


def run(args: argparse.Namespace) -> int:
    from numa_pin.agent.protocol import socket_path
    from numa_pin.agent.server import serve

    if args.idle_exit is not None and not args.idle_exit > 0:
        from numa_pin.errors import RequestError

        raise RequestError(f"--idle-exit: {args.idle_exit:g} is not a positive number of seconds")
    if args.nri:  # before anything is touched
        beside_kubelet(args.kubelet_config, args.allow_kubelet_static, sys.stderr)
    _drop_earlier_boots()
    from numa_pin.cli.serve_nrt import start

    start(args, os.environ)  # --publish-nrt: a thread of its own, never on an admission's path
    if args.nri:
        return _serve_nri(args)
    return serve(socket_path(os.environ, args.socket), log_path=args.log, idle_exit_s=args.idle_exit,
                 metrics_address=_metrics_address())


def _metrics_address() -> str | None:
    """The config's ``metrics_address`` (None: off, or a config that cannot be read now: each
    admission reports that itself)."""
    from numa_pin.config.load import entry_config
    from numa_pin.errors import NumaPinError

    try:
        return entry_config(None, os.environ)[0].metrics_address
    except (NumaPinError, OSError):
        return None


def _serve_nri(args: argparse.Namespace) -> int:
    from numa_pin.config.load import entry_config
    from numa_pin.nri.messages import load
    from numa_pin.nri.plugin import DEFAULT_SOCKET, serve
    from numa_pin.service.node import NodeService, open_service

    def make_service() -> NodeService:
        return open_service(*entry_config(None, os.environ, cwd="/", cached=True))

    if not args.nri_request_timeout > 0:
        from numa_pin.errors import RequestError

        raise RequestError(f"--nri-request-timeout: {args.nri_request_timeout:g} is not a positive number of seconds")
    return serve(args.nri_socket or DEFAULT_SOCKET, make_service, load(), index=args.nri_index,
                 request_timeout_s=args.nri_request_timeout)


def beside_kubelet(kubelet_config: str | None, allowed: bool, err: Any) -> None:
    """Refuse to run beside kubelet's static CPU or memory manager (:mod:`numa_pin.cluster.kubeletpolicy`,
    under the config's ``kubelet_root``), or, ``allowed``, say on ``err`` what was allowed.
    Raises KubeletConflictError (exit 1) or KubeletError (a file numa-pin cannot read)."""
    from numa_pin.cluster.kubeletpolicy import DEFAULT_KUBELET_ROOT, refuse_static, static_warnings
    from numa_pin.config.load import entry_config
    from numa_pin.errors import NumaPinError

    try:
        kubelet_root = entry_config(None, os.environ)[0].kubelet_root
    except (NumaPinError, OSError):  # the first admission reports the config itself
        kubelet_root = DEFAULT_KUBELET_ROOT
    if not allowed:
        refuse_static(kubelet_root, kubelet_config)
        return
    for line in static_warnings(kubelet_root, kubelet_config):
        print(line, file=err, flush=True)


def _drop_earlier_boots() -> None:
    """Grants of an earlier boot go (with a ``released`` line) as the agent starts; best effort:
    a config or ledger that cannot be read now is the first admission's to report."""
    from numa_pin.config.load import entry_config
    from numa_pin.errors import NumaPinError
    from numa_pin.service.node import open_service

    try:
        open_service(entry_config(None, os.environ)[0]).drop_earlier_boots()
    except (NumaPinError, OSError):
        pass
