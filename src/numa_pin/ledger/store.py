"""The node ledger on disk: one checksummed JSON file, replaced atomically (stdlib only; its
bytes are :mod:`numa_pin.ledger.codec`'s).

Layout under ``state_dir``: ``ledger.json``, ``{"version": N, "checksum": "sha256:<hex>",
"data": {...}}``, and ``ledger.lock``, the ``flock(2)`` target, holding the current writer's pid.

``checksum`` is the SHA-256 of the *canonical* JSON of ``data`` (sorted keys, no
whitespace, ASCII). Readers never lock: a writer builds the new file under a temporary
name in the same directory, fsyncs it, ``os.replace``-s it over ``ledger.json`` and
fsyncs the directory, so a reader (or a crash at any instant) sees either the old file
or the new one, never a mixture. Writers serialise on an exclusive ``flock`` taken with
a bounded wait.

Protection: ``state_dir`` must be root's and not writable by others (mode 0700 is created and
recommended). The checksum is unkeyed, so anyone who can write ``state_dir`` could forge grants;
a key would have to be stored where the same writer could read it. So every use checks the
directory and its parents (:func:`numa_pin.base.safefs.check_dir`) and refuses with
:class:`~numa_pin.errors.UnsafePathError` when others could write there; ``ledger.lock`` is
opened with ``O_NOFOLLOW`` and must be this user's regular file, and ``ledger.json`` is 0600.

A commit is all or nothing with what the caller did for it: a caller that changed the machine
inside the transaction (cgroups, devices, netdevs) registers how to undo it
(:meth:`Transaction.on_commit_failure`); when the write fails (ENOSPC, EIO from ``fsync``, a
ledger that would pass :data:`MAX_LEDGER_BYTES`) that undo runs before the error leaves the
``with`` block, so a failed write leaves the machine as it found it. Work that must only happen
once the commit is durable (giving a VF back to the host) goes in
:meth:`Transaction.after_commit`, which runs after the write, still under the lock.

A missing ``ledger.json`` is the empty ledger. Anything else that does not parse, has
the wrong shape or fails its checksum raises :class:`~numa_pin.errors.LedgerCorrupt`;
the ledger is never reset silently, because forgetting grants would hand the same CPUs
and devices out twice.
"""

from __future__ import annotations

import _thread  # get_ident only: threading costs every hook start ~0.7 ms
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from numa_pin.base.boundedio import UnsafeInput, open_regular, read_fd, read_regular_file
from numa_pin.base.safefs import NotDurable, check_dir, ensure_dir, flock_within, open_private, replace_private
from numa_pin.errors import LedgerCorrupt, LedgerError, LedgerLockTimeout
from numa_pin.ledger.codec import MAX_NAME_CHARS, REMEDY, check_new_grants, checksum, corrupt, decode, encode
from numa_pin.ledger.model import LedgerState
from numa_pin.ledger.transaction import Transaction

LEDGER_FILE = "ledger.json"
LOCK_FILE = "ledger.lock"
_TMP_PREFIX = ".ledger.json."
_TMP_SUFFIX = ".tmp"

#: a wait for the lock longer than this is reported (``on_wait``)
WAIT_NOTICE_S = 1.0
#: largest ledger read (a grant takes about 1 KiB; a node holds hundreds, not tens of thousands)
MAX_LEDGER_BYTES = 64 << 20

_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.05

#: the last ledger each path was read or written as: (the file's bytes, their state). A read of
#: these bytes returns the state without parsing and checking them again: an admission reads the
#: ledger twice (snapshot, then under the lock), and the agent's spare read it before (issue 21)
_PARSED: dict[str, tuple[bytes, LedgerState]] = {}
#: the ledger file this process last read or wrote, kept open: ``(path, descriptor, identity)``
#: (device, inode, size, modification and change times). While it is open its inode cannot pass
#: to another file, and numa-pin only replaces the ledger whole: a file at ``path`` with that
#: identity holds the bytes :data:`_PARSED` keeps and is not read again (issue 21). Anything else
#: that writes the file changes its change time. :func:`let_go` closes it.
_HELD: tuple[str, int, tuple[int, ...]] | None = None


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _hold(path: str, fd: int | None = None, st: os.stat_result | None = None) -> None:
    """Keep ``fd``, the file at ``path`` whose bytes :data:`_PARSED` has, as :data:`_HELD` (none:
    hold nothing), closing the one held before."""
    global _HELD
    old, _HELD = _HELD, None if fd is None or st is None else (path, fd, _identity(st))
    if old is not None:
        _close_quietly(old[1])


def let_go() -> None:
    """Close the ledger file this process holds open (before its file system is unmounted)."""
    _hold("")


