"""``numa-pin plan``: what would numa-pin decide for a bundle or a request, changing nothing."""

from __future__ import annotations

import argparse
import json

from numa_pin.base.text import one_line
from numa_pin.cli.common import add_node_arguments, add_request_arguments, load, request_from_args
from numa_pin.cli.main import write_out

NAME = "plan"
HELP = "dry-run an admission for a bundle (--bundle) or for resource flags; changes nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, "print the decision as JSON")
    parser.add_argument("--bundle", metavar="DIR", help="OCI bundle whose config.json holds the request")
    parser.add_argument("--via", choices=PATHS, metavar="PATH",
                        help=f"the path the container would come in by ({', '.join(PATHS)}): a request it cannot "
                             "carry is refused as that path refuses it (default: say what each path would do)")
    add_request_arguments(parser)


#: the paths ``--via`` names; ``precreate`` is a runtime of runtime-spec 1.3 or later unless the
#: bundle's ``ociVersion`` says otherwise
PATHS = ("prestart", "precreate", "nri", "run")


def targets(doc: dict | None) -> dict:
    """Each path's :class:`~numa_pin.resources.runtime.RuntimeTarget` (``doc``: the bundle's config)."""
    from numa_pin.resources.runtime import NRI, PRESTART, RUN, precreate_target

    precreate = precreate_target(True, True, True)
    if doc is not None:
        from numa_pin.hook.precreate import runtime_features

        features = runtime_features(doc)
        precreate = precreate_target(features.memory_policy, features.net_devices, features.exec_affinity)
    return {"prestart": PRESTART, "precreate": precreate, "nri": NRI, "run": RUN}


def path_verdicts(resources, request, paths: dict) -> dict[str, str]:
    """``{path: "" (it can carry the request) or why it cannot}``."""
    from numa_pin.errors import PathLimitError
    from numa_pin.resources.base import path_refusal

    out: dict[str, str] = {}
    for name, target in paths.items():
        try:
            path_refusal(resources, request, target)
            out[name] = ""
        except PathLimitError as exc:
            out[name] = str(exc)
    return out


def decision_dict(decision) -> dict:
    from numa_pin.base.cpuset import format_list

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


def print_decision(decision, as_json: bool, request=None, isolation: dict | None = None,
                   paths: dict[str, str] | None = None) -> None:
    d = decision_dict(decision)
    if isolation:  # what each isolation knob would do, or why it cannot
        d["isolation"] = isolation
    if paths:  # which paths can carry the request, and why the others cannot
        d["paths"] = paths
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
    lines += [f"path:      {name}: {why or 'carries it'}" for name, why in d.get("paths", {}).items()]
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
    from numa_pin.service.node import open_service

    config = load(args)
    doc = None
    if args.bundle:
        import os

        from numa_pin.base.boundedio import read_regular_file
        from numa_pin.hook.admit import request_from_spec
        from numa_pin.hook.oci import MAX_DOCUMENT_BYTES, OciState, load_object, load_spec

        bundle = os.path.abspath(args.bundle)
        spec = load_spec(bundle)  # checked there: read again for its ociVersion
        doc = load_object(read_regular_file(os.path.join(bundle, "config.json"), MAX_DOCUMENT_BYTES), "config.json")
        state = OciState(id=os.path.basename(bundle), status="creating", pid=None, bundle=bundle)
        request = request_from_spec(state, spec, config)
    else:
        request = request_from_args(args, "plan", config.isolation)
    service = open_service(config)
    paths = targets(doc)
    verdicts = path_verdicts(service.resources, request, paths if args.via is None else {args.via: paths[args.via]})
    decision = service.plan(request)
    if args.via is not None and verdicts[args.via]:
        decision = _refused(decision, verdicts[args.via])
    print_decision(decision, args.json, request, _isolation(service, request, decision), verdicts)
    return 0 if decision.admit else 1


def _refused(decision, why: str):
    """``decision`` as the path's refusal: nothing granted, the path's reason."""
    from numa_pin.base.record import replace
    from numa_pin.errors import PathLimitError

    return replace(decision, admit=False, cpus=frozenset(), mems=frozenset(), devices={}, memory={}, reason=why,
                   error=PathLimitError)
