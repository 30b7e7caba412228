"""``numa-pin metrics [--textfile PATH]``: the node's Prometheus metrics, on stdout or as a
node_exporter textfile (:mod:`numa_pin.agent.metrics`), for nodes without the agent's listener."""

from __future__ import annotations

import argparse

from numa_pin.cli.common import add_config_argument, load
from numa_pin.cli.main import write_out

NAME = "metrics"
HELP = "print the node's Prometheus metrics, or write them as a node_exporter textfile"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--textfile", metavar="PATH",
                        help="replace PATH atomically (mode 0644) instead of printing, for node_exporter's "
                        "textfile collector (name it *.prom in its --collector.textfile.directory)")


def run(args: argparse.Namespace) -> int:
    from numa_pin.agent.metrics import exposition, write_textfile

    data = exposition(load(args))
    if args.textfile:
        write_textfile(args.textfile, data)
        return 0
    write_out(data.decode("utf-8"))
    return 0
