"""Is a grant still in use? And the pure garbage collection of dead grants.

A grant is alive when **either**

* its process exists and was started at the recorded time: ``grant.pid`` is running
  (not a zombie) and its start time equals ``grant.start_time`` to within
  :data:`START_TIME_TOLERANCE_S`, so a recycled pid does not keep a dead grant alive; or
* its cgroup still exists and still holds a process: ``<cgroup_root>/<cgroup>`` on cgroup v2
  (``populated 1`` in ``cgroup.events``), ``<cgroup_root>/cpuset/<cgroup>`` on cgroup v1 (a
  non-empty ``cgroup.procs`` in it or in a child, such as crun's ``container``). An empty cgroup
  is what a runtime leaves behind when its container was killed and its own state removed
  without ``delete``: no poststop ever comes, so the grant is dead. A cgroup without these files
  (not a kernel cgroupfs) counts as populated.

A grant with neither a pid nor a cgroup is dead: nothing could ever show it alive, so keeping it
would hold its CPUs and devices forever (no admission records one; a hand-edited or older
ledger might).

Start times are psutil's ``create_time()`` formula, computed by one reader for every proc root
(the real ``/proc``, a fake tree in tests, the host's proc mounted elsewhere): ``starttime``
ticks from ``<proc_root>/<pid>/stat`` divided by ``SC_CLK_TCK``, plus ``btime`` from
``<proc_root>/stat``. A zombie (state ``Z``, ``X``) counts as gone. Both files are world-readable,
so no process is ever unknowable.

A grant also belongs to a boot: one that records a boot id (``<proc_root>/sys/kernel/random/
boot_id`` at admission) other than this boot's is dead, whatever its pid and cgroup say
(:func:`numa_pin.ledger.derived.of_earlier_boot`): after a reboot a pid or a cgroup path can be taken again.

Because ``btime`` is wall-clock based, a clock step larger than the tolerance between
admission and the check makes a live process look recycled; the cgroup test still
keeps containers alive in that case.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from numa_pin.base.boundedio import UnsafeInput, read_regular_file
from numa_pin.enforcer.cgroups import hierarchy_dir
from numa_pin.errors import SysfsError
from numa_pin.ledger.derived import idle_split, of_other_boots
from numa_pin.ledger.model import Grant, LedgerState

#: how far a process start time may differ from the recorded one and still match
START_TIME_TOLERANCE_S = 1.0


def is_alive(
    grant: Grant,
    proc_root: str,
    cgroup_root: str,
    *,
    cgroup_version: int | None = None,
    boot_times: BootTimes | None = None,
) -> bool:
    """True while ``grant``'s process or cgroup exists (see the module docstring).

    ``cgroup_version`` is 1 or 2; ``None`` detects it (2 when
    ``<cgroup_root>/cgroup.controllers`` exists). ``boot_times``: its owner's boot times
    (None: ``<proc_root>/stat`` is read for this check).

    Raises:
        CgroupEscapeError: ``grant.cgroup`` would resolve outside the cgroup root.
        SysfsError: a proc file exists but cannot be parsed.
    """
    if grant.pid is not None and process_alive(grant.pid, grant.start_time, proc_root, boot_times):
        return True
    if grant.cgroup is not None:
        directory = cgroup_dir(grant.cgroup, cgroup_root, cgroup_version)
        return os.path.isdir(directory) and cgroup_populated(directory)
    return False


#: how deep :func:`cgroup_populated` looks for processes in child cgroups (v1)
MAX_CGROUP_DEPTH = 4


def cgroup_populated(directory: str, depth: int = MAX_CGROUP_DEPTH) -> bool:
    """Does the cgroup at ``directory`` (or a descendant) hold a process?

    cgroup v2 says so in ``cgroup.events`` (``populated 0|1``); on v1 the ``cgroup.procs`` of
    the group and its children (at most ``depth`` levels) are read. A directory with neither
    file is not a kernel cgroup and counts as populated, so nothing is collected on a guess.
    """
    try:
        with open(os.path.join(directory, "cgroup.events"), "rb") as fp:
            for line in fp.read(4096).splitlines():
                if line.startswith(b"populated "):
                    return line.split()[1] != b"0"
    except OSError:
        pass
    try:
        with open(os.path.join(directory, "cgroup.procs"), "rb") as fp:
            if fp.read(64).strip():
                return True
    except FileNotFoundError:
        return True
    except OSError:
        return True  # unreadable: do not collect on a guess
    if depth <= 0:
        return False
    try:
        children = [e.path for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return True
    return any(cgroup_populated(child, depth - 1) for child in children)


def boot_clock() -> float:
    """Seconds since boot on CLOCK_BOOTTIME (counts suspend; no wall-clock step moves it)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def pending_age(grant: Grant) -> float:
    """How long ago a grant made before its container existed was made, in seconds.

    Measured on :func:`boot_clock` from ``grant.pending_since``, so a wall-clock step changes
    nothing; a stamp from before this boot (a larger one) is infinitely old. A grant without
    the stamp (an older ledger) falls back to the wall clock, and a clock stepped back past its
    ``created`` makes it infinitely old rather than young: a never-started container's grace
    period never grows by the size of a backward step."""
    if grant.pending_since is not None:
        age = boot_clock() - grant.pending_since
    else:
        age = time.time() - grant.created
    return age if age >= 0 else float("inf")


