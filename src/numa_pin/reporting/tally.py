"""Counts that outlive every process: what ``numa-pin metrics`` and the agent's listener export
as counters and histograms.

Admissions run in many short processes (an in-process hook, the agent's child, ``numa-pin run``),
so the counts cannot live in one process's memory. They are kept in ``<state_dir>/counters.json``:
one flat JSON object of :data:`KEYS` to non-negative numbers, replaced atomically
(:func:`numa_pin.base.safefs.replace_private`) under an exclusive ``flock`` of
``<state_dir>/counters.lock``, so concurrent writers never lose each other's counts and a reader
(who takes no lock) sees the old or the new file, never a part; the temporary file of a writer
killed while it wrote is removed by the next one. The file is bounded: only the
keys in :data:`KEYS` are kept (a fixed set: reason classes are the error kinds of
:mod:`numa_pin.errors`, anything else counts as ``other``), and it is never over
:data:`MAX_BYTES`.

Counting never fails or delays an admission by much: a writer that cannot get the lock within
:data:`LOCK_WAIT_S`, or cannot read or write the file, drops its increments (a scrape shows a
count a little low, never a wrong admission). The lock is opened as every state file is
(:func:`numa_pin.base.safefs.open_private`: never through a symlink, only a private regular file); one
that cannot be (planted as a symlink, a second hard link) would drop every count until it is
removed, so each writer it stops says so in one line to the system log. A file that is unreadable or damaged counts as
empty, and the next writer starts it again (a counter reset, which Prometheus's ``rate()``
expects).
"""

from __future__ import annotations

import errno
import json
import os

from numa_pin.base.boundedio import json_loads_bounded, read_regular_file
from numa_pin.base.safefs import ensure_dir, flock_within, open_private, replace_private
from numa_pin.base.text import MAX_LINE, cut, one_line
from numa_pin.errors import UnsafePathError

COUNTERS = "counters.json"
LOCK = "counters.lock"
#: the largest counters file written or read back
MAX_BYTES = 64 << 10
#: how long a writer waits for the counters lock before it drops its increments
LOCK_WAIT_S = 0.25
#: the temporary file a writer replaces the counters with (only ever made under the lock)
_TEMP_PREFIX, _TEMP_SUFFIX = ".counters.", ".tmp"

#: kubelet's ``topology_manager_admission_duration_ms`` buckets (ExponentialBuckets(.05, 2, 15)), ms
DURATION_MS_BUCKETS = tuple(0.05 * 2 ** i for i in range(15))
#: numa-pin's own admission latency buckets, seconds
DURATION_S_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: rejection and error reasons, by class (the kinds of numa_pin.errors); anything else is "other"
REASON_CLASSES = (
    "TopologyAffinityError", "AdmissionTimeout", "RootlessError", "AllocationError", "SMTAlignmentError",
    "AdmissionError", "RequestError", "PolicyError", "ConfigError", "TopologyError", "SysfsError",
    "LedgerError", "LedgerLockTimeout", "LedgerCorrupt", "EnforcementError", "CgroupEscapeError",
    "HookInputError", "UnsafePathError", "internal", "other",
)
#: kubelet's label values of ``container_aligned_compute_resources_count``
SCOPES = ("container", "pod")
BOUNDARIES = ("numa_node", "physical_cpu")

#: the plain counters
PLAIN = (
    "admission_requests", "admission_errors", "cpu_pinning_requests", "cpu_pinning_errors",
    "memory_pinning_requests", "memory_pinning_errors", "releases", "reconcile_runs", "reconcile_repairs",
    "reconcile_dropped", "lock_waits",
)


def _keys() -> frozenset[str]:
    keys = set(PLAIN)
    keys.update(f"rejections:{r}" for r in REASON_CLASSES)
    keys.update(f"{what}:{s}:{b}" for what in ("aligned", "aligned_failure") for s in SCOPES for b in BOUNDARIES)
    for name, buckets in (("duration_ms", DURATION_MS_BUCKETS), ("duration_s", DURATION_S_BUCKETS)):
        keys.update(f"{name}:{i}" for i in range(len(buckets) + 1))  # the last one is +Inf
        keys.add(f"{name}:sum")
    return frozenset(keys)


#: every key the counters file may hold
KEYS = _keys()


def reason_class(kind: str) -> str:
    """``kind`` when it is one of :data:`REASON_CLASSES`, else ``other`` (pure)."""
    return kind if kind in REASON_CLASSES else "other"


def bucket_index(value: float, buckets: tuple[float, ...]) -> int:
    """The index of the first bucket ``value`` fits in (``len(buckets)``: +Inf) (pure)."""
    for i, bound in enumerate(buckets):
        if value <= bound:
            return i
    return len(buckets)


def duration_increments(seconds: float) -> dict[str, float]:
    """The histogram increments of one admission that took ``seconds`` (pure)."""
    ms = seconds * 1000.0
    return {f"duration_ms:{bucket_index(ms, DURATION_MS_BUCKETS)}": 1, "duration_ms:sum": ms,
            f"duration_s:{bucket_index(seconds, DURATION_S_BUCKETS)}": 1, "duration_s:sum": seconds}


