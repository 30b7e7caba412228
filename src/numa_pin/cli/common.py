"""Pieces every operator subcommand shares: ``--config`` and ``--json``, opening the node,
printing a result as JSON or as lines, a grant as every command lists it, and building requests
from flags."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable

from numa_pin.base import names
from numa_pin.cli.main import write_out
from numa_pin.errors import RequestError
from numa_pin.requests.request import ContainerRequest

#: the shortest id ``status`` prints (as podman and docker print 12 characters)
SHORT_ID = 12


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $NUMA_PIN_CONFIG, else /etc/numa-pin/config.yaml, else built-in defaults)",
    )


def add_node_arguments(parser: argparse.ArgumentParser, json_help: str) -> None:
    """``--config`` and ``--json`` (what ``json_help`` says is printed), for a command that
    reads or changes this node's ledger."""
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help=json_help)


def node_arguments(json_help: str) -> Callable[[argparse.ArgumentParser], None]:
    """The ``add_arguments`` of a command that takes nothing but :func:`add_node_arguments`."""
    return lambda parser: add_node_arguments(parser, json_help)


def load(args: argparse.Namespace):
    """The config named by ``--config`` / the environment; raises ConfigError."""
    from numa_pin.config.load import entry_config

    return entry_config(args.config, os.environ)[0]


def open_node(args: argparse.Namespace):
    """The :class:`~numa_pin.service.node.NodeService` of the config ``args`` name."""
    from numa_pin.service.node import open_service

    return open_service(load(args))


def print_result(args: argparse.Namespace, doc: object, lines: Iterable[str]) -> None:
    """``doc`` as indented JSON with ``--json``, else ``lines``, one each."""
    if args.json:
        write_out(json.dumps(doc, indent=2) + "\n")
    else:
        write_out("".join(line + "\n" for line in lines))


def grant_dict(g) -> dict:
    """A grant as ``status --json`` lists it (and every command that prints grants)."""
    from numa_pin.base.cpuset import format_list

    pod, name = pod_and_name(g.container_name)
    return {
        "container_id": g.container_id, "pod_id": g.pod_id, "pod": pod, "name": name, "kind": g.kind,
        "pid": g.pid, "cgroup": g.cgroup, "cpus": format_list(g.cpus), "mems": format_list(g.mems),
        "devices": {k: list(v) for k, v in g.devices.items()},
        "affinity": None if g.affinity is None else sorted(g.affinity),
        "policy": g.policy, "scope": g.scope, "created": g.created,
        **({"notes": list(g.notes)} if g.notes else {}),
        **({"isolation": dict(g.isolation)} if g.isolation else {}),
    }


def pod_and_name(container_name: str) -> tuple[str | None, str]:
    """A Kubernetes container's grant is named ``namespace/pod/container`` (namespaces, pods and
    containers have no ``/`` in their names): ``("namespace/pod", "container")``; any other
    name has no pod name."""
    pod, _, name = container_name.rpartition("/")
    return (pod, name) if pod.count("/") == 1 and all(pod.split("/")) and name else (None, container_name)


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
    g.add_argument("--memory-policy", dest="memory_policy", metavar="MODE",
                   help="bind, interleave, preferred-many or weighted-interleave over the granted nodes")
    g.add_argument("--memory-tier", dest="memory_tier", metavar="TIER",
                   help="add the NUMA nodes of this memory_tiers entry (CXL, HBM) to the memory nodes")
    g.add_argument("--isolate", metavar="KNOB=VALUE", action="append", default=[],
                   help="isolate the exclusive CPUs, as numa-pin.io/KNOB: VALUE (cpu-quota=disable, "
                   "cpu-c-states=max_latency:10, cpu-freq-governor=performance, host-services=disable, "
                   "cpu-load-balancing=disable, irq-load-balancing=housekeeping); repeatable")


def request_from_args(args: argparse.Namespace, container_id: str, isolation=None) -> ContainerRequest:
    """Turn the flags into the annotations they mirror, so both paths validate alike.
    ``isolation``: the config's node defaults of the isolation knobs."""
    from numa_pin.requests.isolation import NUMA_PIN_KEYS
    from numa_pin.requests.request import PREFIX, request_from_oci

    annotations: dict[str, str] = {}
    for flag, key in (
        ("cpus", "cpus"), ("memory", "memory"), ("hugepages_2mi", "hugepages-2Mi"),
        ("hugepages_1gi", "hugepages-1Gi"), ("devices", "devices"), ("policy", "policy"),
        ("scope", "scope"), ("pod", "pod"), ("memory_policy", "memory-policy"), ("memory_tier", "memory-tier"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            annotations[PREFIX + key] = str(value)
    for item in getattr(args, "isolate", None) or ():
        knob, sep, value = item.partition("=")
        if not sep or knob not in NUMA_PIN_KEYS:
            raise RequestError(f"expected KNOB=VALUE with KNOB one of {', '.join(NUMA_PIN_KEYS)}; got {item!r}",
                               annotation="--isolate")
        annotations[PREFIX + knob] = value
    try:
        return request_from_oci(container_id, annotations, isolation=isolation)
    except RequestError as exc:  # name the flag the user typed, not the annotation it mirrors
        key = exc.annotation or ""
        if not key.startswith(PREFIX):
            raise
        message = str(exc).removeprefix(f"{key}: ")
        flag = key[len(PREFIX):]
        if flag in NUMA_PIN_KEYS:
            flag = f"isolate {flag}"
        raise RequestError(message, annotation="--" + flag) from exc


def resolve_id(query: str, candidates: Iterable[str]) -> str | None:
    """The id ``query`` names, as git and podman resolve them: an exact match, else the one
    candidate it is a prefix of. ``None`` when nothing matches.

    Raises:
        RequestError: ``query`` is empty, or a prefix of several ids (they are listed).
    """
    if not query:
        raise RequestError("an empty id names nothing", annotation="ID")
    ids = set(candidates)
    if query in ids:
        return query
    hits = sorted(c for c in ids if c.startswith(query))
    if len(hits) > 1:
        shown = ", ".join(hits[:8]) + (f" and {len(hits) - 8} more" if len(hits) > 8 else "")
        raise RequestError(f"{query!r} is a prefix of {len(hits)} ids: {shown}; give more of the id", annotation="ID")
    return hits[0] if hits else None


def short_ids(ids: Iterable[str], minimum: int = SHORT_ID) -> dict[str, str]:
    """Each id cut to its shortest prefix (at least ``minimum`` characters) that
    :func:`resolve_id` maps back to it among ``ids``."""
    pool = sorted(set(ids))
    out: dict[str, str] = {}
    for cid in pool:
        length = min(minimum, len(cid))
        while length < len(cid) and any(o != cid and o.startswith(cid[:length]) for o in pool):
            length += 1
        out[cid] = cid[:length]
    return out
