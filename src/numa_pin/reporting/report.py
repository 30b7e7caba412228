"""Where decisions are reported: reason files for ``numa-pin explain``, and syslog.

crun and podman hide a hook's stderr, so a rejection also goes to a reason file under
``<state_dir>/reasons/`` and, when the config's ``syslog`` is on, to the system log with every
other decision (``admitted``, ``released``). Reporting never fails an admission: a reason file
that cannot be written is returned as ``None``, and syslog errors are the C library's.

A reason file is named ``<prefix>-<hash>.json``: the id reduced to at most 64 safe characters,
then the first 16 hex digits of the SHA-256 of the exact id, so ``rt-a/b`` and ``rt-a_b`` never
share a file; :func:`read_reason` also checks the id recorded inside (an id longer than
:data:`MAX_ID_CHARS` is recorded cut, with the SHA-256 of the whole id). Files are 0600 (they
name containers) and bounded in bytes: the line is cut to :data:`~numa_pin.base.text.MAX_LINE`
characters and a file is never over :data:`MAX_REASON_BYTES`, which is also what
:func:`read_reason` accepts. At most :data:`MAX_REASONS` files and :data:`MAX_REASONS_BYTES`
bytes are kept (the oldest go first), a writer and ``reconcile`` (:func:`prune_reasons`) remove
temporary files a killed writer left (older than :data:`STALE_TEMP_S`), and a container's file
is deleted when it is admitted or its grant is released (:func:`forget_reason`). A write costs
the same however many files there are:
the directory is scanned and pruned only once per :func:`prune_every` units written (a file is
one unit, plus one per KiB; counted by the size of ``<state_dir>/.reasons-written``, one byte a unit), so it holds at
most a twentieth over its bounds between prunes, and a node refusing thousands of containers in
a row (an NRI plugin adopting a busy node) never pays a scan per refusal.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

from numa_pin.base.boundedio import json_loads_bounded, read_regular_file
from numa_pin.base.cpuset import format_list
from numa_pin.base.digest import sha256_hex
from numa_pin.base.safefs import check_dir, ensure_dir, replace_private
from numa_pin.base.text import MAX_LINE, cut, one_line
from numa_pin.errors import UnsafePathError
from numa_pin.ledger.model import Grant

#: the directory of reason files under ``state_dir``
REASONS = "reasons"
#: reason files kept at most; writing one more deletes the oldest
MAX_REASONS = 1000
#: largest reason file written and read back (one line and a few details)
MAX_REASON_BYTES = 64 << 10
#: the reasons directory holds at most this many bytes of reason files
MAX_REASONS_BYTES = 8 << 20
#: a container id longer than this is recorded cut, with the SHA-256 of the whole id
MAX_ID_CHARS = 1024
#: a temporary reason file older than this was left by a killed writer; the next writer removes it
STALE_TEMP_S = 60.0
_TEMP_PREFIX = ".reason."
#: the units written since the last prune, one byte a unit (in the state directory, beside ``reasons/``)
_WRITES = ".reasons-written"
#: between two prunes the directory grows by at most this share of its bounds
PRUNE_SHARE = 20
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def reason_path(state_dir: str, container_id: str) -> str:
    """``<state_dir>/reasons/<prefix>-<sha256 of the exact id, 16 hex>.json`` (pure)."""
    prefix = "".join(c if c in _SAFE else "_" for c in container_id[:64])
    digest = sha256_hex(container_id.encode("utf-8", "surrogatepass"))[:16]
    return os.path.join(state_dir, REASONS, f"{prefix}-{digest}.json")


def read_reason(state_dir: str, container_id: str) -> dict[str, object] | None:
    """The reason recorded for exactly ``container_id``, or None when there is none.

    Raises:
        OSError, ValueError: the file exists but cannot be read or parsed (not a regular
            file, a symlink, too large, not JSON).
        UnsafePathError: the state directory fails :func:`numa_pin.base.safefs.check_dir`.
    """
    path = reason_path(state_dir, container_id)
    try:
        check_dir(state_dir)
        check_dir(os.path.dirname(path), follow=False)
        raw = read_regular_file(path, MAX_REASON_BYTES, follow=False)
    except FileNotFoundError:
        return None
    doc = json_loads_bounded(raw, 8)
    if not isinstance(doc, dict) or not _records(doc, container_id):
        return None
    return doc


def _id_fields(container_id: str) -> dict[str, str]:
    """How a reason file records ``container_id``: as it is, or cut with the whole id's digest."""
    if len(container_id) <= MAX_ID_CHARS:
        return {"container_id": container_id}
    return {"container_id": container_id[:MAX_ID_CHARS],
            "container_id_sha256": sha256_hex(container_id.encode("utf-8", "surrogatepass"))}


