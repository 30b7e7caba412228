"""``numa-pin serve --publish-nrt``: the serving process keeps this node's NodeResourceTopology
current in the API server (:mod:`numa_pin.cluster.nrtpublish`), as the pod's service account.

The object is the one ``numa-pin nrt`` prints (:func:`numa_pin.cli.cmd_nrt.node_builder`, the
config's roots); it is published at start, then after every change of the ledger (an admission,
a release, a synchronisation), at most once every ``--nrt-interval`` seconds, from a thread of
its own: no admission waits on the API server.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from numa_pin.base.text import cut, one_line
from numa_pin.cluster.kubeapi import DEFAULT_SERVICEACCOUNT_DIR
from numa_pin.cluster.nrtpublish import DEFAULT_INTERVAL_S

#: the variable the DaemonSet sets from the downward API (``spec.nodeName``)
NODE_NAME_ENV = "NODE_NAME"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--publish-nrt", action="store_true",
                        help="keep this node's NodeResourceTopology current in the API server (in a pod: "
                        "the service account's token and CA, KUBERNETES_SERVICE_HOST/PORT)")
    parser.add_argument("--nrt-interval", metavar="SECONDS", type=float, default=DEFAULT_INTERVAL_S,
                        help=f"with --publish-nrt: at most one publish every SECONDS (default {DEFAULT_INTERVAL_S:g})")
    parser.add_argument("--node-name", metavar="NAME",
                        help=f"with --publish-nrt: the object's name (default ${NODE_NAME_ENV}, else the host name)")
    parser.add_argument("--serviceaccount-dir", metavar="DIR", default=DEFAULT_SERVICEACCOUNT_DIR,
                        help=f"with --publish-nrt: the service account's token and ca.crt "
                        f"(default {DEFAULT_SERVICEACCOUNT_DIR})")


def start(args: argparse.Namespace, env: Mapping[str, str]):  # -> Publisher | None
    """The running publisher, or None without ``--publish-nrt``.

    Nothing of the API server or the node is touched here: the thread reads the node and finds
    the pod's account itself, so a node without an API server (no service account mounted, a
    config that does not load yet) serves admissions all the same, and the publisher logs why
    in one line and tries again with its backoff.

    Raises:
        RequestError: ``--nrt-interval`` is not positive.
    """
    if not args.publish_nrt:
        return None
    import socket

    from numa_pin.cluster.nrtpublish import Publisher
    from numa_pin.errors import RequestError

    if not args.nrt_interval > 0:
        raise RequestError(f"--nrt-interval: {args.nrt_interval:g} is not a positive number of seconds")
    node_name = args.node_name or env.get(NODE_NAME_ENV) or socket.gethostname()
    made: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        if "build" not in made:  # the topology is read once, in the thread
            from numa_pin.cli.cmd_nrt import node_builder, pod_resources_socket
            from numa_pin.config.load import entry_config

            config, _ = entry_config(None, env)
            made["build"], watched = node_builder(config, config.sysfs_root, config.proc_root, node_name,
                                                  socket_path=pod_resources_socket(None, config.kubelet_root))
            publisher.watched = watched
        return made["build"]()

    def send(obj: dict[str, Any]) -> str:
        from numa_pin.cluster.kubeapi import ApiServer
        from numa_pin.cluster.nrtpublish import publish

        if "api" not in made:
            made["api"] = ApiServer.in_cluster(env, args.serviceaccount_dir)
            _log(f"numa-pin: publishing NodeResourceTopology {node_name} to {made['api'].base} "
                 f"(at most every {args.nrt_interval:g}s)")
        return publish(made["api"], obj)

    publisher = Publisher(build, send, log=_log, interval_s=args.nrt_interval)
    return publisher.start()


def _log(line: str) -> None:
    print(cut(one_line(line)), file=sys.stderr, flush=True)


__all__ = ["NODE_NAME_ENV", "add_arguments", "start"]
