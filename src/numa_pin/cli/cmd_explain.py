"""``numa-pin explain ID|--last``: why a container was rejected, or what it was granted.

``ID`` is a container id or a unique prefix of one (as git and podman take them), or a name:
the one a grant or a rejection recorded (a Kubernetes container's ``namespace/pod/container``),
else a podman container name, which ``podman container inspect`` turns into its id (podman
puts no name in the OCI config the hooks see); ``--last`` is the most recent rejection.
Text: the grant as JSON, or the rejection line. ``--json``: one
object, ``{"container_id", "state": "granted" | "rejected" | "unknown", "grant", "rejection"}``
where ``grant`` is what ``status --json`` lists and ``rejection`` the reason file
(``line``, ``kind``, ``time``); exit 1 when the state is ``unknown``. A grant that keeps IRQs off
its CPUs also says how (``"irq"``) and which IRQs the kernel would not move, with its reason
(``"irq_unmovable"``: per-CPU and kernel-managed interrupts). A Kubernetes container's
grant also says its pod's QoS class and the signal it was read from, ``"qos": {"class",
"signal"}``, when its cgroup sits under kubelet's QoS hierarchy (what the admission read from
``linux.cgroupsPath``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from numa_pin.base.text import one_line
from numa_pin.cli.common import add_node_arguments, grant_dict, load, resolve_id
from numa_pin.cli.main import write_out
from numa_pin.errors import RequestError

NAME = "explain"
#: exit code when the id has neither a grant nor a recorded rejection
NOT_FOUND = 1
HELP = "show why a container was rejected, or what it holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print one JSON object (see the module doc)")
    parser.add_argument("container_id", metavar="ID", nargs="?",
                        help="a container id or a unique prefix of one; or a Kubernetes namespace/pod/container "
                        "or podman container name")
    parser.add_argument("--last", action="store_true", help="the most recent rejection")


def run(args: argparse.Namespace) -> int:
    from numa_pin.ledger.store import Ledger
    from numa_pin.reporting.report import read_reasons

    if (args.container_id is None) == (not args.last):
        raise RequestError("give an ID or --last (not both)", annotation="ID")
    config = load(args)
    grants = Ledger(config.state_dir, lock_timeout=config.lock_timeout_s).read().grants
    reasons = read_reasons(config.state_dir)
    cid: str | None
    if args.last:
        cid = max(reasons, key=lambda c: _time(reasons[c])) if reasons else None
        problem = "no recorded rejection"
    else:
        cid = _resolve(args.container_id, grants, reasons)
        problem = f"no grant and no recorded rejection for {args.container_id}"
    out: dict[str, Any] = {"container_id": cid or args.container_id, "state": "unknown", "grant": None,
                           "rejection": None}
    grant = grants.get(cid) if cid is not None and not args.last else None
    if grant is not None:
        out.update(state="granted", grant=grant_dict(grant))
        from numa_pin.requests.kubernetes import qos_from_cgroups_path

        qos = qos_from_cgroups_path(grant.cgroup)
        if qos is not None:
            out["qos"] = {"class": qos, "signal": f"cgroup {grant.cgroup}"}
        if grant.isolation:  # what each isolation knob holds now, or why it cannot
            from numa_pin.resources.node.isolation import preview
            from numa_pin.service.node import open_service

            service = open_service(config)
            out["isolated"] = preview(service, service.ledger.read(), grant, applied=True)
        from numa_pin.resources.node.irq import explain as explain_irqs

        out.update(explain_irqs(config, grant))  # the IRQs kept off its CPUs, and those the kernel kept
    elif cid is not None:
        out.update(state="rejected", rejection=reasons[cid])
    if args.json:
        if out["state"] == "unknown":
            out["error"] = problem
        write_out(json.dumps(out, indent=2) + "\n")
        return 0 if out["state"] != "unknown" else 1
    if out["state"] == "unknown":
        print(f"numa-pin: {one_line(problem)}", file=sys.stderr)
        return 1
    if grant is not None:
        shown: dict[str, Any] = {"granted": out["grant"]}
        shown.update((k, out[k]) for k in ("qos", "isolated", "irq", "irq_unmovable") if k in out)
        write_out(json.dumps(shown, indent=2) + "\n")
        return 0
    write_out(one_line(out["rejection"].get("line", "")) + "\n")
    return 0


#: how long ``podman container inspect`` may take to name a container's id
PODMAN_TIMEOUT_S = 10.0
#: root podman's run directory (``tmp_dir``): there once podman has run as root since boot. podman
#: is asked only then, since a first call creates its storage on a node that never used it
PODMAN_RUN_DIR = "/run/libpod"


def _resolve(query: str, grants, reasons: dict[str, dict[str, object]]) -> str | None:
    """The container id ``query`` names: an id, a name a grant or rejection recorded, a unique
    id prefix, then a podman container name (None: none of them).

    Raises:
        RequestError: ``query`` is an ambiguous prefix, or a name several containers recorded.
    """
    ids = set(grants) | set(reasons)
    if query in ids:
        return query
    named = {cid for cid, g in grants.items() if g.container_name == query}
    named |= {cid for cid, r in reasons.items() if r.get("name") == query}
    if len(named) > 1:
        raise RequestError(f"{query!r} names {len(named)} containers: {', '.join(sorted(named))}; give an id",
                           annotation="ID")
    if named:
        return named.pop()
    return resolve_id(query, ids) or _podman_id(query)


def _podman_id(name: str) -> str | None:
    """The id of podman's container ``name`` (None: no podman, podman never ran as root since
    boot, or it knows no such container)."""
    import os
    import shutil
    import subprocess

    podman = shutil.which("podman")
    if podman is None or name.startswith("-") or not os.path.isdir(PODMAN_RUN_DIR):
        return None
    try:
        done = subprocess.run([podman, "container", "inspect", "--format", "{{.Id}}", name],
                              capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.split()
    return found[0] if done.returncode == 0 and len(found) == 1 else None


def _time(reason: dict[str, object]) -> float:
    value = reason.get("time")
    return float(value) if isinstance(value, (int, float)) else 0.0
