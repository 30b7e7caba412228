"""Reading the ledger without its lock: the snapshot ``ledger.json`` with the journal
``ledger.log`` replayed onto it (:mod:`numa_pin.ledger.journal`, imported only where a journal
exists), and :class:`ReadCache`, what a reader keeps of the files it read or wrote last, so that
an unchanged ledger is not read again (stdlib only).

:mod:`numa_pin.ledger.store` is the only user: each :class:`~numa_pin.ledger.store.Ledger` reads
through :func:`read` with the cache it was given, and tells :func:`wrote_snapshot` and
:func:`appended` what it wrote under the lock.
"""

from __future__ import annotations

import errno
import os

from numa_pin.base.boundedio import UnsafeInput, open_regular, read_fd
from numa_pin.base.record import record
from numa_pin.base.safefs import check_dir
from numa_pin.errors import LedgerError, LedgerOvertaken
from numa_pin.ledger.codec import Memo, corrupt, decode_checked
from numa_pin.ledger.migrate import LEDGER_VERSION
from numa_pin.ledger.model import LedgerState

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from numa_pin.ledger.journal import Replay

#: the journal's name beside the snapshot (:mod:`numa_pin.ledger.journal` writes it)
JOURNAL_FILE = "ledger.log"
#: largest snapshot or journal read (a grant takes about 1 KiB; a node holds hundreds, not tens of thousands)
MAX_LEDGER_BYTES = 64 << 20
#: how many times a reader reads again when a new snapshot replaced the one it read
READ_TRIES = 20

#: ``(path, snapshot descriptor, identity, journal descriptor, identity)`` of the files held open
Held = tuple[str, int, tuple[int, ...], int | None, tuple[int, ...] | None]


class ReadCache(Memo):
    """The ledger files one reader (a :class:`~numa_pin.ledger.store.Ledger`, or the ledgers of
    an agent child's services, sharing its warm state) read or wrote last, kept open, and what
    they held. While they are open their inodes cannot pass to other files, and numa-pin only
    replaces the snapshot whole and appends to the journal (or cuts it): files at these paths
    with these identities (device, inode, size, modification and change times) hold the bytes
    kept here and are not read again (an admission reads the ledger twice: the snapshot, then
    under the lock; the agent's spare read it before). Anything else that writes a file changes
    its change time. As a :class:`~numa_pin.ledger.codec.Memo` it keeps the grants its owner
    last decoded and encoded, reused while unchanged (issue 21)."""

    def __init__(self) -> None:
        super().__init__()
        #: the snapshot each path was last read or written as: (its bytes, their state, their
        #: checksum, their format version)
        self.parsed: dict[str, tuple[bytes, LedgerState, str, int]] = {}
        #: the journal each path was last read or written as: (the checksum of the snapshot it was
        #: replayed onto, its bytes, their replay); a journal that grew from these bytes is
        #: replayed from where they end
        self.replayed: dict[str, tuple[str, bytes, Replay]] = {}
        #: the files held open (None: none; the journal's None where there was none)
        self.held: Held | None = None

    def hold(self, held: Held | None) -> None:
        """Keep ``held`` open (None: hold nothing), closing the descriptors held before that it
        does not keep."""
        old, self.held = self.held, held
        if old is not None:
            for fd in (old[1], old[3]):
                if fd is not None and (held is None or fd not in (held[1], held[3])):
                    close_quietly(fd)

    def let_go(self) -> None:
        """Close the files held open and forget what they held (before their file system is
        unmounted, or when the owner is done with the ledger)."""
        self.hold(None)
        self.parsed.clear()
        self.replayed.clear()

    def __del__(self) -> None:
        held, self.held = self.held, None
        for fd in () if held is None else (held[1], held[3]):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


@record
class Read:
    """What a read found: the ``state`` (the snapshot with the journal replayed onto it), the
    snapshot's checksum ``base`` (None: no snapshot), its ``size``, ``identity`` and format
    ``version`` (0: no snapshot), and the journal's bytes and their replay (None: no journal)."""

    state: LedgerState
    base: str | None
    size: int
    identity: tuple[int, ...] | None
    journal: tuple[bytes, Replay] | None
    version: int = 0


def identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def stat_identity(path: str) -> tuple[int, ...] | None:
    """:func:`identity` of the file at ``path`` (not followed), None when there is none."""
    try:
        return identity(os.stat(path, follow_symlinks=False))
    except OSError:
        return None


def read(cache: ReadCache, state_dir: str, path: str, journal_path: str) -> Read:
    """The snapshot ``path`` with the journal ``journal_path`` replayed onto it, read again while
    a new snapshot replaced the one read before its journal was (the journal of a compaction that
    came between the two reads names the new snapshot, and the old one would miss its records).

    Raises:
        UnsafePathError: ``state_dir`` fails :func:`~numa_pin.base.safefs.check_dir`.
        LedgerCorrupt: a file is not a valid snapshot or journal.
        LedgerOvertaken: it was replaced :data:`READ_TRIES` times in a row.
        LedgerError: a file could not be read.
    """
    try:
        check_dir(state_dir)
    except FileNotFoundError:
        return Read(LedgerState(), None, 0, None, None)
    for _ in range(READ_TRIES):
        got = _read_once(cache, path, journal_path)
        if got is not None:
            return got
    raise LedgerOvertaken(f"the ledger was rewritten {READ_TRIES} times while it was read", path=path)


