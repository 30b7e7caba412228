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


def reason_path(state_dir: str, container_id: str) -> str:
    """``<state_dir>/reasons/<id>.json``, the id reduced to a safe file name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in container_id)[:200] or "_"
    return os.path.join(state_dir, "reasons", safe + ".json")


def write_reason(state_dir: str, container_id: str, line: str, details: Mapping[str, object] | None = None) -> str | None:
    """Keep the rejection reason where ``numa-pin explain`` finds it (crun hides hook stderr)."""
    path = reason_path(state_dir, container_id)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fp:
            json.dump({"container_id": container_id, "time": time.time(), "line": line, **(details or {})}, fp)
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def log_syslog(line: str, error: bool = True) -> None:
    import syslog

    syslog.openlog("numa-pin", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_ERR if error else syslog.LOG_INFO, line)


__all__ = ["log_syslog", "reason_path", "write_reason"]
