#!/usr/bin/env python3
"""What one more container costs on a node that already carries many (issue 21).

For each population P (0, 100, 400 and 2,000 by default) a fake ``amd-nps4-8node`` node (64
CPUs, cgroup v1 tree, proc tree with a live process per container) carries P shared containers
plus P/8 exclusive ones of one CPU each (at most 48, so the 64 CPUs never run out), written
straight into the ledger and the cgroups as numa-pin would have left them. Then the installed
``numa-pin-hook`` admits one more container asking ``numa-pin.io/cpus=1`` and releases it at
poststop, as a runtime runs it, ``--runs`` times (median), once in-process and once through a
warm agent (``numa-pin serve``), ``--gap`` seconds before each hook (1 s by default, so the
agent's spare child is ready as on a node where containers start seconds apart; 0 measures a
burst, where the agent forks a child for each hook). The sizes take turns, so a busy moment of
the machine weighs on all of them alike.

Every figure is printed as a ratio to the empty node (P = 0) measured in the same run, next to
the milliseconds, so runs on different machines compare. The ledger's size is printed too.

``--baseline DIR`` measures another numa-pin as well, in the same run and interleaved with this
one: ``DIR/src`` of an export of an older commit (``git archive 2fcec78 | tar -x -C DIR``), put
first on the hooks' and the agent's ``PYTHONPATH``; its table follows, then this tree's time
over the baseline's for each figure. (The nodes are populated by this tree's ledger code: the
two must read the same ledger format.)

Usage: python bench/population.py [--runs N] [--sizes 0,100,400,2000] [--gap SECONDS] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
from numa_pin.base.cpuset import format_list  # noqa: E402
from numa_pin.config.schema import config_from_dict  # noqa: E402  (after the src path is known)
from numa_pin.ledger.model import Grant, LedgerState  # noqa: E402
from numa_pin.resources.node import cpu as cpu_node  # noqa: E402
from numa_pin.service.node import open_service  # noqa: E402
from numa_pin.testing.node import FakeNode  # noqa: E402

VENV_BIN = Path(sys.executable).parent
HOOK = shutil.which("numa-pin-hook", path=str(VENV_BIN)) or shutil.which("numa-pin-hook")
NUMA_PIN = shutil.which("numa-pin", path=str(VENV_BIN)) or shutil.which("numa-pin")
SHAPE = "amd-nps4-8node"
MAX_EXCLUSIVE = 48
BTIME = 1_700_000_000
PID_BASE = 200_000


def write_process(node: FakeNode, pid: int) -> None:
    """A live process in the fake proc tree: ``/proc/<pid>/stat`` with a start time."""
    fields = ["S", "1"] + ["0"] * 17 + ["100"] + ["0"] * 30  # field 22 (starttime) = 100 ticks
    (node.proc_root / str(pid) / "stat").write_text(f"{pid} (sleep) {' '.join(fields)}\n")


def populate(node: FakeNode, config: dict[str, object], population: int) -> int:
    """P shared and P/8 exclusive containers, in the ledger and in their cgroups; returns the
    ledger's size in bytes."""
    (node.proc_root / "stat").write_text(f"cpu 0 0 0 0\nbtime {BTIME}\n")
    service = open_service(config_from_dict(config))
    free = sorted(service.topology.cpu_ids - cpu_node.reserved(service))
    start = BTIME + 100 / os.sysconf("SC_CLK_TCK")
    grants: dict[str, Grant] = {}
    exclusive = min(population // 8, MAX_EXCLUSIVE)
    for i in range(population + exclusive):
        cid = f"pop{i}"
        pid = node.add_container(cid, PID_BASE + i)
        write_process(node, pid)
        cpus = frozenset((free[i - population],)) if i >= population else frozenset()
        mems = frozenset(n for n, info in service.topology.nodes.items() if info.cpus & cpus)
        grants[cid] = Grant(cid, f"pod-{cid}", cid, "exclusive" if cpus else "shared", pid=pid, start_time=start,
                            cgroup=f"/{node.parent}/{cid}", cpus=cpus, mems=mems, policy="restricted",
                            created=time.time())
    state = LedgerState(grants, {})
    with service.ledger.transaction() as txn:
        txn.state = state
    pool = format_list(cpu_node.shared_pool(service, state))
    for grant in grants.values():
        (node.cgroup_dir(grant.container_id) / "cpuset.cpus").write_text(format_list(grant.cpus) or pool)
    return os.path.getsize(service.ledger.path) if grants else 0


def timed(cmd: list[str], stdin: bytes, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=300)
    if proc.returncode:
        raise SystemExit(f"{cmd[-1]} failed: {proc.stderr.decode().strip()}")
    return time.perf_counter() - t0


class Node:
    """One populated fake node, its config, and a warm agent serving it."""

    def __init__(self, root: Path, population: int, src: str | None = None) -> None:
        self.population = population
        self.node = FakeNode(root / "n", SHAPE, parent="bench")
        self.config = self.node.write_config(policy="restricted")
        self.ledger_bytes = populate(self.node, self.node.config_dict(policy="restricted"), population)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_PIN_")}
        env["NUMA_PIN_CACHE_DIR"] = str(self.node.cache_dir)
        if src is not None:  # the baseline's modules come first for the hook and the agent
            env["PYTHONPATH"] = src
        self.inproc_env = dict(env, NUMA_PIN_NO_AGENT="1")
        sock = root / "agent" / "agent.sock"
        self.agent_env = dict(env, NUMA_PIN_AGENT_SOCKET=str(sock))
        self.server = subprocess.Popen([NUMA_PIN, "serve", "--socket", str(sock)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while not sock.exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("numa-pin serve did not start")
            time.sleep(0.05)
        self.samples: dict[str, list[float]] = {k: [] for k in KEYS}
        self.probes = 0

    def pair(self, mode: str, gap: float, keep: bool) -> None:
        """One admission of a new 1-CPU container and its release, ``gap`` seconds apart and
        after; ``keep``: record the times (the first pair only fills caches)."""
        self.probes += 1
        cid = f"probe{self.probes}"
        pid = self.node.add_container(cid, PID_BASE - self.probes)
        write_process(self.node, pid)
        state = self.node.oci_state(cid, pid, {"numa-pin.io/cpus": "1"})
        env = self.inproc_env if mode == "inproc" else self.agent_env
        for stage in ("prestart", "poststop"):
            time.sleep(gap)
            took = timed([HOOK, "--config", str(self.config), stage], state, env)
            if keep:
                self.samples[f"{mode}_{'admit' if stage == 'prestart' else 'release'}"].append(took)

    def close(self) -> None:
        self.server.terminate()
        self.server.wait(timeout=60)

    def median(self, key: str) -> float:
        values = sorted(self.samples[key])
        return values[len(values) // 2]


KEYS = ("inproc_admit", "inproc_release", "agent_admit", "agent_release")


def table(nodes: list[Node]) -> None:
    base = nodes[0]
    print(f"{'containers':>10} " + " ".join(f"{k:>22}" for k in KEYS) + f" {'ledger':>10}")
    for node in nodes:
        p = node.population
        cells = " ".join(f"{node.median(k) * 1000:9.1f} ms {node.median(k) / base.median(k):5.2f}x  " for k in KEYS)
        print(f"{p + min(p // 8, MAX_EXCLUSIVE):>10} {cells} {node.ledger_bytes / 1024:7.1f} KiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sizes", default="0,100,400,2000")
    parser.add_argument("--gap", type=float, default=1.0,
                        help="seconds before each hook (1 s lets the agent's spare be ready; 0: back to back)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also measure the numa-pin exported in DIR (its src/), in the same run")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if sizes[0] != 0:
        sizes.insert(0, 0)
    baseline_src = str(Path(args.baseline, "src").resolve()) if args.baseline else None
    if baseline_src is not None and not Path(baseline_src, "numa_pin").is_dir():
        raise SystemExit(f"--baseline {args.baseline}: no src/numa_pin there")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-pop-", dir=shm) as tmp:
        nodes = [Node(Path(tmp) / f"p{p}", p) for p in sizes]
        old = [Node(Path(tmp) / f"b{p}", p, baseline_src) for p in sizes] if baseline_src else []
        try:
            for run in range(args.runs + 1):  # sizes interleaved: a busy moment weighs on all alike
                for mode in ("inproc", "agent"):
                    for node in nodes + old:
                        node.pair(mode, args.gap, keep=run > 0)
        finally:
            for node in nodes + old:
                node.close()
    print(f"population sweep on {SHAPE}: P shared + min(P/8, {MAX_EXCLUSIVE}) exclusive containers, then one "
          f"1-CPU admission and its release (median of {args.runs}, {args.gap:g} s between hooks); "
          "ratio to the empty node in this run")
    table(nodes)
    if old:
        print(f"baseline ({args.baseline}), same run:")
        table(old)
        print("this tree's time over the baseline's:")
        print(f"{'containers':>10} " + " ".join(f"{k:>15}" for k in KEYS))
        for new, was in zip(nodes, old):
            p = new.population
            print(f"{p + min(p // 8, MAX_EXCLUSIVE):>10} "
                  + " ".join(f"{new.median(k) / was.median(k):14.2f}x" for k in KEYS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
