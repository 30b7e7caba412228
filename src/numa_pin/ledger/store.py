"""The node ledger on disk: a checksummed JSON snapshot replaced atomically, and a journal of the
commits since (stdlib only; the snapshot's bytes are :mod:`numa_pin.ledger.codec`'s, the
journal's :mod:`numa_pin.ledger.journal`'s, and :mod:`numa_pin.ledger.reader` reads both).

Layout under ``state_dir``: ``ledger.json``, the snapshot, ``{"version": N, "checksum":
"sha256:<hex>", "data": {...}}``; ``ledger.log``, the journal, one checksummed record per
commit since the snapshot, each naming the snapshot's checksum; and ``ledger.lock``, the
``flock(2)`` target, holding the current writer's pid.

``checksum`` is the SHA-256 of the *canonical* JSON of ``data`` (sorted keys, no whitespace,
ASCII). Writers serialise on an exclusive ``flock`` taken with a bounded wait. A snapshot of
:data:`JOURNAL_FROM_BYTES` or more is stamped :data:`~numa_pin.ledger.migrate.LEDGER_VERSION` (5),
a smaller one :data:`~numa_pin.ledger.migrate.SNAPSHOT_ONLY_VERSION` (4), which releases from
before the journal read: they refuse the first, which records may follow, instead of missing the
records. :meth:`Ledger.fold` writes the ledger as one version-4 snapshot before a downgrade. A
commit whose snapshot has :data:`JOURNAL_FROM_BYTES` and version 5 appends the record of what it
changed to the journal and syncs the journal alone (its cost is the change's, not the ledger's);
once the journal would pass an eighth of the snapshot (:data:`JOURNAL_SHARE`), or on a smaller
ledger, the commit writes a new snapshot instead (under a temporary name in the same directory,
fsynced, ``os.replace``-d over ``ledger.json``, the directory fsynced) and then empties the
journal, so a busy node's commits cost a flat amortised amount. Readers never lock: the state is
the snapshot with the records that name it replayed in order. A crash at any instant leaves the
state before or after the commit: a torn last record (an append that never returned) is ignored and
cut off by the next writer, and records that name an older snapshot (a crash between a new snapshot
and the emptying) are ignored whole. A reader that a new snapshot overtook while it read the
journal reads again.

Protection: ``state_dir`` must be root's and not writable by others (mode 0700 is created and
recommended). The checksum is unkeyed, so anyone who can write ``state_dir`` could forge grants;
a key would have to be stored where the same writer could read it. So every use checks the
directory and its parents (:func:`numa_pin.base.safefs.check_dir`) and refuses with
:class:`~numa_pin.errors.UnsafePathError` when others could write there; ``ledger.lock`` is
opened with ``O_NOFOLLOW`` and must be this user's regular file, as must ``ledger.log``; both
ledger files are 0600.

A commit is all or nothing with what the caller did for it: a caller that changed the machine
inside the transaction (cgroups, devices, netdevs) registers how to undo it
(:meth:`Transaction.on_commit_failure`); when the write fails (ENOSPC, EIO from ``fsync``, a
ledger that would pass :data:`MAX_LEDGER_BYTES`) that undo runs before the error leaves the
``with`` block, so a failed write leaves the machine as it found it. Work that must only happen
once the commit is durable (giving a VF back to the host) goes in
:meth:`Transaction.after_commit`, which runs after the write, still under the lock.

A missing ``ledger.json`` is the empty ledger. Anything else that does not parse, has the wrong
shape or fails its checksum (a journal record included, unless it is the last one cut short by
a crash, or a journal whose records do not follow on from the snapshot) raises :class:`~numa_pin.errors.LedgerCorrupt`;
the ledger is never reset silently, because forgetting grants would hand the same CPUs
and devices out twice.
"""

from __future__ import annotations