def _read_once(cache: ReadCache, path: str, journal_path: str) -> Read | None:
    """One read of both files (those ``cache`` holds, unchanged, are not read again); None
    when the snapshot was replaced meanwhile. Records follow only a snapshot of
    :data:`~numa_pin.ledger.migrate.LEDGER_VERSION`: beside an older one (a small ledger's) the
    journal is not looked at, and what it may still hold names an older snapshot."""
    fd, st = _open(path)
    jfd: int | None = None
    try:
        ident = None if st is None else identity(st)
        held = cache.held if cache.held is not None and cache.held[0] == path else None
        known = cache.parsed.get(path)
        if fd is None:
            raw, state, base, version = b"", LedgerState(), None, 0
        elif known is not None and held is not None and held[2] == ident:
            raw, state, base, version = known  # the very file read or written last, unchanged
        else:
            raw = _bytes(fd, path)
            if known is not None and known[0] == raw:
                state, base, version = known[1:]
            else:
                state, base, version = decode_checked(raw, path, cache)
        jfd, jst = (None, None) if fd is not None and version < LEDGER_VERSION else _open(journal_path)
        journal = None if jfd is None or jst is None else _replay(cache, path, journal_path, jfd, jst, state, base,
                                                                  held)
        if jfd is not None and stat_identity(path) != ident:
            raise _Overtaken
    except BaseException as exc:
        for each in (fd, jfd):
            if each is not None:
                close_quietly(each)
        if isinstance(exc, _Overtaken):
            return None
        raise
    if fd is None or ident is None or base is None:
        if jfd is not None:
            close_quietly(jfd)
        cache.hold(None)
    else:
        cache.parsed[path] = (raw, state, base, version)
        if journal is not None:
            cache.replayed[path] = (base, *journal)
        cache.hold((path, fd, ident, jfd, None if jst is None else identity(jst)))
    return Read(state if journal is None else journal[1].state, base, len(raw), ident, journal, version)


def _replay(cache: ReadCache, path: str, journal_path: str, fd: int, st: os.stat_result, state: LedgerState,
            base: str | None, held: Held | None) -> tuple[bytes, Replay]:
    """The journal's bytes and their replay onto the snapshot ``state`` of checksum ``base``:
    the replay kept when it is the very file, unchanged and whole; continued from where the kept
    bytes end when the journal grew from them."""
    from numa_pin.ledger.journal import replay  # only a busy node's ledger has a journal

    known = cache.replayed.get(path)
    if known is None or base is None or known[0] != base:
        raw = _bytes(fd, journal_path)
        return raw, replay(raw, base, state, journal_path)
    _, kept, done = known
    if held is not None and held[4] == identity(st) and not done.cut:
        return kept, done
    raw = _bytes(fd, journal_path)
    if done.end and raw[:done.end] == kept[:done.end]:
        return raw, replay(raw, base, done.state, journal_path, done.end, done.seq)
    return raw, replay(raw, base, state, journal_path)


def wrote_snapshot(cache: ReadCache, path: str, payload: bytes, state: LedgerState, base: str, version: int) -> None:
    """``payload``, the snapshot of ``state``, checksum ``base`` and format ``version``, was just
    written to ``path`` under the lock (the journal is about to be emptied): keep it as the last read."""
    cache.parsed[path] = (payload, state, base, version)  # the next read of these very bytes needs no decode
    cache.replayed.pop(path, None)
    try:  # under the lock: the file now at the path is the one just written
        fd, st = open_regular(path, follow=False)
    except (OSError, UnsafeInput):
        cache.hold(None)
    else:
        cache.hold((path, fd, identity(st), None, None))


def appended(cache: ReadCache, path: str, got: Read, line: bytes, start: int, replayed: Replay, fd: int,
             st: os.stat_result) -> None:
    """``line`` was just appended at byte ``start`` of the journal (open as ``fd``, ``st`` after the
    write) to the ledger read as ``got`` under the lock, making ``replayed``: keep it as the last
    read while ``cache`` holds that snapshot (else close ``fd``)."""
    held = cache.held
    if got.base is None or held is None or held[0] != path or held[2] != got.identity:
        close_quietly(fd)
        return
    raw = (b"" if got.journal is None else got.journal[0][:start]) + line
    cache.replayed[path] = (got.base, raw, replayed)
    cache.hold((path, held[1], held[2], fd, identity(st)))
def _open(path: str) -> tuple[int, os.stat_result] | tuple[None, None]:
    try:
        return open_regular(path, follow=False)
    except FileNotFoundError:
        return None, None
    except UnsafeInput as exc:
        raise corrupt(str(exc), path) from exc
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger: {reason(exc)}", path=path) from exc


def _bytes(fd: int, path: str) -> bytes:
    try:
        return read_fd(fd, MAX_LEDGER_BYTES)
    except UnsafeInput as exc:
        raise corrupt(str(exc), path) from exc
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger: {reason(exc)}", path=path) from exc


class _Overtaken(Exception):
    """A new snapshot replaced the one a reader read before it read the journal."""


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def reason(exc: OSError) -> str:
    """``exc``'s message and errno name, for a LedgerError."""
    if exc.errno is not None:
        return f"{exc.strerror or os.strerror(exc.errno)} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc)


__all__ = ["JOURNAL_FILE", "MAX_LEDGER_BYTES", "READ_TRIES", "Read", "ReadCache", "appended", "close_quietly",
           "identity", "read", "reason", "stat_identity", "wrote_snapshot"]
