"""Pieces every operator subcommand shares: ``--config`` and building requests from flags."""

from __future__ import annotations

import argparse
import os

from numa_pin import names
from numa_pin.admission.request import ContainerRequest


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $NUMA_PIN_CONFIG, else /etc/numa-pin/config.yaml, else built-in defaults)",
    )


def load(args: argparse.Namespace):
    """The config named by ``--config`` / the environment; raises ConfigError."""
    from numa_pin.config.load import load_config

    return load_config(args.config, os.environ)


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """Resource flags mirroring the ``numa-pin.io/*`` annotations."""
    g = parser.add_argument_group("request (same meaning as the numa-pin.io/* annotations)")
    g.add_argument("--cpus", metavar="N", help="exclusive CPUs")
    g.add_argument("--memory", metavar="QTY", help="memory to align, e.g. 512Mi")
    g.add_argument("--hugepages-2Mi", dest="hugepages_2mi", metavar="QTY", help="2 MiB hugepages to align")
    g.add_argument("--hugepages-1Gi", dest="hugepages_1gi", metavar="QTY", help="1 GiB hugepages to align")
    g.add_argument("--devices", metavar="RES=N[,RES=N]", help="devices, e.g. nvidia.com/gpu=1")
    g.add_argument("--policy", choices=names.POLICIES,
                   help="override the node policy")
    g.add_argument("--scope", choices=names.SCOPES, help="override the node scope")
    g.add_argument("--pod", metavar="ID", help="pod this workload belongs to (pod scope)")


def request_from_args(args: argparse.Namespace, container_id: str) -> ContainerRequest:
    """Turn the flags into the annotations they mirror, so both paths validate alike."""
    from numa_pin.admission.request import PREFIX, request_from_oci

    annotations: dict[str, str] = {}
    for flag, key in (
        ("cpus", "cpus"), ("memory", "memory"), ("hugepages_2mi", "hugepages-2Mi"),
        ("hugepages_1gi", "hugepages-1Gi"), ("devices", "devices"), ("policy", "policy"),
        ("scope", "scope"), ("pod", "pod"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            annotations[PREFIX + key] = str(value)
    return request_from_oci(container_id, annotations)
