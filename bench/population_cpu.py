#!/usr/bin/env python3
"""CPU time of one admission and its release on a busy node, as the agent's child runs them.

The steadier companion of ``bench/population.py`` (whose wall times move with whatever else the
machine runs): the same fake ``amd-nps4-8node`` node carrying P shared + min(P/8, 48) exclusive
containers, then, ``--runs`` times, the agent spare's rehearsal (plan, ledger encoded, shared
cgroups checked) and ``NodeService.admit`` of a 1-CPU container and its ``release`` in that
process, timed with ``time.process_time`` (median). Where the tree has it, each request runs
as in the agent's child, leaving what can wait until after its reply (``WarmState.settle``:
the release's growth of the shared containers, the shared grants' turn at liveness), printed
apart. Every figure also as a ratio to the empty node in the same run.

``--baseline DIR`` runs this script again with ``DIR/src`` (an export of an older commit) first
on ``PYTHONPATH`` and prints its table too (a tree without the deferral has no settle column).

Usage: python bench/population_cpu.py [--runs N] [--sizes 0,100,400,2000] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = "amd-nps4-8node"
MAX_EXCLUSIVE = 48


def measure(sizes: list[int], runs: int) -> dict[int, tuple[float, float, float]]:
    """{P: (admit, release, settle) ms of CPU, medians} with whichever numa_pin comes first on the path."""
    from numa_pin.config.schema import config_from_dict
    from numa_pin.ledger import liveness
    from numa_pin.ledger.store import encode
    from numa_pin.requests.request import request_from_oci
    from numa_pin.resources.node import cpu as cpu_node
    from numa_pin.service import node as node_service
    from numa_pin.testing.node import FakeNode

    try:  # the agent child's state, one object per child (a tree before it kept module globals)
        from numa_pin.resources.node.warm import WarmState
    except ImportError:
        WarmState = None  # type: ignore[assignment, misc]
    deferring = WarmState is not None or hasattr(node_service, "defer_settling")
    make = getattr(node_service, "open_service", node_service.NodeService)  # a baseline may predate it
    warm = getattr(cpu_node, "warm", None)
    idle = getattr(liveness, "idle_grants", None)
    prepare = getattr(liveness, "prepare", None)

    # the same node as bench/population.py, which puts this tree's src first on the path as it
    # loads: the path is put back, so a baseline's modules stay the ones loaded (lazily too)
    saved = list(sys.path)
    from population import populate, write_process

    sys.path[:] = saved

    out: dict[int, tuple[float, float, float]] = {}
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-popcpu-", dir=shm) as tmp:
        for size in sizes:
            node = FakeNode(Path(tmp) / f"p{size}", SHAPE, parent="bench")
            cfg = node.config_dict(policy="restricted")
            populate(node, cfg, size)
            samples: list[tuple[float, float, float]] = []
            for run in range(runs + 1):
                kept = WarmState() if WarmState is not None else None
                # the spare's rehearsal, then the request
                svc = make(config_from_dict(cfg), **({} if kept is None else {"warm_state": kept}))
                svc.plan(request_from_oci("rehearsal", {"numa-pin.io/cpus": "1"}))
                read = svc.ledger.read()
                encode(read)
                if prepare is not None:
                    prepare(read, svc.boot_id)
                elif idle is not None:
                    idle(read)
                if warm is not None:
                    warm(svc, read)
                cid = f"probe{run}"
                pid = node.add_container(cid, 100_000 - run)
                write_process(node, pid)
                if deferring:  # as the agent's child runs a request
                    defer(kept)
                t0 = time.process_time()
                svc.admit(request_from_oci(cid, {"numa-pin.io/cpus": "1"}), pid)
                t1 = time.process_time()
                if deferring:
                    settle(kept)  # what the admission left until after its reply
                    defer(kept)
                t2 = time.process_time()
                svc.release(cid)
                t3 = time.process_time()
                if deferring:
                    settle(kept)
                t4 = time.process_time()
                if kept is not None:
                    kept.forget()  # the next spare starts cold (its descriptors closed, untimed)
                elif deferring:
                    cpu_node._REFS = cpu_node._LEAVES = None
                if run:
                    samples.append((t1 - t0, t3 - t2, (t2 - t1) + (t4 - t3)))
            out[size] = tuple(statistics.median(s[k] for s in samples) * 1000 for k in range(3))  # type: ignore[assignment]
    return out


def defer(kept) -> None:
    """What the agent's child does before it runs a request (either tree's way)."""
    if kept is not None:
        kept.defer()
    else:
        from numa_pin.service import node as node_service

        node_service.defer_settling()


def settle(kept) -> None:
    """And after its reply."""
    if kept is not None:
        kept.settle()
    else:
        from numa_pin.service import node as node_service

        node_service.settle_deferred()


def table(figures: dict[int, tuple[float, float, float]]) -> None:
    base = figures[min(figures)]
    print(f"{'containers':>10} {'admit':>18} {'release':>18} {'after the replies':>20}")
    for size, (admit, release, settle) in sorted(figures.items()):
        print(f"{size + min(size // 8, MAX_EXCLUSIVE):>10} {admit:8.1f} ms {admit / base[0]:6.1f}x "
              f"{release:8.1f} ms {release / base[1]:6.1f}x {settle:12.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sizes", default="0,100,400,2000")
    parser.add_argument("--baseline", metavar="DIR")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the baseline's run
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if sizes[0] != 0:
        sizes.insert(0, 0)
    if args.json:
        print(json.dumps(measure(sizes, args.runs)))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    figures = measure(sizes, args.runs)
    print(f"CPU time on {SHAPE}: P shared + min(P/8, {MAX_EXCLUSIVE}) exclusive containers, one 1-CPU admission "
          f"and its release after a rehearsal (median of {args.runs}); ratio to the empty node")
    table(figures)
    if args.baseline:
        env = dict(os.environ, PYTHONPATH=str(Path(args.baseline, "src").resolve()))
        proc = subprocess.run([sys.executable, __file__, "--json", "--runs", str(args.runs), "--sizes", args.sizes],
                              env=env, capture_output=True, text=True, check=True, timeout=3600)
        print(f"baseline ({args.baseline}):")
        table({int(k): tuple(v) for k, v in json.loads(proc.stdout).items()})  # type: ignore[misc]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