def pending_abandoned(grant: Grant, cgroup_root: str, settle_s: float) -> bool:
    """Whether the runtime gave up a pending grant's container (no pid yet) before it started;
    evidence, not age. Either

    * the root filesystem the runtime was given at precreate (``grant.pending_root``) is gone:
      ``podman rm`` removes the container's storage with it, so it can never start; or
    * its expected cgroup exists, holds no process, and ``settle_s`` have passed since precreate:
      runc and crun place the container's init in its cgroup as they create it (systemd starts
      the scope with it), so an empty one means that process is gone. ``settle_s`` covers the
      instant between the cgroupfs driver's ``mkdir`` and the init joining.

    A cgroup that does not exist yet is no evidence (the runtime has not created it, or podman
    keeps the container to start later); such a grant waits for its grace period.
    """
    if grant.pid is not None or grant.cgroup is None:
        return False
    if grant.pending_root is not None and not os.path.isdir(grant.pending_root):
        return True
    directory = cgroup_dir(grant.cgroup, cgroup_root)
    return pending_age(grant) >= settle_s and os.path.isdir(directory) and not cgroup_populated(directory)


#: where the kernel says which boot this is, under the proc root
BOOT_ID_FILE = ("sys", "kernel", "random", "boot_id")


def read_boot_id(proc_root: str) -> str | None:
    """This boot's id (``<proc_root>/sys/kernel/random/boot_id``), or None when it cannot be read."""
    try:
        text = read_regular_file(os.path.join(proc_root, *BOOT_ID_FILE), 128).decode("ascii", "replace").strip()
    except (OSError, UnsafeInput):
        return None
    return text if text and text.isprintable() else None


def collect_garbage(
    state: LedgerState, alive_fn: Callable[[Grant], bool]
) -> tuple[LedgerState, tuple[Grant, ...]]:
    """Drop grants ``alive_fn`` reports dead, and pod records left without grants (pure).

    Returns the new state and the removed grants ordered by container id (so the caller
    can undo their enforcement: restore netdevs, release devices).
    """
    return _dropping(state, [g for g in state.grants.values() if not alive_fn(g)])


def _dropping(state: LedgerState, removed: list[Grant]) -> tuple[LedgerState, tuple[Grant, ...]]:
    """``state`` without the grants ``removed`` and the pod records left without grants."""
    if not removed and not state.pods:
        return state, ()
    removed.sort(key=_container_id)
    gone = {g.container_id for g in removed}
    alive = {cid: g for cid, g in state.grants.items() if cid not in gone} if gone else state.grants
    pods_in_use = {g.pod_id for g in alive.values()}
    pods = {pid: rec for pid, rec in state.pods.items() if pid in pods_in_use}
    if not removed and len(pods) == len(state.pods):
        return state, ()
    return LedgerState(alive, pods), tuple(removed)


def _container_id(grant: Grant) -> str:
    return grant.container_id


#: how many of the grants that hold nothing for themselves (shared containers outside any pod
#: record) one admission or release checks; the others are taken as alive until their turn
SHARED_CHECKS = 32