def admission_increments(*, seconds: float, cpus: bool, memory: bool, policy: str, scope: str, full_pcpus: bool,
                         error_kind: str | None) -> dict[str, float]:
    """What one decided (or failed) admission adds, with kubelet's meanings (pure): every
    admission is a topology manager admission request (``error_kind`` set: an error, and a
    rejection of that class); one that asks for exclusive CPUs is a CPU manager pinning request,
    one that asks for memory or hugepages a memory manager one (errors alike). Alignment is
    guaranteed, as kubelet counts it, on a NUMA node under ``single-numa-node`` and on whole
    physical cores with ``full-pcpus-only``; a failure of that guarantee counts as a failed
    alignment."""
    failed = error_kind is not None
    out: dict[str, float] = {"admission_requests": 1, "admission_errors": int(failed), **duration_increments(seconds)}
    if cpus:
        out.update(cpu_pinning_requests=1, cpu_pinning_errors=int(failed))
    if memory:
        out.update(memory_pinning_requests=1, memory_pinning_errors=int(failed))
    if failed:
        out[f"rejections:{reason_class(error_kind or '')}"] = 1
    scope = scope if scope in SCOPES else "container"
    aligned = "aligned_failure" if failed else "aligned"
    if policy == "single-numa-node" and (not failed or error_kind == "TopologyAffinityError"):
        out[f"{aligned}:{scope}:numa_node"] = 1
    if full_pcpus and cpus and (not failed or error_kind == "SMTAlignmentError"):
        out[f"{aligned}:{scope}:physical_cpu"] = 1
    return out


def clean(doc: object) -> dict[str, float]:
    """The known keys of ``doc`` with non-negative finite numbers; the rest is dropped (pure)."""
    if not isinstance(doc, dict):
        return {}
    out: dict[str, float] = {}
    for key, value in doc.items():
        if key in KEYS and isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e300:
            out[key] = value
    return out


def read(state_dir: str) -> dict[str, float]:
    """The counts kept under ``state_dir`` (empty when there are none or the file is damaged)."""
    try:
        raw = read_regular_file(os.path.join(state_dir, COUNTERS), MAX_BYTES, follow=False)
        return clean(json_loads_bounded(raw, 2))
    except (OSError, ValueError):
        return {}


def add(state_dir: str | None, increments: dict[str, float], *, wait_s: float = LOCK_WAIT_S) -> bool:
    """Add ``increments`` (keys of :data:`KEYS`; others are ignored) to the counts under
    ``state_dir``. Best effort: returns False, having changed nothing, when the lock cannot be
    had within ``wait_s`` seconds or the file cannot be written. Never raises OSError."""
    wanted = {k: v for k, v in increments.items() if k in KEYS and v}
    if not state_dir or not wanted:
        return not wanted
    lock = os.path.join(state_dir, LOCK)
    try:
        ensure_dir(state_dir, 0o700)
        fd = open_private(lock, os.O_RDWR | os.O_CREAT)
    except (OSError, UnsafePathError) as exc:
        report_loss(lock, exc)
        return False
    try:
        if not flock_within(fd, wait_s, poll=(0.002, 0.002)):
            return False
        _remove_dead_writers_files(state_dir)
        counts = read(state_dir)
        for key, value in wanted.items():
            counts[key] = counts.get(key, 0) + value
        replace_private(state_dir, os.path.join(state_dir, COUNTERS),
                        json.dumps(counts, sort_keys=True).encode(), prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the lock


def _remove_dead_writers_files(state_dir: str) -> None:
    """Remove the temporary counters files in ``state_dir``: a writer makes one only while it
    holds the lock, so under the lock any there is a killed writer's (best effort)."""
    try:
        names = os.listdir(state_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX):
            try:
                os.unlink(os.path.join(state_dir, name))
            except OSError:
                pass  # the next writer tries again


def loss_line(lock: str, exc: OSError | UnsafePathError) -> str:
    """The one line that says counts were dropped because ``lock`` could not be opened (pure)."""
    if isinstance(exc, UnsafePathError):
        why = str(exc)
    elif exc.errno == errno.ELOOP:
        why = f"{lock}: is a symbolic link; refusing to follow it"
    else:
        why = f"{exc.filename or lock}: {exc.strerror or exc}"
    return cut(one_line(f"numa-pin: counts for metrics dropped: {why} (remove it; numa-pin makes a new one)"),
               MAX_LINE)


def report_loss(lock: str, exc: OSError | UnsafePathError) -> None:
    """Say :func:`loss_line` in the system log (best effort, as all reporting)."""
    from numa_pin.reporting import report

    report.log_syslog(loss_line(lock, exc))


__all__ = ["BOUNDARIES", "COUNTERS", "DURATION_MS_BUCKETS", "DURATION_S_BUCKETS", "KEYS", "LOCK", "MAX_BYTES",
           "PLAIN", "REASON_CLASSES", "SCOPES", "add", "admission_increments", "bucket_index", "clean",
           "duration_increments", "loss_line", "read", "reason_class", "report_loss"]
