#!/usr/bin/env python3
"""Which numa_pin modules one admission passes through, in order, and how often it comes back.

One exclusive admission (``numa-pin.io/cpus: 2``) of the in-process hook (``hook.main.run``:
the OCI state on stdin) on a fake 2-socket machine with a cgroup v1 tree (``intel-2s-ht`` from
the machine kit), traced with :func:`sys.setprofile`. Before it, one admission and release of
another container run untraced, so imports and the config and topology caches are warm: the
trace is the steady-state path, not start-up.

The current module is the innermost ``numa_pin`` module on the stack (calls into the standard
library count for the numa_pin module that made them). Consecutive events in one module
collapse into one step. A *return* is a step into a module that an earlier step already left
(coming back from a callee counts); a *re-entry* is a call into a module that was left before
and is not on the stack any more (the path goes back to it rather than through it).
The path is cut at the first write of ``cpuset.cpus`` (the cgroup write the admission exists
for); the figures of the whole admission, to the hook's exit, follow.

The *walk* is what a reader following the stdin to that write goes through, folder by folder:
the modules in the order the path first enters them, each in its folder (a package's own
``__init__`` in the package); consecutive modules of one folder are one *room*, and a room in a
folder an earlier room was in is a *climb* (the walk goes back up to a folder it had left).

It prints the modules in the order the path first enters them, each with its steps and
re-entries; ``--steps`` prints the whole collapsed sequence instead.

Usage: python bench/admission_path.py [--shape NAME] [--steps]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
try:  # noqa: E402  (after the src path is known)
    from numa_pin.entry.hook import run as hook_run
except ImportError:  # a checkout from before the entry points had a folder of their own
    from numa_pin.hook.main import run as hook_run  # type: ignore[no-redef]
from numa_pin.testing.node import FakeNode  # noqa: E402

PACKAGE = "numa_pin"
CPUSET_FILE = "cpuset.cpus"


def modules_on(frame: FrameType | None) -> list[str]:
    """The numa_pin modules on the stack from ``frame`` outwards, innermost first."""
    out = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            out.append(str(name))
        frame = frame.f_back
    return out


def module_of(frame: FrameType | None) -> str | None:
    """The innermost numa_pin module on the stack from ``frame`` outwards."""
    on = modules_on(frame)
    return on[0] if on else None


class PathTrace:
    """The collapsed module steps of everything run under :meth:`profile`."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.cgroup_write: int | None = None  # len(steps) at the first cpuset.cpus write
        #: (len(steps) after the call, module) of each call into a module left before
        self.reentries: list[tuple[int, str]] = []

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = module_of(frame)
            if module is not None and module in self.steps and module not in modules_on(frame.f_back):
                self.reentries.append((len(self.steps) + (not self.steps or self.steps[-1] != module), module))
            if (self.cgroup_write is None and frame.f_code.co_name == "write_cgroup_file"
                    and str(frame.f_locals.get("path", "")).endswith(CPUSET_FILE)):
                self._step(module)
                self.cgroup_write = len(self.steps)
                return
        elif event == "return":
            module = module_of(frame.f_back)
        else:  # C calls count for the Python module that made them
            return
        self._step(module)

    def _step(self, module: str | None) -> None:
        if module is not None and (not self.steps or self.steps[-1] != module):
            self.steps.append(module)


def returns(steps: list[str]) -> int:
    """Steps into a module that an earlier step had already left."""
    seen: set[str] = set()
    count = 0
    for step in steps:
        count += step in seen
        seen.add(step)
    return count


def folder(module: str) -> str:
    """The folder a loaded module's file is in (a package: its own folder)."""
    loaded = sys.modules.get(module)
    return module if loaded is not None and hasattr(loaded, "__path__") else module.rpartition(".")[0]


def walk(steps: list[str]) -> tuple[list[str], int]:
    """The rooms (folders) of the walk along ``steps`` and how many of them are climbs."""
    rooms: list[str] = []
    for module in dict.fromkeys(steps):  # first entries, in order
        if not rooms or rooms[-1] != folder(module):
            rooms.append(folder(module))
    return rooms, len(rooms) - len(set(rooms))


def admit(node: FakeNode, config: Path, name: str, pid: int, trace: PathTrace | None = None) -> None:
    state = node.oci_state(name, node.add_container(name, pid), {"numa-pin.io/cpus": "2"})
    if trace is not None:
        sys.setprofile(trace.profile)
    try:
        code = hook_run(["numa-pin-hook", "--config", str(config), "prestart"], io.BytesIO(state))
    finally:
        sys.setprofile(None)
    if code:
        raise SystemExit(f"the admission of {name} failed (exit {code})")


def release(node: FakeNode, config: Path, name: str, pid: int) -> None:
    state = node.oci_state(name, pid, {"numa-pin.io/cpus": "2"})
    if hook_run(["numa-pin-hook", "--config", str(config), "poststop"], io.BytesIO(state)):
        raise SystemExit(f"the release of {name} failed")


def describe(label: str, trace: PathTrace, end: int, listing: str | None) -> None:
    steps = trace.steps[:end]
    again = [module for at, module in trace.reentries if at <= end]
    print(f"{label}: {len(steps)} steps through {len(set(steps))} modules, "
          f"{returns(steps)} returns to a module already left, {len(again)} re-entries")
    if listing == "steps":
        seen: set[str] = set()
        for step in steps:
            print(f"    {step.removeprefix(PACKAGE + '.')}{'  (again)' if step in seen else ''}")
            seen.add(step)
    elif listing == "modules":
        print(f"    {'module, in the order first entered':40s} {'steps':>6s} {'re-entries':>10s}")
        for module in dict.fromkeys(steps):
            print(f"    {module.removeprefix(PACKAGE + '.'):40s} {steps.count(module):6d} {again.count(module):10d}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="intel-2s-ht", help="machine kit shape (default: intel-2s-ht)")
    ap.add_argument("--steps", action="store_true", help="print the whole collapsed sequence of steps")
    args = ap.parse_args()
    os.environ["NUMA_PIN_NO_AGENT"] = "1"
    with tempfile.TemporaryDirectory(prefix="numa-pin-path-") as tmp:
        node = FakeNode(Path(tmp), args.shape, parent="bench")
        config = node.write_config(policy="restricted")
        os.environ["NUMA_PIN_CACHE_DIR"] = str(node.cache_dir)
        admit(node, config, "warm", 100001)  # imports, config and topology caches
        release(node, config, "warm", 100001)
        trace = PathTrace()
        admit(node, config, "traced", 100002, trace)
        cpus, _ = node.cpuset("traced")
    if trace.cgroup_write is None:
        raise SystemExit("the traced admission wrote no cpuset.cpus")
    print(f"one exclusive admission (2 CPUs -> cpuset {cpus}) of the in-process hook, fake {args.shape}")
    describe("hook stdin to the cpuset.cpus write", trace, trace.cgroup_write, "steps" if args.steps else "modules")
    rooms, climbs = walk(trace.steps[:trace.cgroup_write])
    print(f"the walk from stdin to that write: {len(rooms)} rooms, {climbs} climbs")
    print("    " + " ".join(room.removeprefix(PACKAGE + ".") if room != PACKAGE else "." for room in rooms))
    describe("the whole admission, to the hook's exit", trace, len(trace.steps), None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