def collect_needed(state: LedgerState, alive_fn: Callable[[Grant], bool], boot_id: str | None,
                   start: int | None = None, *, sample: bool = True) -> tuple[LedgerState, tuple[Grant, ...]]:
    """:func:`collect_garbage` of what an admission's decision needs. A grant that holds
    something (exclusive CPUs, devices, memory, an affinity, moved netdevs) or belongs to a pod
    with a record is asked ``alive_fn`` every time, because what it holds is free again only
    once it is dropped. Of the grants that hold nothing (the shared containers, thousands on a
    busy node) only :data:`SHARED_CHECKS` consecutive ones by container id are asked, starting
    at ``start`` (default: a random place), so every one gets its turn within a few dozen
    admissions; of the rest only those recorded under a boot other than ``boot_id`` are dropped
    (:func:`~numa_pin.ledger.derived.of_earlier_boot`, no ``/proc`` read). A dead shared container costs nothing
    meanwhile: its cgroup is gone, so the shared-pool resize skips it.

    What this needs of ``state`` is worked out once per state (:func:`idle_grants`), so the
    admission that locks the state the agent's spare rehearsed on looks at a few dozen grants,
    not at every one. Without ``sample`` no grant that holds nothing is asked: the agent's child
    leaves their turn (:func:`sample_idle`) until after its reply."""
    idle = idle_grants(state)
    if len(idle) <= SHARED_CHECKS:
        return collect_garbage(state, alive_fn)
    turn = _turn(idle, start) if sample else []
    grants = state.grants
    removed = [g for g in idle_split(state)[1] if not alive_fn(g)]
    removed += [grants[cid] for cid in turn if not alive_fn(grants[cid])]
    asked = set(turn)
    removed += [grants[cid] for cid in of_other_boots(state, boot_id) if cid not in asked]
    return _dropping(state, removed)


def sample_idle(state: LedgerState, alive_fn: Callable[[Grant], bool],
                start: int | None = None) -> tuple[LedgerState, tuple[Grant, ...]]:
    """The turn of :func:`collect_needed` that an admission without ``sample`` left out: of the
    grants that hold nothing, :data:`SHARED_CHECKS` in a row by container id from ``start``
    (default: a random place) are asked ``alive_fn``, and the dead ones dropped."""
    idle = idle_grants(state)
    if len(idle) <= SHARED_CHECKS:
        return state, ()  # the admission asked every one
    grants = state.grants
    return _dropping(state, [grants[cid] for cid in _turn(idle, start) if not alive_fn(grants[cid])])


def _turn(idle: list[str], start: int | None) -> list[str]:
    """:data:`SHARED_CHECKS` ids of ``idle`` in a row from ``start`` (default: a random place),
    wrapping around."""
    if start is None:
        start = int.from_bytes(os.urandom(4), "little")
    first = start % len(idle)
    return idle[first:first + SHARED_CHECKS] + idle[:max(0, first + SHARED_CHECKS - len(idle))]


def idle_grants(state: LedgerState) -> list[str]:
    """The ids of ``state``'s grants that hold nothing and belong to no pod with a record, sorted
    (worked out once per state and carried to the state one grant later: the snapshot an
    admission decides on is the state it locks, and the agent's spare worked it out as it
    rehearsed; :func:`numa_pin.ledger.derived.idle_split`)."""
    return idle_split(state)[0]


def prepare(state: LedgerState, boot_id: str | None) -> None:
    """Work out now what :func:`collect_needed` needs of ``state`` (the agent's spare, as it
    rehearses: the admission it then runs locks this state)."""
    of_other_boots(state, boot_id)


def cgroup_dir(cgroup: str, cgroup_root: str, version: int | None = None) -> str:
    """The directory of ``cgroup`` (relative to the hierarchy root) in the cpuset hierarchy:
    ``<cgroup_root>/cpuset/<cgroup>`` on v1, ``<cgroup_root>/<cgroup>`` on v2
    (:func:`numa_pin.enforcer.cgroups.hierarchy_dir`).

    Raises:
        CgroupEscapeError: the path leaves the hierarchy (``..`` components, symlinks).
    """
    if version is None:
        version = detect_cgroup_version(cgroup_root)
    return hierarchy_dir(cgroup, cgroup_root, "" if version == 2 else "cpuset")


def detect_cgroup_version(cgroup_root: str) -> int:
    """2 when ``cgroup_root`` is a unified (v2) mount, else 1 (v1 or hybrid)."""
    return 2 if os.path.isfile(os.path.join(cgroup_root, "cgroup.controllers")) else 1