import _thread  # get_ident only: threading costs every hook start ~0.7 ms
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from numa_pin.base.boundedio import UnsafeInput, read_regular_file
from numa_pin.base.safefs import NotDurable, ensure_dir, flock_within, fsync_dir, open_private, replace_private
from numa_pin.errors import LedgerCorrupt, LedgerError, LedgerLockTimeout, LedgerOvertaken, UnsafePathError
from numa_pin.ledger import reader
from numa_pin.ledger.codec import MAX_NAME_CHARS, REMEDY, check_new_grants, checksum, decode, encode, encode_checked
from numa_pin.ledger.migrate import LEDGER_VERSION, SNAPSHOT_ONLY_VERSION
from numa_pin.ledger.model import LedgerState
from numa_pin.ledger.reader import JOURNAL_FILE, MAX_LEDGER_BYTES, Read, ReadCache
from numa_pin.ledger.reader import reason as _reason
from numa_pin.ledger.transaction import Transaction

LEDGER_FILE = "ledger.json"
LOCK_FILE = "ledger.lock"
_TMP_PREFIX = ".ledger.json."
_TMP_SUFFIX = ".tmp"

#: a wait for the lock longer than this is reported (``on_wait``)
WAIT_NOTICE_S = 1.0

#: a snapshot smaller than this is rewritten whole at every commit (that costs about what an append
#: does, and a small node's ledger stays one file); from it on, commits append to the journal
JOURNAL_FROM_BYTES = 64 << 10
#: a commit that would grow the journal past this share of the snapshot writes a new snapshot: a
#: compaction every few hundred commits keeps a commit's amortised cost flat, and a reader that
#: holds nothing replays at most an eighth of the ledger on top of decoding it
JOURNAL_SHARE = 8

_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.05

