#!/usr/bin/env python3
"""prefer-closest-numa-nodes on the kit's 64-node machine: the whole decision, request by request.

The machine is the machine kit's ``big-64node`` shape (8 sockets x 8 nodes, 2 CPUs per node,
SLIT 10 local / 12 same socket / 32 across sockets), empty, with kubelet's default of one
reserved CPU (CPU 0, so node 0 holds one free CPU and the others two). Policy ``best-effort``.

Part 1 times the full admission decision (:func:`numa_pin.admission.decide.decide`: providers,
merge, allocators) for ``numa-pin.io/cpus`` from 8 to 90, with prefer-closest on and off, and
prints the ratio of the two. Each case is capped (``--cap`` seconds, default 90): a case that
runs past it is reported as ``>cap``.

Part 2 runs the installed ``numa-pin-hook`` as a runtime would (a fresh process per
admission, OCI state on stdin) on a fake tree of the same machine
(:class:`numa_pin.testing.node.FakeNode`, no agent), for a few request sizes, with
prefer-closest on and off, next to a bare ``python3 -c pass``; then one ``numa-pin plan
--cpus 90``. Every admission is released (poststop) before the next, so every run sees the
empty machine. All figures come from one run and are printed as ratios side by side.

Usage: python bench/prefer_closest.py [--runs N] [--cap S] [--sizes 8,16,...] [--hook-sizes 8,41,...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
from numa_pin.admission.decide import NodeSettings, decide  # noqa: E402
from numa_pin.ledger.model import LedgerState  # noqa: E402
from numa_pin.requests.request import request_from_oci  # noqa: E402
from numa_pin.testing import machine, shapes  # noqa: E402
from numa_pin.testing.node import FakeNode  # noqa: E402

SHAPE = "big-64node"
VENV_BIN = Path(sys.executable).parent
HOOK = shutil.which("numa-pin-hook", path=str(VENV_BIN)) or shutil.which("numa-pin-hook")
CLI = shutil.which("numa-pin", path=str(VENV_BIN)) or shutil.which("numa-pin")
SIZES = (8, 16, 24, 32, 41, 48, 57, 64, 72, 80, 90)
HOOK_SIZES = (8, 16, 41, 57, 90)


def options(closest: bool) -> dict[str, str]:
    return {"prefer-closest-numa-nodes": "true" if closest else "false", "max-allowable-numa-nodes": "64"}


class CapExceeded(Exception):
    pass


@contextmanager
def cap(seconds: float) -> Iterator[None]:
    """Raise :class:`CapExceeded` in this thread once ``seconds`` have passed."""

    def fire(_signum: int, _frame: object) -> None:
        raise CapExceeded

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def timed_median(fn: Callable[[], object], runs: int, limit: float) -> tuple[float | None, object]:
    """Median seconds of ``runs`` calls (fewer when one call is slow), or ``None`` past ``limit``."""
    samples: list[float] = []
    result: object = None
    spent = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        try:
            with cap(max(0.001, limit - spent)):
                result = fn()
        except CapExceeded:
            return None, None
        samples.append(time.perf_counter() - start)
        spent += samples[-1]
        if spent > 2.0:  # slow cases: one or two samples are enough
            break
    return statistics.median(samples), result


def fmt_ms(seconds: float | None, limit: float) -> str:
    return f">{limit * 1000:.0f}" if seconds is None else f"{seconds * 1000:.1f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.1f}x"


def decisions(sizes: tuple[int, ...], runs: int, limit: float) -> None:
    spec = shapes.shape(SHAPE)
    topo = machine.expected_topology(spec)
    print(f"Part 1: full decision (admission.decide) on {SHAPE}, best-effort, empty machine")
    header = f"{'cpus':>5} {'closest ms':>11} {'narrowest ms':>13} {'ratio':>7}  closest affinity"
    print(header)
    print("-" * len(header))
    for size in sizes:
        request = request_from_oci("bench", {"numa-pin.io/cpus": str(size)})
        row = []
        result: object = None
        for closest in (True, False):
            settings = NodeSettings(policy="best-effort", policy_options=options(closest))
            seconds, decision = timed_median(lambda s=settings: decide(topo, LedgerState(), request, s), runs, limit)
            row.append(seconds)
            if closest:
                result = decision
        affinity = "-" if result is None else str(result.hint)  # type: ignore[attr-defined]
        print(f"{size:>5} {fmt_ms(row[0], limit):>11} {fmt_ms(row[1], limit):>13} {ratio(row[0], row[1]):>7}  "
              f"{affinity}", flush=True)


def run_proc(cmd: list[str], stdin: bytes | None, env: dict[str, str] | None, limit: float) -> float | None:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.decode().strip()}")
    return time.perf_counter() - start


def hooks(sizes: tuple[int, ...], runs: int, limit: float) -> None:
    if HOOK is None or CLI is None:
        print("Part 2 skipped: numa-pin-hook is not installed (run make venv)")
        return
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-closest-") as tmp:
        node = FakeNode(Path(tmp), SHAPE, parent="bench")
        env = dict(os.environ, NUMA_PIN_CACHE_DIR=str(node.cache_dir), NUMA_PIN_NO_AGENT="1")
        configs = {
            closest: node.write_config(Path(tmp) / f"config-{closest}.yaml", policy="best-effort",
                                       policy_options=options(closest))
            for closest in (True, False)
        }
        counter = [0]

        def admit(size: int, closest: bool) -> float | None:
            counter[0] += 1
            name = f"c{counter[0]}"
            pid = node.add_container(name, 100000 + counter[0])
            state = node.oci_state(name, pid, {"numa-pin.io/cpus": str(size)})
            config = str(configs[closest])
            seconds = run_proc([HOOK, "--config", config, "prestart"], state, env, limit)
            # release whatever was granted, so the next run sees the empty machine again
            run_proc([HOOK, "--config", config, "poststop"], state, env, limit)
            return seconds

        for closest in (True, False):  # warm-up: fills the config and topology caches
            admit(2, closest)
        bare = [run_proc([sys.executable, "-c", "pass"], None, None, limit) or 0.0 for _ in range(max(3, runs))]
        bare_s = statistics.median(bare)
        print()
        print(f"Part 2: numa-pin-hook prestart on a fake {SHAPE} tree (fresh process, no agent), "
              f"median of up to {runs}")
        print(f"  python3 -c pass: {bare_s * 1000:.1f} ms")
        header = (f"{'cpus':>5} {'closest ms':>11} {'narrowest ms':>13} {'closest/narrowest':>18} "
                  f"{'closest/bare':>13}")
        print(header)
        print("-" * len(header))
        for size in sizes:
            row: list[float | None] = []
            for closest in (True, False):
                samples: list[float] = []
                for _ in range(runs):
                    seconds = admit(size, closest)
                    if seconds is None:
                        samples = []
                        break
                    samples.append(seconds)
                    if sum(samples) > 3.0:
                        break
                row.append(statistics.median(samples) if samples else None)
            print(f"{size:>5} {fmt_ms(row[0], limit):>11} {fmt_ms(row[1], limit):>13} "
                  f"{ratio(row[0], row[1]):>18} {ratio(row[0], bare_s):>13}", flush=True)
        plan = run_proc([CLI, "plan", "--config", str(configs[True]), "--cpus", "90"], None, env, limit)
        print(f"  numa-pin plan --cpus 90 (closest): {fmt_ms(plan, limit)} ms, "
              f"{ratio(plan, bare_s)} of bare")


def parse_sizes(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (median)")
    parser.add_argument("--cap", type=float, default=90.0, help="seconds after which a case is abandoned")
    parser.add_argument("--sizes", type=parse_sizes, default=SIZES, help="CPU requests for part 1")
    parser.add_argument("--hook-sizes", type=parse_sizes, default=HOOK_SIZES, help="CPU requests for part 2")
    parser.add_argument("--skip-hook", action="store_true", help="only part 1")
    args = parser.parse_args()
    decisions(args.sizes, args.runs, args.cap)
    if not args.skip_hook:
        hooks(args.hook_sizes, args.runs, args.cap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