def _records(doc: Mapping[str, object], container_id: str) -> bool:
    """Whether the reason ``doc`` is the one recorded for exactly ``container_id``."""
    return all(doc.get(k) == v for k, v in _id_fields(container_id).items())


def forget_reason(state_dir: str | None, container_id: str) -> None:
    """Delete ``container_id``'s reason file, if any (best effort: never raises). Nothing is
    deleted when ``reasons/`` is a symlink or the state directory fails its checks."""
    if not state_dir:
        return
    path = reason_path(state_dir, container_id)
    try:
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # no reasons directory (nothing to forget), or a symlink (not ours to touch)
    try:
        check_dir(state_dir)
        os.unlink(os.path.basename(path), dir_fd=fd)
    except (OSError, UnsafePathError):
        pass
    finally:
        os.close(fd)


def forget_reasons(state_dir: str | None, container_ids: list[str]) -> None:
    """:func:`forget_reason` of many containers at once (an NRI plugin adopting a busy node's):
    the directory is listed once, and only the files there are deleted (best effort)."""
    if not state_dir or not container_ids:
        return
    try:
        present = set(os.listdir(os.path.join(state_dir, REASONS)))
    except OSError:
        return
    for cid in container_ids:
        if os.path.basename(reason_path(state_dir, cid)) in present:
            forget_reason(state_dir, cid)


def _prune(directory: str, keep: int, keep_bytes: int | None = None, now: float | None = None) -> None:
    """Delete the oldest reason files until at most ``keep`` files of ``keep_bytes`` bytes in all
    (default :data:`MAX_REASONS_BYTES`) remain, and temporary files older than
    :data:`STALE_TEMP_S` (best effort)."""
    now = time.time() if now is None else now
    keep_bytes = MAX_REASONS_BYTES if keep_bytes is None else keep_bytes
    try:
        names = os.listdir(directory)
    except OSError:
        return
    aged = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if name.startswith(_TEMP_PREFIX):
            if now - st.st_mtime > STALE_TEMP_S:  # its writer was killed mid-write
                _unlink_quietly(path)
        elif name.endswith(".json"):
            aged.append((st.st_mtime_ns, name, st.st_size))
    aged.sort(reverse=True)  # newest first: they are the ones kept
    total = 0
    for i, (_, name, size) in enumerate(aged):
        total += size
        if i >= keep or total > keep_bytes:
            _unlink_quietly(os.path.join(directory, name))


def prune_reasons(state_dir: str | None) -> None:
    """Prune ``<state_dir>/reasons`` as a writer does (the oldest past the bounds, and the
    temporary files of killed writers older than :data:`STALE_TEMP_S`): what ``reconcile`` runs,
    so a killed writer's file goes even when no rejection follows it. Best effort, never raises;
    nothing is pruned through a symlinked ``reasons/`` or a state directory that fails its checks."""
    if not state_dir:
        return
    directory = os.path.join(state_dir, REASONS)
    try:
        check_dir(state_dir)
        check_dir(directory, follow=False)
    except (OSError, UnsafePathError):
        return
    _prune(directory, MAX_REASONS)


