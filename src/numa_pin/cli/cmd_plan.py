"""``numa-pin plan``: what would numa-pin decide for a bundle or a request, changing nothing."""

from __future__ import annotations

import argparse
import json

from numa_pin.cli.common import add_node_arguments, add_request_arguments, load, request_from_args
from numa_pin.cli.main import write_out
from numa_pin.text import one_line

NAME = "plan"
HELP = "dry-run an admission for a bundle (--bundle) or for resource flags; changes nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print the decision as JSON")
    parser.add_argument("--bundle", metavar="DIR", help="OCI bundle whose config.json holds the request")
    add_request_arguments(parser)


def decision_dict(decision) -> dict:
    from numa_pin.cpuset import format_list

    return {
        "container_id": decision.container_id,
        "admit": decision.admit,
        "policy": decision.policy,
        "scope": decision.scope,
        "affinity": None if decision.hint.affinity is None else sorted(decision.hint.affinity),
        "preferred": decision.hint.preferred,
        "cpus": format_list(decision.cpus),
        "mems": format_list(decision.mems),
        "devices": {k: list(v) for k, v in decision.devices.items()},
        "memory": {k: {str(n): b for n, b in v.items()} for k, v in decision.memory.items()},
        "reason": decision.reason,
        # what an admission would note (a device numa-pin cannot place), as explain shows the grant's
        **({"notes": list(decision.notes)} if decision.notes else {}),
    }


def print_decision(decision, as_json: bool, request=None, isolation: dict | None = None) -> None:
    d = decision_dict(decision)
    if isolation:  # what each isolation knob would do, or why it cannot
        d["isolation"] = isolation
    if request is not None and request.qos is not None:  # CPUs inferred from the spec: say from what
        d["qos"] = {"class": request.qos, "signal": request.qos_signal}
    if as_json:
        write_out(json.dumps(d, indent=2) + "\n")
        return
    verdict = "admit" if d["admit"] else f"reject ({decision.error.kind})"
    lines = [
        f"container: {d['container_id']}",
        f"decision:  {verdict}",
        f"policy:    {d['policy']} (scope {d['scope']})",
        f"affinity:  {'any' if d['affinity'] is None else d['affinity']} "
        f"({'preferred' if d['preferred'] else 'not preferred'})",
    ]
    if "qos" in d:
        lines.append(f"qos:       pod {d['qos']['class']} (from {d['qos']['signal']})")
    lines += [f"isolation: {knob}: {line}" for knob, line in d.get("isolation", {}).items()]
    if d["admit"]:
        lines += [f"cpus:      {d['cpus'] or '(shared pool)'}", f"mems:      {d['mems'] or '(unchanged)'}"]
        lines += [f"devices:   {res}: {', '.join(ids)}" for res, ids in d["devices"].items()]
    lines += [f"note:      {note}" for note in d.get("notes", ())]
    lines.append(f"reason:    {d['reason']}")
    write_out("\n".join(one_line(line) for line in lines) + "\n")  # ids and reasons come from bundles


def _isolation(service, request, decision) -> dict[str, str]:
    """``{knob: what it would do, or "cannot: why"}`` for an admitted request that asks isolation."""
    if not decision.admit or request.isolation.empty:
        return {}
    from numa_pin.ledger.liveness import collect_garbage
    from numa_pin.resources.base import grant_from
    from numa_pin.resources.node.isolation import preview

    grant = grant_from(request, decision, pid=None, start_time=None, cgroup=None, kind=None, created=0.0)
    state, _ = collect_garbage(service.ledger.read(), service.alive)
    return preview(service, state.with_grant(grant), grant, applied=False)


def run(args: argparse.Namespace) -> int:
    from numa_pin.service import NodeService

    config = load(args)
    if args.bundle:
        import os

        from numa_pin.hook.admit import request_from_spec
        from numa_pin.hook.oci import OciState, load_spec

        bundle = os.path.abspath(args.bundle)
        spec = load_spec(bundle)
        state = OciState(id=os.path.basename(bundle), status="creating", pid=None, bundle=bundle)
        request = request_from_spec(state, spec, config)
    else:
        request = request_from_args(args, "plan", config.isolation)
    service = NodeService(config)
    decision = service.plan(request)
    print_decision(decision, args.json, request, _isolation(service, request, decision))
    return 0 if decision.admit else 1