class Ledger:
    """The ledger file of one node, under ``state_dir``.

    ``lock_timeout`` bounds how long :meth:`transaction` waits for another writer. ``cache``
    keeps the files this ledger read or wrote last open, so an unchanged ledger is not read
    again (:class:`~numa_pin.ledger.reader.ReadCache`; the ledgers of one agent child share its
    warm state's); None: a cache of its own.
    """

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 10.0,
                 cache: ReadCache | None = None) -> None:
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must not be negative, got {lock_timeout}")
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, LEDGER_FILE)
        self.journal_path = os.path.join(self.state_dir, JOURNAL_FILE)
        self.lock_path = os.path.join(self.state_dir, LOCK_FILE)
        self.lock_timeout = float(lock_timeout)
        self.cache = ReadCache() if cache is None else cache
        self._in_transaction: set[int] = set()  # threads holding a transaction on this ledger

    def __repr__(self) -> str:
        return f"Ledger({self.state_dir!r}, lock_timeout={self.lock_timeout})"

    def identity(self) -> tuple[int, ...] | None:
        """The snapshot's and the journal's device, inode, size, modification and change time
        (an ``lstat`` each; None when there is neither): every commit, by any process, changes it."""
        snapshot, log = reader.stat_identity(self.path), reader.stat_identity(self.journal_path)
        if snapshot is None and log is None:
            return None
        return (*(snapshot or (0,)), *(log or (0,)))

    def read(self) -> LedgerState:
        """The current state, without locking (the snapshot is only ever replaced whole, the
        journal appended to; a reader that a new snapshot overtook reads again, and one overtaken
        every time, by a writer compacting faster than it reads, reads under the lock).

        Raises:
            LedgerCorrupt: the file exists but is not a valid ledger.
            LedgerError: the file could not be read.
        """
        return self._load()

    @contextmanager
    def transaction(
        self, timeout: float | None = None, on_wait: Callable[[int | None], None] | None = None
    ) -> Iterator[Transaction]:
        """Lock, read, let the caller change ``txn.state``, write it durably, unlock.

        Nothing is written when the block raises or leaves the state unchanged. ``timeout``
        (default ``lock_timeout``) bounds the wait for the lock; when the wait passes
        :data:`WAIT_NOTICE_S`, ``on_wait`` is called once with the holder's pid (or None).

        Raises:
            LedgerLockTimeout: another writer held the lock for ``lock_timeout`` seconds.
            LedgerCorrupt: the current file is not a valid ledger.
            LedgerError: the state directory, lock or file could not be used; or this
                thread already holds a transaction on this ledger (it would deadlock).
        """
        with self._locked(timeout, on_wait):
            got = reader.read(self.cache, self.state_dir, self.path, self.journal_path)
            txn = Transaction(got.state)
            yield txn
            if txn.changed:
                try:
                    check_new_grants(txn._initial, txn.state, self.path)
                    self._commit(txn.state, got)
                except LedgerError as exc:
                    txn._failed(exc)
                    raise
            txn._committed()

    def rebuild(self, build: Callable[[bytes | None], LedgerState],
                timeout: float | None = None) -> tuple[LedgerState, str | None, bool]:
        """Replace a corrupt or missing ledger with ``build(raw)`` under the lock (``numa-pin recover``).

        ``raw`` is the damaged file's bytes (None when it is missing or cannot be read at all).
        Returns ``(state, aside, rebuilt)``: a valid ledger is left alone (``rebuilt`` False);
        a damaged one is first linked to ``ledger.json.corrupt-<unix time>`` (``aside``, kept for
        inspection; the journal, if any, to ``ledger.log.corrupt-<unix time>``), then the built
        state replaces it atomically and the journal is removed, so a failure at any point leaves
        either the damaged ledger or the new one in place, never no ledger (which would read as
        empty and hand everything out again).

        Raises:
            LedgerError: the lock, the link or the write failed (nothing changed).
        """
        with self._locked(timeout, None):
            raw: bytes | None = None
            aside = None
            log = os.path.lexists(self.journal_path)
            if os.path.lexists(self.path):
                try:
                    return self._load(), None, False
                except LedgerCorrupt:
                    pass
                try:
                    raw = read_regular_file(self.path, MAX_LEDGER_BYTES, follow=False)
                except (OSError, UnsafeInput):
                    raw = None
                aside = self._keep_aside(self.path)
            if log:
                self._keep_aside(self.journal_path)
            state = build(raw)
            self._write(state)
            if log:
                self._remove_journal()
            return state, aside, True

    def fold(self, timeout: float | None = None) -> tuple[LedgerState, bool]:
        """Make the ledger one snapshot that a release from before the journal reads, under the
        lock (``numa-pin recover --fold``, before a downgrade): the state (the journal replayed)
        written as a version-4 snapshot, then the journal removed, each step durable. A crash at
        any step leaves the ledger as it read: before the new snapshot the old one with its
        journal; after it, records that name the old snapshot, ignored. Returns ``(state,
        folded)``; ``folded`` is False, and nothing is written, when there is nothing to fold (no
        journal and no version-5 snapshot; no ledger at all: the state directory is not made).
        The next commit writes as usual (a snapshot of 64 KiB stamped version 5 again).

        Raises:
            LedgerCorrupt: the ledger is not valid (``numa-pin recover`` first).
            LedgerError: the lock, the write or the removal failed.
        """
        if not (os.path.lexists(self.path) or os.path.lexists(self.journal_path)):
            return LedgerState(), False
        with self._locked(timeout, None):
            got = reader.read(self.cache, self.state_dir, self.path, self.journal_path)
            log = os.path.lexists(self.journal_path)
            if not log and got.version <= SNAPSHOT_ONLY_VERSION:
                return got.state, False
            if got.base is not None:
                self._write(got.state, got, SNAPSHOT_ONLY_VERSION)
            if log:
                self._remove_journal()
            return got.state, True

    def _remove_journal(self) -> None:
        """Remove ``ledger.log`` durably (its directory synced). Raises LedgerError."""
        try:
            os.unlink(self.journal_path)
            fsync_dir(self.state_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise LedgerError(f"cannot remove the journal: {_reason(exc)}", path=self.journal_path) from exc

    def _keep_aside(self, path: str) -> str:
        """A hard link ``<path>.corrupt-<unix time>[.<n>]`` to the damaged file."""
        stamp = f"{path}.corrupt-{int(time.time())}"
        for n in range(100):
            aside = stamp if n == 0 else f"{stamp}.{n}"
            try:
                os.link(path, aside, follow_symlinks=False)
                return aside
            except FileExistsError:
                continue
            except OSError as exc:
                raise LedgerError(f"cannot keep the damaged ledger aside: {_reason(exc)}", path=self.path) from exc
        raise LedgerError("cannot keep the damaged ledger aside: 100 copies already", path=self.path)

    # ---- locking -------------------------------------------------------------------

    @contextmanager
    def _locked(self, timeout: float | None, on_wait: Callable[[int | None], None] | None) -> Iterator[None]:
        """Hold the lock (waiting at most ``timeout``, default ``lock_timeout``), with the temp files
        of a writer that died removed; refuses a second hold by the same thread (a deadlock)."""
        thread = _thread.get_ident()
        if thread in self._in_transaction:
            raise LedgerError("nested ledger transaction in one thread", path=self.path)
        self._in_transaction.add(thread)
        try:
            fd = self._lock(self.lock_timeout if timeout is None else timeout, on_wait)
            try:
                self._remove_stale_temp_files()
                yield
            finally:
                _unlock(fd)
        finally:
            self._in_transaction.discard(thread)

    def _lock(self, timeout: float, on_wait: Callable[[int | None], None] | None) -> int:
        try:
            fd = self._open_lock_file()
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger lock: {_reason(exc)}", path=self.lock_path) from exc
        try:
            self._wait_for_lock(fd, timeout, on_wait)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:  # a state_dir full to the last page (ENOSPC)
                raise LedgerError(f"cannot record the lock holder: {_reason(exc)}", path=self.lock_path) from exc
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_lock_file(self) -> int:
        """``ledger.lock`` in a checked state directory (created 0700), opened without following
        a symlink and checked to be this user's private regular file before it is written.

        Raises:
            UnsafePathError: the state directory or the lock file fails the checks of
                :mod:`numa_pin.base.safefs`.
            OSError: it cannot be created or opened (``ELOOP``: a symlink).
        """
        ensure_dir(self.state_dir, 0o700)
        return open_private(self.lock_path, os.O_RDWR | os.O_CREAT)

    def _wait_for_lock(self, fd: int, timeout: float, on_wait: Callable[[int | None], None] | None) -> None:
        notice = None if on_wait is None else (WAIT_NOTICE_S, lambda: on_wait(_read_holder(fd)))
        try:
            held = flock_within(fd, timeout, poll=(_POLL_MIN_S, _POLL_MAX_S), notice=notice)
        except OSError as exc:
            raise LedgerError(f"cannot lock: {_reason(exc)}", path=self.lock_path) from exc
        if not held:
            raise LedgerLockTimeout(self._timeout_message(fd, timeout), path=self.lock_path)

    def _timeout_message(self, fd: int, timeout: float) -> str:
        msg = f"another numa-pin held the ledger lock for more than {timeout:g}s"
        holder = _read_holder(fd)
        if holder is not None:
            msg += f" (held by pid {holder}"
            if holder == os.getpid():
                msg += ", this process: a nested transaction?"
            msg += ")"
        return msg

    # ---- reading and writing -------------------------------------------------------

    def _load(self) -> LedgerState:
        try:
            return reader.read(self.cache, self.state_dir, self.path, self.journal_path).state
        except LedgerOvertaken:  # a writer that keeps compacting: read between two of its commits
            with self._locked(None, None):
                return reader.read(self.cache, self.state_dir, self.path, self.journal_path).state

    def _commit(self, state: LedgerState, got: Read) -> None:
        """Write ``state``, read as ``got`` under the lock: one record appended to the journal
        when the snapshot has :data:`JOURNAL_FROM_BYTES` and the journal stays within
        :data:`JOURNAL_SHARE` of it (the ledger within
        :data:`MAX_LEDGER_BYTES`, the journal's JSON counted thrice for the snapshot's indents);
        else a new snapshot, and the journal emptied."""
        if got.base is not None and got.size >= JOURNAL_FROM_BYTES and got.version == LEDGER_VERSION:
            from numa_pin.ledger.journal import encode_record  # a small ledger has no journal

            start, seq = (0, 0) if got.journal is None else (got.journal[1].end, got.journal[1].seq)
            line = encode_record(got.base, seq + 1, got.state, state)
            end = start + len(line)
            if end <= got.size // JOURNAL_SHARE and got.size + 3 * end <= MAX_LEDGER_BYTES:
                self._append(state, got, line, start, seq + 1)
                return
        self._write(state, got)
        if got.journal is not None:
            from numa_pin.ledger import journal

            journal.empty(self.journal_path)

    def _append(self, state: LedgerState, got: Read, line: bytes, start: int, seq: int) -> None:
        """Append ``line``, record ``seq``, at byte ``start`` of the journal, durably.

        Raises LedgerError when it cannot be opened, written or synced: the journal is cut back to
        ``start`` (nothing changed), or the message says that failed too."""
        from numa_pin.ledger import journal

        try:
            fd, st = journal.append(self.state_dir, self.journal_path, line, start, got.journal is None)
        except (OSError, UnsafePathError) as exc:
            why = _reason(exc) if isinstance(exc, OSError) else str(exc)
            if isinstance(exc, journal.NotTakenBack):
                why += f"; taking the record back failed too ({_reason(exc.again)}): readers may see it"
            else:
                why += "; the ledger is unchanged"
            raise LedgerError(f"cannot write the ledger's journal: {why}", path=self.journal_path) from exc
        reader.appended(self.cache, self.path, got, line, start, journal.Replay(state, start + len(line), seq, False),
                        fd, st)

    def _write(self, state: LedgerState, previous: Read | None = None, version: int | None = None) -> None:
        """Replace the file with ``state``, durably, in format ``version`` (default: version 5
        from :data:`JOURNAL_FROM_BYTES` on, which records may follow, else 4). When the new file
        is in place but the directory cannot be synced, ``previous`` (the ledger read under the
        lock) is put back, so the failure the caller rolls back for is what every reader sees.

        Raises LedgerError (nothing changed) when the ledger would pass :data:`MAX_LEDGER_BYTES`
        (its reader would refuse it) or a write, fsync or rename fails."""
        stamp = version
        if stamp is None:  # guessed from the last size (both stamps take as many bytes), checked below
            big = previous is not None and previous.size >= JOURNAL_FROM_BYTES
            stamp = LEDGER_VERSION if big else SNAPSHOT_ONLY_VERSION
        payload, base = encode_checked(state, stamp, self.cache)
        if version is None and (len(payload) >= JOURNAL_FROM_BYTES) != (stamp == LEDGER_VERSION):
            stamp = SNAPSHOT_ONLY_VERSION if stamp == LEDGER_VERSION else LEDGER_VERSION
            payload, base = encode_checked(state, stamp, self.cache)
        if len(payload) > MAX_LEDGER_BYTES:
            raise LedgerError(f"refusing to write a ledger of {len(payload)} bytes: its reader takes at most "
                              f"{MAX_LEDGER_BYTES}", path=self.path)
        try:
            self._replace(payload)
        except NotDurable as exc:
            msg = f"cannot make the ledger durable (fsync of its directory): {_reason(exc)}"
            if previous is not None:
                try:
                    self._replace(encode(previous.state, max(previous.version, SNAPSHOT_ONLY_VERSION), self.cache))
                    msg += "; the previous ledger was put back"
                except NotDurable:
                    msg += "; the previous ledger was put back"
                except OSError as again:
                    msg += f"; putting the previous ledger back failed too: {_reason(again)}"
            raise LedgerError(msg, path=self.path) from exc
        except OSError as exc:
            raise LedgerError(f"cannot write the ledger: {_reason(exc)}", path=self.path) from exc
        reader.wrote_snapshot(self.cache, self.path, payload, state, base, stamp)

    def _replace(self, payload: bytes) -> None:
        replace_private(self.state_dir, self.path, payload, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, durable=True)

    def _remove_stale_temp_files(self) -> None:
        """Temp files left by a writer that died; only called while holding the lock."""
        try:
            names = os.listdir(self.state_dir)
        except OSError:
            return
        for name in names:
            if name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX):
                _unlink_quietly(os.path.join(self.state_dir, name))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # best effort: a leftover temp file is removed by the next writer


def _unlock(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass  # closing the descriptor below releases the lock regardless
    finally:
        os.close(fd)


def _read_holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() else None


__all__ = [
    "JOURNAL_FILE", "LEDGER_FILE", "LOCK_FILE", "MAX_LEDGER_BYTES", "MAX_NAME_CHARS", "REMEDY", "Ledger", "Transaction",
    "check_new_grants", "checksum", "decode", "encode",
]