def reason_document(container_id: str, line: str, details: Mapping[str, object] | None = None,
                    now: float | None = None) -> bytes:
    """The bytes of a reason file: never over :data:`MAX_REASON_BYTES` (the line is cut, and
    details that do not fit are left out) (pure)."""
    record: dict[str, object] = {**_id_fields(container_id), "time": time.time() if now is None else now,
                                 "line": cut(one_line(line), MAX_LINE)}
    small = json.dumps(record).encode("utf-8")
    for key, value in (details or {}).items():
        if key in record:
            continue
        item = {**record, key: value}
        data = json.dumps(item).encode("utf-8")
        if len(data) <= MAX_REASON_BYTES:
            record, small = item, data
    return small


def write_reason(
    state_dir: str, container_id: str, line: str, details: Mapping[str, object] | None = None
) -> str | None:
    """Keep the rejection reason where ``numa-pin explain`` finds it (crun hides hook stderr)."""
    path = reason_path(state_dir, container_id)
    try:
        directory = reasons_dir(state_dir)
        payload = reason_document(container_id, line, details)
        replace_private(directory, path, payload, prefix=_TEMP_PREFIX)
        if _count_write(state_dir, 1 + (len(payload) >> 10)):
            _prune(directory, MAX_REASONS)
    except (OSError, UnsafePathError):
        return None
    return path


def prune_every() -> int:
    """The units (a file, plus one per KiB) written between two prunes of the reasons directory."""
    return max(1, min(MAX_REASONS, MAX_REASONS_BYTES >> 10) // PRUNE_SHARE)


def _count_write(state_dir: str, units: int) -> bool:
    """Count ``units`` written; True (and the count starts again) when it is time to prune.
    Two writers may both prune: that is only a scan too many."""
    fd = os.open(os.path.join(state_dir, _WRITES),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"." * units)
        if os.fstat(fd).st_size < prune_every():
            return False
        os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)


def reasons_dir(state_dir: str) -> str:
    """``<state_dir>/reasons``, created 0700 (the state directory too); the state directory must pass
    :func:`numa_pin.base.safefs.check_dir`, and ``reasons`` must be a real directory, not a symlink.

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


def read_reasons(state_dir: str) -> dict[str, dict[str, object]]:
    """Every recorded rejection, by container id (for id prefixes and ``explain --last``).

    Files that are unreadable, not private regular files, or foreign are skipped; nothing is
    read through a symlinked ``reasons/`` or a state directory that fails its checks.
    """
    directory = os.path.join(state_dir, REASONS)
    try:
        check_dir(state_dir)
        check_dir(directory, follow=False)
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except (OSError, UnsafePathError):
        return {}
    out: dict[str, dict[str, object]] = {}
    for name in names:
        try:
            raw = read_regular_file(os.path.join(directory, name), MAX_REASON_BYTES, follow=False)
            doc = json_loads_bounded(raw, 8)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("container_id"), str):
            out[doc["container_id"]] = doc  # a cut id: explain finds it by that prefix
    return out


def read_set_aside(state_dir: str) -> dict[str, dict[str, object]]:
    """The grants set aside (:meth:`numa_pin.service.base.ServiceBase.set_aside`), by container id:
    their reason files, marked ``set_aside``."""
    return {cid: doc for cid, doc in read_reasons(state_dir).items() if doc.get("set_aside") is True}


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



def lock_wait_line(holder: int | None) -> str:
    """The line that says an admission is waiting for the ledger lock, and who holds it."""
    who = f"pid {holder}" if holder is not None else "another process"
    return f"numa-pin: waiting for the ledger lock (held by {who})"


def lock_wait_notice(holder: int | None) -> None:
    """Log that this admission is waiting for the ledger lock (:func:`lock_wait_line`). To the
    system log, never to stderr: an outcome is one line (a lock timeout names the holder itself)."""
    log_syslog(lock_wait_line(holder), error=False)



__all__ = ["MAX_REASONS", "MAX_REASONS_BYTES", "MAX_REASON_BYTES", "PRUNE_SHARE", "decision_line", "forget_reason",
           "forget_reasons", "lock_wait_line", "lock_wait_notice", "log_decision", "log_syslog", "prune_every",
           "prune_reasons", "read_reason", "read_reasons", "read_set_aside", "reason_document", "reason_path",
           "reasons_dir", "write_reason"]
