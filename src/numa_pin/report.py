"""Where decisions are reported: reason files for ``numa-pin explain``, and syslog.

crun and podman hide a hook's stderr, so a rejection also goes to
``<state_dir>/reasons/<id>.json`` and, when the config's ``syslog`` is on, to the system log with
every other decision (``admitted``, ``released``). Reporting never fails an admission: a reason
file that cannot be written is returned as ``None``, and syslog errors are the C library's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from numa_pin.cpuset import format_list
from numa_pin.errors import UnsafePathError
from numa_pin.ledger.model import Grant
from numa_pin.safefs import check_dir, create_private, ensure_dir, write_all
from numa_pin.text import one_line

#: the directory of reason files under ``state_dir``
REASONS = "reasons"


def reason_path(state_dir: str, container_id: str) -> str:
    """``<state_dir>/reasons/<id>.json``, the id reduced to a safe file name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in container_id)[:200] or "_"
    return os.path.join(state_dir, REASONS, safe + ".json")


def write_reason(
    state_dir: str, container_id: str, line: str, details: Mapping[str, object] | None = None
) -> str | None:
    """Keep the rejection reason where ``numa-pin explain`` finds it (crun hides hook stderr)."""
    path = reason_path(state_dir, container_id)
    record = {"container_id": container_id, "time": time.time(), "line": one_line(line), **(details or {})}
    tmp = None
    try:
        directory = reasons_dir(state_dir)
        fd, tmp = create_private(directory, ".reason.")
        try:
            write_all(fd, json.dumps(record).encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = None
    except (OSError, UnsafePathError):
        return None
    finally:
        if tmp is not None:
            _unlink_quietly(tmp)
    return path


def reasons_dir(state_dir: str) -> str:
    """``<state_dir>/reasons``, created 0700 (the state directory too); the state directory must pass
    :func:`numa_pin.safefs.check_dir`, and ``reasons`` must be a real directory, not a symlink.

    Raises:
        UnsafePathError: either check failed.
        OSError: it cannot be created or examined.
    """
    ensure_dir(state_dir, 0o700)
    directory = os.path.join(state_dir, REASONS)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    check_dir(directory, follow=False)
    return directory


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # best effort


def log_syslog(line: str, error: bool = True) -> None:
    """One line (escaped) to the system log (LOG_DAEMON, LOG_ERR or LOG_INFO); the C library never raises."""
    import syslog

    syslog.openlog("numa-pin", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_ERR if error else syslog.LOG_INFO, one_line(line))



def decision_line(grant: Grant, verb: str) -> str:
    """``numa-pin: admitted <id>: cpus 2-3 mems 1 devices nvidia.com/gpu=0000:18:00.0 (policy/scope)``."""
    parts = [f"cpus {format_list(grant.cpus) or 'shared'}", f"mems {format_list(grant.mems) or 'any'}"]
    for resource, ids in sorted(grant.devices.items()):
        parts.append(f"{resource}={','.join(ids)}")
    return one_line(f"numa-pin: {verb} {grant.container_id}: {' '.join(parts)} ({grant.policy}/{grant.scope})")


def log_decision(grant: Grant, verb: str) -> None:
    """Log an admission or release at LOG_INFO (the config's ``syslog: true``)."""
    log_syslog(decision_line(grant, verb), error=False)


__all__ = ["decision_line", "log_decision", "log_syslog", "reason_path", "write_reason"]
