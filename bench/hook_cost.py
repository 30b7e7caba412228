#!/usr/bin/env python3
"""What one ``numa-pin-hook`` admission and release cost, counted rather than timed: the
instructions the hook process runs (valgrind's cachegrind) and the system calls it makes
(strace), for this checkout and another one's ``src/``, in one run.

Wall and CPU times (``bench/hook_latency.py``) move by about 5% between two copies of the very
same tree on this 2-CPU machine, more than most changes to the hook's start-up. The two counts
do not: the same tree gives the same system calls, and instructions within 0.2%. A change that
adds imports to the hook's path shows in both (a module costs about ten system calls: the
directory's listing once, a ``stat`` of the source, the open, ``fstat`` and read of its byte
code).

Each tree admits (``prestart``) and releases (``poststop``) on a fake node of its own (the
``intel-2s-ht`` of the machine kit, cgroup v1, config and topology caches warm), through the same
launcher, its ``src`` first on ``PYTHONPATH``; odd runs are counted by valgrind, even ones by
strace, the trees in turns. Medians are printed with the ratio of this tree to the baseline.

Usage: python bench/hook_cost.py --baseline-src DIR [--runs N]   (needs valgrind and strace)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hook_latency import REPO, add_container, check_loads, fake_node, pct, tree_hook

STAGES = ("prestart", "poststop")
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def instructions(cmd: list[str], stdin: bytes, env: dict[str, str]) -> int:
    """The instructions ``cmd`` runs (user space), as cachegrind counts them."""
    proc = subprocess.run(VALGRIND + cmd, input=stdin, env=env, capture_output=True, timeout=600)
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr.decode(errors="replace"))
    if proc.returncode or found is None:
        raise SystemExit(f"{cmd[0]} under valgrind failed: {proc.stderr.decode(errors='replace')[-400:]}")
    return int(found.group(1).replace(",", ""))


def system_calls(cmd: list[str], stdin: bytes, env: dict[str, str], tmp: Path) -> int:
    """The system calls ``cmd`` and its children make, as ``strace -c`` counts them."""
    summary = tmp / "strace.txt"
    proc = subprocess.run(["strace", "-f", "-c", "-o", str(summary)] + cmd, input=stdin, env=env,
                          capture_output=True, timeout=600)
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} under strace failed: {proc.stderr.decode(errors='replace')[-400:]}")
    total = next(line.split() for line in summary.read_text().splitlines() if line.strip().endswith("total"))
    return int(total[3])  # % time, seconds, usecs/call, calls, [errors,] "total"


def count(trees: dict[str, tuple], runs: int, tmp: Path) -> dict[str, dict[str, list[int]]]:
    """``{tree: {"<stage> instructions" or "<stage> system calls": samples}}``."""
    got: dict[str, dict[str, list[int]]] = {label: {} for label in trees}
    for i in range(1, runs + 1):
        order = list(trees.items())
        for label, (node, config, env, hook) in order[i % 2:] + order[:i % 2]:
            state = add_container(node, i)
            for stage in STAGES:
                cmd = [hook, "--config", str(config), stage]
                if i % 2:
                    got[label].setdefault(f"{stage} instructions", []).append(instructions(cmd, state, env))
                else:
                    got[label].setdefault(f"{stage} system calls", []).append(system_calls(cmd, state, env, tmp))
    return got


def prepare(tmp: Path, sources: dict[str, Path]) -> dict[str, tuple]:
    """A fake node, config and launcher per tree, with the caches filled by one admission."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, sources.values())], check=True,
                   stdout=subprocess.DEVNULL)
    trees = {}
    for label, src in sources.items():
        (tmp / label).mkdir()
        node, config, env = fake_node(tmp / label)
        env["PYTHONPATH"] = str(src)
        check_loads(src, env)
        trees[label] = (node, config, env, tree_hook(tmp / label, src))
    time.sleep(2.1)  # the loader caches only a config unchanged for 2 s
    for label, (node, config, env, hook) in trees.items():
        warm = add_container(node, 0)
        for stage in STAGES:
            if subprocess.run([hook, "--config", str(config), stage], input=warm, env=env,
                              capture_output=True).returncode:
                raise SystemExit(f"hook {label} failed its warm-up {stage}")
    return trees


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-src", type=Path, metavar="DIR", required=True,
                    help="another checkout's src/ (e.g. from `git worktree add /tmp/base <commit>`)")
    ap.add_argument("--runs", type=int, default=6, help="runs per tree, half of them under each counter")
    args = ap.parse_args()
    missing = [tool for tool in ("valgrind", "strace") if shutil.which(tool) is None]
    if missing:
        print(f"bench/hook_cost.py needs {' and '.join(missing)}", file=sys.stderr)
        return 1
    sources = {"baseline": args.baseline_src.resolve(), "this": REPO / "src"}
    with tempfile.TemporaryDirectory(prefix="numa-pin-bench-cost-") as tmp:
        got = count(prepare(Path(tmp), sources), args.runs, Path(tmp))
    print(f"hook in-process, fake 2-socket machine: this checkout ({sources['this']}) and baseline "
          f"({sources['baseline']}), medians of {(args.runs + 1) // 2} (instructions) and {args.runs // 2} "
          "(system calls) runs each")
    for what in got["this"]:
        base, this = pct(got["baseline"][what], 0.5), pct(got["this"][what], 0.5)
        print(f"  {what:24s} baseline {base:>13,d}   this {this:>13,d}   this / baseline {this / base:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
