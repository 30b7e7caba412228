#!/usr/bin/env python3
"""The NRI plugin on a busy node (issue 34 item 6): Synchronize and CreateContainer at 0 and N.

A fake ``intel-2s-ht`` node (32 CPUs, cgroup v1 tree, a live process per container in the proc
tree) with N running BestEffort containers (10 per pod) that numa-pin holds no grant for, as a
node looks to a plugin that was away. The plugin's service (:class:`numa_pin.nri.plugin.Handler`,
protobuf requests in and answers out, as the runtime's ttrpc hands them over) is timed:

* ``Synchronize`` of the empty node and of the N unknown containers (one message; a fresh service,
  as after a plugin restart). containerd waits 2 s for the whole answer.
* ``CreateContainer`` of one more BestEffort (shared) and one Guaranteed (2 exclusive CPUs)
  container, each removed again untimed, ``--runs`` times (median), on the empty node and on the
  node carrying the N containers' grants. Where a Synchronize left some of them without a grant
  (an older numa-pin runs out of time), the rest are written straight into the ledger first, so
  both trees are timed at the same population.

``--baseline-src DIR`` runs the same worker on another checkout's ``src/`` (``git worktree add
/tmp/base <commit>``, then ``--baseline-src /tmp/base/src``) in the same run, after this one; its
figures come first. Each tree runs in its own process (``PYTHONPATH``), so neither sees the other's
modules. Figures are seconds (milliseconds for the medians) and the ratios N / empty.

Usage: python bench/nri_busy.py [--containers N] [--runs R] [--baseline-src DIR]
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHAPE = "intel-2s-ht"
BTIME = 1_700_000_000
PID_BASE = 100_000
PER_POD = 10
RUNNING, GI = 3, 1 << 30


def write_process(root: Path, pid: int) -> None:
    """A live process in the fake proc tree: ``/proc/<pid>/stat`` with a start time."""
    fields = ["S", "1"] + ["0"] * 17 + ["100"] + ["0"] * 30  # field 22 (starttime) = 100 ticks
    (root / str(pid) / "stat").write_text(f"{pid} (sleep) {' '.join(fields)}\n")


class Bench:
    """One tree's worker: the fake node, NRI's messages, and a plugin service per connection."""

    def __init__(self, root: Path, runs: int) -> None:
        from numa_pin.config.schema import config_from_dict
        from numa_pin.nri import messages
        from numa_pin.testing.node import FakeNode

        self.node = FakeNode(root / "n", SHAPE, parent="")
        (self.node.proc_root / "stat").write_text(f"cpu 0 0 0 0\nbtime {BTIME}\n")
        self.config = config_from_dict(self.node.config_dict(policy="restricted"))
        self.m = messages.load()
        self.runs = runs
        self.probes = 0

    def handler(self) -> Any:
        """A freshly connected plugin (a new service: the config and ledger read again), configured."""
        import importlib

        from numa_pin.nri.plugin import Handler

        try:  # the service's module; a baseline from before the package root was split has it at the root
            service = importlib.import_module("numa_pin.service.node")
        except ModuleNotFoundError:
            service = importlib.import_module("numa_pin.service")
        # a baseline from before open_service builds the service itself
        make = getattr(service, "open_service", service.NodeService)
        handler = Handler(make(self.config), self.m, lambda line: None)
        request = self.m.api("ConfigureRequest")(runtime_name="containerd", runtime_version="v1.7.24",
                                                 request_timeout=2000)
        self._call(handler, "Configure", request)
        return handler

    def _call(self, handler: Any, method: str, request: Any) -> float:
        took, _ = self._timed(handler, method, request)
        return took

    def _timed(self, handler: Any, method: str, request: Any) -> tuple[float, float]:
        """(wall, CPU) seconds of one call; the CPU time is this process's, so a machine busy with
        other work inflates the wall time and not it."""
        started, cpu = time.perf_counter(), time.process_time()
        code, text, _ = handler.call(method, request.SerializeToString())
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        if code:
            raise SystemExit(f"{method}: {text}")
        return took, cpu

    def pod(self, uid: str, qos: str) -> Any:
        msg = self.m.api("PodSandbox")(id=f"sandbox-{uid}", name=uid, uid=uid, namespace="default")
        msg.linux.cgroup_parent = "/".join(p for p in ("/kubepods", qos, f"pod{uid}") if p)
        return msg

    def container(self, pod: Any, cid: str, cpu_milli: int = 0, pid: int = 0) -> Any:
        msg = self.m.api("Container")(id=cid, pod_sandbox_id=pod.id, name=cid, state=RUNNING if pid else 0, pid=pid)
        msg.annotations.update({"io.kubernetes.cri.container-type": "container",
                                "io.kubernetes.cri.container-name": cid, "io.kubernetes.cri.sandbox-id": pod.id,
                                "io.kubernetes.cri.sandbox-name": pod.name,
                                "io.kubernetes.cri.sandbox-namespace": "default"})
        msg.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{cid}"
        cpu = msg.linux.resources.cpu
        cpu.shares.value, cpu.period.value = max(2, cpu_milli * 1024 // 1000), 100000
        if cpu_milli:
            cpu.quota.value = cpu_milli * 100
            msg.linux.resources.memory.limit.value = GI
        return msg

    def running(self, n: int) -> tuple[list[Any], list[Any]]:
        """N running BestEffort containers on the node (cgroups and processes), as NRI lists them."""
        pods, containers = [], []
        for i in range(n):
            if i % PER_POD == 0:
                pods.append(self.pod(f"busy{i // PER_POD}", "besteffort"))
            ctr = self.container(pods[-1], f"busy{i}", pid=PID_BASE + i)
            rel = ctr.linux.cgroups_path.lstrip("/")
            self.node.add_container(rel, PID_BASE + i)
            write_process(self.node.proc_root, PID_BASE + i)
            containers.append(ctr)
        return pods, containers

    def synchronize(self, pods: list[Any], containers: list[Any]) -> tuple[tuple[float, float], Any]:
        handler = self.handler()
        took = self._timed(handler, "Synchronize", self.m.api("SynchronizeRequest")(pods=pods, containers=containers))
        return took, handler

    def creates(self, handler: Any) -> dict[str, tuple[float, float]]:
        """Median (wall, CPU) CreateContainer of a shared and of an exclusive container (each
        removed after)."""
        out = {}
        for label, qos, milli in (("shared", "besteffort", 0), ("exclusive", "", 2000)):
            times = []
            for _ in range(self.runs + 1):  # the first one warms caches
                self.probes += 1
                pod = self.pod(f"probe{self.probes}", qos)
                ctr = self.container(pod, f"probe{self.probes}", cpu_milli=milli)
                times.append(self._timed(handler, "CreateContainer",
                                         self.m.api("CreateContainerRequest")(pod=pod, container=ctr)))
                self._call(handler, "RemoveContainer", self.m.api("RemoveContainerRequest")(pod=pod, container=ctr))
            out[label] = (statistics.median(t[0] for t in times[1:]), statistics.median(t[1] for t in times[1:]))
        return out

    def fill_ledger(self, handler: Any, pods: list[Any], containers: list[Any]) -> int:
        """Write a shared grant for each container the Synchronize left without one; how many."""
        from numa_pin.ledger.model import Grant

        service = handler.service
        start = BTIME + 100 / os.sysconf("SC_CLK_TCK")
        with service.ledger.transaction() as txn:
            state, added = txn.state, 0
            for ctr in containers:
                if ctr.id not in state.grants:
                    state = state.with_grant(Grant(ctr.id, ctr.pod_sandbox_id, ctr.name, "shared", pid=ctr.pid,
                                                   start_time=start, cgroup=ctr.linux.cgroups_path,
                                                   policy="restricted", created=time.time()))
                    added += 1
            txn.state = state
        return added

    def run(self, n: int) -> dict[str, Any]:
        sync_empty, handler = self.synchronize([], [])
        create_empty = self.creates(handler)
        pods, containers = self.running(n)
        sync_busy, handler = self.synchronize(pods, containers)
        adopted = len(handler.service.ledger.read().grants)
        filled = self.fill_ledger(handler, pods, containers)
        create_busy = self.creates(handler)
        return {"containers": n, "sync_empty_s": sync_empty, "sync_busy_s": sync_busy, "adopted": adopted,
                "filled": filled, "create_empty_s": create_empty, "create_busy_s": create_busy}


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(args.src))
    with tempfile.TemporaryDirectory(prefix="nri-busy-") as tmp:
        print(json.dumps(Bench(Path(tmp), args.runs).run(args.containers)))
    return 0


def measure(src: Path, containers: int, runs: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
    env["PYTHONPATH"] = str(src)
    cmd = [sys.executable, __file__, "--worker", "--src", str(src), "--containers", str(containers),
           "--runs", str(runs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"the worker on {src} failed: {proc.stderr.strip()[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def report(label: str, r: dict[str, Any]) -> None:
    n = r["containers"]
    print(f"{label}:")
    (empty_s, empty_cpu), (busy_s, busy_cpu) = r["sync_empty_s"], r["sync_busy_s"]
    print(f"  Synchronize, 0 containers:            {empty_s:8.3f} s (CPU {empty_cpu:.3f} s)")
    print(f"  Synchronize, {n} unknown containers: {busy_s:8.3f} s (CPU {busy_cpu:.3f} s)  "
          f"({r['adopted']} adopted; {r['filled']} written in afterwards)")
    for kind in ("shared", "exclusive"):
        (empty, empty_cpu), (busy, busy_cpu) = r["create_empty_s"][kind], r["create_busy_s"][kind]
        print(f"  CreateContainer {kind:9s} at 0: {empty * 1000:7.2f} ms  at {n}: {busy * 1000:7.2f} ms  "
              f"ratio {busy / empty:5.2f}x  (CPU {empty_cpu * 1000:.2f} / {busy_cpu * 1000:.2f} ms, "
              f"{busy_cpu / empty_cpu:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containers", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--baseline-src", type=Path, metavar="DIR")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--src", type=Path, default=REPO / "src", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    print(f"NRI plugin on a busy node ({SHAPE}, {args.containers} unknown running containers, "
          f"median of {args.runs} creates, {os.cpu_count()} CPUs here, load {os.getloadavg()[0]:.1f})")
    if args.baseline_src is not None:
        if not (args.baseline_src / "numa_pin" / "__init__.py").is_file():
            print(f"{args.baseline_src} holds no numa_pin package (give a checkout's src/)", file=sys.stderr)
            return 2
        report(f"baseline ({args.baseline_src})", measure(args.baseline_src.resolve(), args.containers, args.runs))
    report(f"this tree ({REPO / 'src'})", measure(REPO / "src", args.containers, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
