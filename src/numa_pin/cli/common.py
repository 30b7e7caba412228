"""Pieces every operator subcommand shares: ``--config`` and building requests from flags."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

from numa_pin import names
from numa_pin.admission.request import ContainerRequest
from numa_pin.errors import RequestError

#: the shortest id ``status`` prints (as podman and docker print 12 characters)
SHORT_ID = 12


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
    g.add_argument("--isolate", metavar="KNOB=VALUE", action="append", default=[],
                   help="isolate the exclusive CPUs, as numa-pin.io/KNOB: VALUE (cpu-quota=disable, "
                   "cpu-c-states=max_latency:10, cpu-freq-governor=performance, host-services=disable, "
                   "cpu-load-balancing=disable, irq-load-balancing=housekeeping); repeatable")


def request_from_args(args: argparse.Namespace, container_id: str, isolation=None) -> ContainerRequest:
    """Turn the flags into the annotations they mirror, so both paths validate alike.
    ``isolation``: the config's node defaults of the isolation knobs."""
    from numa_pin.admission.isolation import NUMA_PIN_KEYS
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
