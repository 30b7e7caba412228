#!/usr/bin/env python3
"""What one more exclusive container costs on a real kernel carrying many (issue 21 part 2).

Boots the multi-NUMA qemu guest of ``tests/vm`` (2 nodes, 4 CPUs, cgroup v2, TCG: every figure
is an emulated machine's, so only the ratios carry over) and, inside it, for each population P
(0 and 200 by default): P real cgroups under ``/sys/fs/cgroup/npbench``, each with a ``sleep``
in it, admitted as shared containers; then ``--runs`` times a new cgroup with a ``sleep`` is
admitted asking for one exclusive CPU and released, measured two ways:

* ``warm``: ``NodeService.admit`` / ``release`` in one warm process (what the agent's child
  runs, after the spare's rehearsal has checked the shared cgroups and opened their
  ``cpuset.cpus``, untimed; the agent's release leaves the shared containers' growth until after
  its reply, so its ``settle`` is timed apart);
* ``hook``: the installed ``numa-pin-hook`` prestart / poststop, in-process (a Python start each).

The kernel's part is counted too: every ``cpuset.cpus`` write, by path or through a held
descriptor (how many, and the time spent in them). After each admission every shared cgroup's ``cpuset.cpus.effective`` is checked to
exclude the granted CPU, and after each release (and settle) to hold it again: a figure from a
run that broke exclusivity is not printed (the script fails instead).

Usage: python bench/population_vm.py [--runs N] [--sizes 0,200] [--timeout S]   (one boot; 5-15 minutes
under TCG; a guest that runs past ``--timeout`` still prints the sizes it finished)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

INSIDE = r'''
import json, os, statistics, subprocess, sys, time
from pathlib import Path

from numa_pin.requests.request import request_from_oci
from numa_pin.config.schema import config_from_dict
from numa_pin.base.cpuset import parse_list
from numa_pin.enforcer import cgroups
from numa_pin.ledger import liveness
from numa_pin.ledger.liveness import process_start_time
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.resources.node.warm import WarmState
from numa_pin.service.node import open_service

RUNS, SIZES = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
shared_dir = Path(os.environ["NP_SHARED"])
CG = Path("/sys/fs/cgroup")
TOP = CG / "npbench"
WORK = Path("/run/np-pop")
WORK.mkdir(parents=True, exist_ok=True)
(CG / "cgroup.subtree_control").write_text("+cpuset")
TOP.mkdir(exist_ok=True)
(TOP / "cgroup.subtree_control").write_text("+cpuset")
writes = {"n": 0, "s": 0.0}
real_write = cgroups.write_cgroup_file


def counting_write(path, text):
    t0 = time.perf_counter()
    try:
        real_write(path, text)
    finally:
        if path.endswith("cpuset.cpus"):
            writes["n"] += 1
            writes["s"] += time.perf_counter() - t0


cgroups.write_cgroup_file = counting_write
real_handle = cgroups.write_cgroup_handle


def counting_handle(fd, data, plain):
    t0 = time.perf_counter()
    try:
        return real_handle(fd, data, plain)
    finally:
        writes["n"] += 1
        writes["s"] += time.perf_counter() - t0


cgroups.write_cgroup_handle = counting_handle
procs = []


def container(parent, name):
    d = parent / name
    d.mkdir()
    p = subprocess.Popen(["sleep", "3600"])
    procs.append(p)
    (d / "cgroup.procs").write_text(str(p.pid))
    return p.pid


def effective(d):
    return parse_list((d / "cpuset.cpus.effective").read_text())


def median(xs):
    return statistics.median(xs) * 1000 if xs else float("nan")


results = {}
for size in SIZES:
    parent = TOP / f"p{size}"
    parent.mkdir()
    (parent / "cgroup.subtree_control").write_text("+cpuset")
    cfg = {"state_dir": str(WORK / f"state{size}"), "syslog": False, "policy": "restricted"}
    cfg_path = WORK / f"config{size}.yaml"
    cfg_path.write_text(json.dumps(cfg))
    svc = open_service(config_from_dict(cfg), warm_state=WarmState())  # as the agent's child has it
    kept = svc.warm_state
    shared = []
    grants = {}
    t0 = time.perf_counter()
    for i in range(size):  # recorded as numa-pin would have left them (one transaction: the guest is slow)
        cid = f"p{size}-s{i}"
        pid = container(parent, cid)
        grants[cid] = Grant(cid, f"pod-{cid}", cid, "shared", pid=pid, start_time=process_start_time(pid, "/proc"),
                            cgroup=f"/npbench/p{size}/{cid}", policy="restricted", created=time.time())
        shared.append(parent / cid)
    with svc.ledger.transaction() as txn:
        txn.state = LedgerState(grants, {})
    fill_s = time.perf_counter() - t0
    all_cpus = effective(parent)
    row = {k: [] for k in ("warm_admit", "warm_release", "warm_settle", "hook_admit", "hook_release")}
    kernel = {"admit_writes": [], "admit_write_ms": [], "release_writes": [], "release_write_ms": []}
    for run in range(RUNS + 1):
        # warm: one process, as the agent's child runs it (release settles after the reply)
        pid = container(parent, f"w{run}")
        read = svc.ledger.read()
        cpu_node.warm(svc, read)  # what the agent's spare does before a hook comes
        liveness.prepare(read, svc.boot_id)
        kept.defer()  # and how its child runs the request: what can wait, after the reply
        writes.update(n=0, s=0.0)
        t0 = time.perf_counter()
        grant = svc.admit(request_from_oci(f"p{size}-w{run}", {"numa-pin.io/cpus": "1"}), pid).grant
        took = time.perf_counter() - t0
        n, s = writes["n"], writes["s"]
        kept.settle()
        assert all(not effective(d) & grant.cpus for d in shared), "a shared container kept a granted CPU"
        assert effective(parent / f"w{run}") == grant.cpus
        if run:
            row["warm_admit"].append(took)
            kernel["admit_writes"].append(n)
            kernel["admit_write_ms"].append(s * 1000)
        kept.defer()
        writes.update(n=0, s=0.0)
        t0 = time.perf_counter()
        svc.release(f"p{size}-w{run}")
        t1 = time.perf_counter()
        kept.settle()
        t2 = time.perf_counter()
        assert all(effective(d) == all_cpus for d in shared), "a released CPU did not come back"
        if run:
            row["warm_release"].append(t1 - t0)
            row["warm_settle"].append(t2 - t1)
            kernel["release_writes"].append(writes["n"])
            kernel["release_write_ms"].append(writes["s"] * 1000)
        # hook: numa-pin-hook in-process, as a runtime runs it
        name = f"p{size}-h{run}"  # the hook wants the leaf cgroup named after the container
        pid = container(parent, name)
        bundle = WORK / f"b{size}-{run}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps({"annotations": {"numa-pin.io/cpus": "1"}}))
        state = json.dumps({"ociVersion": "1.2.0", "id": name, "status": "creating", "pid": pid,
                            "bundle": str(bundle)}).encode()
        env = dict(os.environ, NUMA_PIN_NO_AGENT="1", NUMA_PIN_CACHE_DIR=str(WORK / f"cache{size}"))
        for stage in ("prestart", "poststop"):
            t0 = time.perf_counter()
            proc = subprocess.run(["numa-pin-hook", "--config", str(cfg_path), stage], input=state, env=env,
                                  capture_output=True, timeout=300)
            took = time.perf_counter() - t0
            assert proc.returncode == 0, proc.stderr.decode()
            if stage == "prestart":
                granted = effective(parent / name)
                assert all(not effective(d) & granted for d in shared), "a shared container kept a granted CPU"
            if run:
                row["hook_admit" if stage == "prestart" else "hook_release"].append(took)
        assert all(effective(d) == all_cpus for d in shared), "a released CPU did not come back"
    print(f"P={size} done", flush=True)
    ledger = WORK / f"state{size}" / "ledger.json"
    results[size] = {"fill_s": fill_s, "ledger_kib": ledger.stat().st_size / 1024 if ledger.exists() else 0.0,
                     **{k: median(v) for k, v in row.items()},
                     "admit_writes": statistics.median(kernel["admit_writes"]),
                     "admit_write_ms": statistics.median(kernel["admit_write_ms"]),
                     "release_writes": statistics.median(kernel["release_writes"]),
                     "release_write_ms": statistics.median(kernel["release_write_ms"])}
    (shared_dir / "population_vm.json").write_text(json.dumps(results, indent=1))  # what a timeout leaves
for p in procs:
    p.kill()
(shared_dir / "population_vm.json").write_text(json.dumps(results, indent=1))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="0,200")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if sizes[0] != 0:
        sizes.insert(0, 0)
    sys.path.insert(0, str(REPO / "tests" / "vm"))
    from guest import GuestTimeout, run_in_guest, unavailable_reason  # the tests' guest (tests/vm/guest.py)

    why = unavailable_reason()
    if why:
        raise SystemExit(f"no guest here: {why}")
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-popvm-") as tmp:
        shared = Path(tmp)
        (shared / "inside.py").write_text(textwrap.dedent(INSIDE))
        script = f'"$NP_PY" "$NP_SHARED/inside.py" {args.runs} {",".join(map(str, sizes))}\n'
        try:
            result = run_in_guest(script, shared, timeout=args.timeout)
        except GuestTimeout as exc:  # a loaded host: print the sizes it finished
            print(f"the guest ran past {args.timeout:g} s ({str(exc).splitlines()[0]}); the sizes it finished:")
        else:
            if result.rc:
                raise SystemExit(f"guest script failed (rc {result.rc}):\n{result.stdout}\n{result.stderr}")
        if not (shared / "population_vm.json").is_file():
            raise SystemExit("the guest finished no size")
        figures = {int(k): v for k, v in json.loads((shared / "population_vm.json").read_text()).items()}
    base = figures[0]
    keys = ("warm_admit", "warm_release", "warm_settle", "hook_admit", "hook_release")
    print(f"real kernel (qemu TCG guest, 2 NUMA nodes, 4 CPUs, cgroup v2): P shared cgroups with a sleep each, "
          f"then one 1-CPU exclusive admission and its release (median of {args.runs}); ratio to P = 0")
    print(f"{'shared':>6} " + " ".join(f"{k:>20}" for k in keys) + "  cpuset.cpus writes admit/release (ms)  ledger")
    for size, f in sorted(figures.items()):
        cells = " ".join(f"{f[k]:8.1f} ms {f[k] / base[k] if base[k] else float('nan'):5.2f}x " for k in keys)
        print(f"{size:>6} {cells}  {f['admit_writes']:5.0f} ({f['admit_write_ms']:6.1f}) / "
              f"{f['release_writes']:5.0f} ({f['release_write_ms']:6.1f})  {f['ledger_kib']:6.1f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