class Ledger:
    """The ledger file of one node, under ``state_dir``.

    ``lock_timeout`` bounds how long :meth:`transaction` waits for another writer.
    """

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 10.0) -> None:
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must not be negative, got {lock_timeout}")
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, LEDGER_FILE)
        self.lock_path = os.path.join(self.state_dir, LOCK_FILE)
        self.lock_timeout = float(lock_timeout)
        self._in_transaction: set[int] = set()  # threads holding a transaction on this ledger

    def __repr__(self) -> str:
        return f"Ledger({self.state_dir!r}, lock_timeout={self.lock_timeout})"

    def identity(self) -> tuple[int, ...] | None:
        """The file's device, inode, size, modification and change time (one ``lstat``; None
        when there is none): every commit, by any process, changes it."""
        try:
            return _identity(os.stat(self.path, follow_symlinks=False))
        except OSError:
            return None

    def read(self) -> LedgerState:
        """The current state, without locking (the file is only ever replaced whole).

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
            txn = Transaction(self._load())
            yield txn
            if txn.changed:
                try:
                    check_new_grants(txn._initial, txn.state, self.path)
                    self._write(txn.state, txn._initial)
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
        inspection), then the built state replaces it atomically, so a failure at any point
        leaves either the damaged file or the new one in place, never no ledger (which would
        read as empty and hand everything out again).

        Raises:
            LedgerError: the lock, the link or the write failed (nothing changed).
        """
        with self._locked(timeout, None):
            raw: bytes | None = None
            aside = None
            if os.path.lexists(self.path):
                try:
                    return self._load(), None, False
                except LedgerCorrupt:
                    pass
                try:
                    raw = read_regular_file(self.path, MAX_LEDGER_BYTES, follow=False)
                except (OSError, UnsafeInput):
                    raw = None
                aside = self._keep_aside()
            state = build(raw)
            self._write(state)
            return state, aside, True

    def _keep_aside(self) -> str:
        """A hard link ``ledger.json.corrupt-<unix time>[.<n>]`` to the damaged file."""
        stamp = f"{self.path}.corrupt-{int(time.time())}"
        for n in range(100):
            aside = stamp if n == 0 else f"{stamp}.{n}"
            try:
                os.link(self.path, aside, follow_symlinks=False)
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
            check_dir(self.state_dir)
            fd, st = open_regular(self.path, follow=False)
        except FileNotFoundError:
            return LedgerState()
        except UnsafeInput as exc:
            raise corrupt(str(exc), self.path) from exc
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger: {_reason(exc)}", path=self.path) from exc
        known = _PARSED.get(self.path)
        held = _HELD
        if known is not None and held is not None and held[0] == self.path and held[2] == _identity(st):
            os.close(fd)  # the very file read or written last, unchanged
            return known[1]
        try:
            try:
                raw = read_fd(fd, MAX_LEDGER_BYTES)
            except UnsafeInput as exc:
                raise corrupt(str(exc), self.path) from exc
            except OSError as exc:
                raise LedgerError(f"cannot read the ledger: {_reason(exc)}", path=self.path) from exc
            state = known[1] if known is not None and known[0] == raw else decode(raw, self.path)
        except BaseException:
            os.close(fd)
            raise
        _PARSED[self.path] = (raw, state)
        _hold(self.path, fd, st)
        return state

    def _write(self, state: LedgerState, previous: LedgerState | None = None) -> None:
        """Replace the file with ``state``, durably. When the new file is in place but the
        directory cannot be synced, ``previous`` (the state read under the lock) is put back,
        so the failure the caller rolls back for is what every reader sees.

        Raises LedgerError (nothing changed) when the ledger would pass :data:`MAX_LEDGER_BYTES`
        (its reader would refuse it) or a write, fsync or rename fails."""
        payload = encode(state)
        if len(payload) > MAX_LEDGER_BYTES:
            raise LedgerError(f"refusing to write a ledger of {len(payload)} bytes: its reader takes at most "
                              f"{MAX_LEDGER_BYTES}", path=self.path)
        try:
            self._replace(payload)
        except NotDurable as exc:
            msg = f"cannot make the ledger durable (fsync of its directory): {_reason(exc)}"
            if previous is not None:
                try:
                    self._replace(encode(previous))
                    msg += "; the previous ledger was put back"
                except NotDurable:
                    msg += "; the previous ledger was put back"
                except OSError as again:
                    msg += f"; putting the previous ledger back failed too: {_reason(again)}"
            raise LedgerError(msg, path=self.path) from exc
        except OSError as exc:
            raise LedgerError(f"cannot write the ledger: {_reason(exc)}", path=self.path) from exc
        _PARSED[self.path] = (payload, state)  # the next read of these very bytes needs no decode
        try:  # under the lock: the file now at the path is the one just written
            _hold(self.path, *open_regular(self.path, follow=False))
        except (OSError, UnsafeInput):
            _hold(self.path)

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


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


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


def _reason(exc: OSError) -> str:
    if exc.errno is not None:
        return f"{exc.strerror or os.strerror(exc.errno)} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc)


__all__ = [
    "LEDGER_FILE", "LOCK_FILE", "MAX_NAME_CHARS", "REMEDY", "Ledger", "Transaction", "check_new_grants", "checksum",
    "decode", "encode", "let_go",
]
