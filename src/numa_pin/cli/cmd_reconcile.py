"""``numa-pin reconcile``: drop grants of dead containers and repair drifted cpusets."""

from __future__ import annotations

import argparse

from numa_pin.cli.common import add_config_argument, load
from numa_pin.text import one_line

NAME = "reconcile"
HELP = "drop grants whose process and cgroup are gone; re-assert cpusets that drifted"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    from numa_pin.service import NodeService

    removed, repaired = NodeService(load(args)).reconcile()
    for g in removed:
        print(f"dropped {one_line(g.container_id)} (process and cgroup gone)")
    for cid in repaired:
        print(f"repaired cpuset of {one_line(cid)}")
    if not removed and not repaired:
        print("nothing to do")
    return 0
