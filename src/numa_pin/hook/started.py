"""When a process started, on the clock deadlines use: where a hook's budget begins.

A hook the runtime starts has the runtime's timeout from its own start, and on a starved node
starting Python can take a large part of it; so the admission's budget counts from there. This
module reads it without importing :mod:`signal` (a release never needs a deadline).
"""

from __future__ import annotations

import os
import time

from numa_pin.base.boundedio import read_regular_file


def process_started(pid: int | str = "self", proc_root: str = "/proc") -> float | None:
    """When process ``pid`` started, on :func:`time.monotonic`'s clock: its ``starttime`` in
    ``<proc_root>/<pid>/stat`` against ``<proc_root>/uptime``. None when either cannot be read
    or makes no sense (a start in the future)."""
    try:
        stat = read_regular_file(os.path.join(proc_root, str(pid), "stat"), 4096)
        uptime = float(read_regular_file(os.path.join(proc_root, "uptime"), 256).split()[0])
        ticks = int(stat.rsplit(b")", 1)[1].split()[19])  # field 22; the fields after comm start at 3
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age if age >= 0 else None


__all__ = ["process_started"]
