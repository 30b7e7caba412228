"""``numa-pin topology``: show the machine as numa-pin sees it.

``--sysfs-root`` defaults to ``/sys``. ``--proc-root`` defaults to ``/proc`` only when the
sysfs root is the default one: a fake sysfs tree is never mixed with the live ``/proc``.
Either root may be relative to the current directory.
"""

from __future__ import annotations

import argparse
import json
import os

from numa_pin.cli.main import write_out

NAME = "topology"
HELP = "show NUMA nodes, CPUs, memory, hugepages and PCI devices as numa-pin discovers them"

DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_PROC_ROOT = "/proc"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sysfs-root",
        default=DEFAULT_SYSFS_ROOT,
        metavar="DIR",
        help=f"sysfs tree to read (default {DEFAULT_SYSFS_ROOT})",
    )
    parser.add_argument(
        "--proc-root",
        default=None,
        metavar="DIR",
        help=f"proc tree for NVIDIA GPU identity and non-NUMA memory "
        f"(default {DEFAULT_PROC_ROOT} when the sysfs root is {DEFAULT_SYSFS_ROOT}, else none)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON (schema in docs/topology.md)"
    )
    parser.add_argument(
        "--pcie", action="store_true",
        help="print the PCIe distance between GPUs and NICs, as nvidia-smi topo -m does",
    )


def run(args: argparse.Namespace) -> int:
    """Discover and print. Raises TopologyError/SysfsError (one line at the CLI boundary)."""
    from numa_pin.cli.topology_render import render_text, to_json_dict
    from numa_pin.topology.discover import discover

    proc_root = args.proc_root
    if proc_root is None and os.path.normpath(args.sysfs_root) == DEFAULT_SYSFS_ROOT:
        proc_root = DEFAULT_PROC_ROOT
    from numa_pin.base.cpuset import format_list
    from numa_pin.topology.isolated import isolated_cpus

    topology = discover(args.sysfs_root, proc_root)
    isolated, nohz_full = isolated_cpus(args.sysfs_root)  # the kernel's isolcpus and nohz_full
    if args.json:
        doc = {**to_json_dict(topology), "isolated_cpus": format_list(isolated), "nohz_full": format_list(nohz_full)}
        write_out(json.dumps(doc, indent=2) + "\n")
    elif args.pcie:
        from numa_pin.devices.pcie import matrix_text

        write_out(matrix_text(topology))
    else:
        write_out(render_text(topology) + f"isolated cpus: {format_list(isolated) or 'none'} "
                  f"(nohz_full: {format_list(nohz_full) or 'none'})\n")
    return 0
