"""``numa-pin explain ID|--last``: why a container was rejected, or what it was granted.

``ID`` is a container id or a unique prefix of one (as git and podman take them); ``--last``
is the most recent rejection. Text: the grant as JSON, or the rejection line. ``--json``: one
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

from numa_pin.cli.common import add_node_arguments, grant_dict, load, resolve_id
from numa_pin.cli.main import write_out
from numa_pin.errors import RequestError
from numa_pin.text import one_line

NAME = "explain"
#: exit code when the id has neither a grant nor a recorded rejection
NOT_FOUND = 1
HELP = "show why a container was rejected, or what it holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print one JSON object (see the module doc)")
    parser.add_argument("container_id", metavar="ID", nargs="?", help="a container id, or a unique prefix of one")
    parser.add_argument("--last", action="store_true", help="the most recent rejection")


def run(args: argparse.Namespace) -> int:
    from numa_pin.ledger.store import Ledger
    from numa_pin.report import read_reasons

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
        cid = resolve_id(args.container_id, set(grants) | set(reasons))
        problem = f"no grant and no recorded rejection for {args.container_id}"
    out: dict[str, Any] = {"container_id": cid or args.container_id, "state": "unknown", "grant": None,
                           "rejection": None}
    grant = grants.get(cid) if cid is not None and not args.last else None
    if grant is not None:
        out.update(state="granted", grant=grant_dict(grant))
        from numa_pin.admission.kubernetes import qos_from_cgroups_path

        qos = qos_from_cgroups_path(grant.cgroup)
        if qos is not None:
            out["qos"] = {"class": qos, "signal": f"cgroup {grant.cgroup}"}
        if grant.isolation:  # what each isolation knob holds now, or why it cannot
            from numa_pin.resources.node.isolation import preview
            from numa_pin.service import NodeService

            service = NodeService(config)
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


def _time(reason: dict[str, object]) -> float:
    value = reason.get("time")
    return float(value) if isinstance(value, (int, float)) else 0.0