def process_alive(pid: int, start_time: float | None, proc_root: str, boot_times: BootTimes | None = None) -> bool:
    """True when ``pid`` runs, is not a zombie, and (if given) started at ``start_time``
    (``boot_times``: as :func:`is_alive`'s).

    Raises:
        SysfsError: ``<proc_root>/<pid>/stat`` or ``<proc_root>/stat`` is unparsable.
    """
    created = _stat_create_time(pid, proc_root, boot_times)
    if created is None:
        return False
    return _same_start(start_time, created)


def process_start_time(pid: int, proc_root: str, boot_times: BootTimes | None = None) -> float | None:
    """psutil-compatible ``create_time`` of ``pid`` read from ``proc_root``; None if gone
    (``boot_times``: as :func:`is_alive`'s).

    Raises:
        SysfsError: the proc files are unparsable.
    """
    return _stat_create_time(pid, proc_root, boot_times)


def _same_start(recorded: float | None, actual: float) -> bool:
    return recorded is None or abs(recorded - actual) <= START_TIME_TOLERANCE_S


def _stat_create_time(pid: int, proc_root: str, boot_times: BootTimes | None) -> float | None:
    path = os.path.join(proc_root, str(pid), "stat")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # no file object: a pass reads every grant's
        try:
            text = os.read(fd, 4096).decode("ascii", "replace")  # one line, under 1 KiB
        finally:
            os.close(fd)
    except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
        return None
    except OSError as exc:
        raise SysfsError(path, f"cannot read: {exc.strerror}", exc.errno) from None
    # "pid (comm) state ppid ..."; comm may hold spaces and parentheses
    rparen = text.rfind(")")
    fields = text[rparen + 1 :].split() if rparen >= 0 else []
    if len(fields) < 20 or not fields[19].isdigit():
        raise SysfsError(path, "no starttime field (not a /proc/<pid>/stat file?)")
    if fields[0] in ("Z", "X", "x"):
        return None  # zombie or dead: the process is gone
    ticks = int(fields[19])
    btime = _read_boot_time(proc_root) if boot_times is None else boot_times.of(proc_root)
    return float(ticks) / os.sysconf("SC_CLK_TCK") + btime


#: how long a boot time read stays :class:`BootTimes`' answer
BOOT_TIME_TTL_S = 1.0


class BootTimes:
    """The boot time (``btime`` of ``<proc_root>/stat``) of each proc root, read at most once a
    second, not once per grant (``/proc/stat`` lists every CPU; a liveness pass checks every
    grant). Its owner (a node, or the agent child's warm state its services share) passes it
    to :func:`is_alive`, :func:`process_alive` and :func:`process_start_time`."""

    def __init__(self) -> None:
        #: ``{proc_root: (monotonic time read, btime)}``
        self.read: dict[str, tuple[float, float]] = {}

    def of(self, proc_root: str) -> float:
        """``<proc_root>/stat``'s boot time, as read less than :data:`BOOT_TIME_TTL_S` ago.

        Raises:
            SysfsError: the file is unreadable or has no ``btime`` line.
        """
        now = time.monotonic()
        known = self.read.get(proc_root)
        if known is not None and 0 <= now - known[0] < BOOT_TIME_TTL_S:
            return known[1]
        btime = _read_boot_time(proc_root)
        self.read[proc_root] = (now, btime)
        return btime


def _read_boot_time(proc_root: str) -> float:
    path = os.path.join(proc_root, "stat")
    try:
        with open(path, "rb") as fp:
            for line in fp:
                if line.startswith(b"btime"):
                    parts = line.split()
                    if len(parts) == 2 and parts[1].isdigit():
                        return float(parts[1])
                    break
    except OSError as exc:
        raise SysfsError(path, f"cannot read: {exc.strerror}", exc.errno) from None
    raise SysfsError(path, "no btime line")


__all__ = [
    "BOOT_TIME_TTL_S",
    "BootTimes",
    "cgroup_populated",
    "START_TIME_TOLERANCE_S",
    "cgroup_dir",
    "collect_garbage",
    "collect_needed",
    "prepare",
    "sample_idle",
    "idle_grants",
    "detect_cgroup_version",
    "is_alive",
    "boot_clock",
    "pending_abandoned",
    "pending_age",
    "process_alive",
    "process_start_time",
]
