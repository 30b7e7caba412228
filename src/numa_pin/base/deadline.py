"""A deadline for one admission, enforced even inside a long pure computation.

Deciding is pure Python and can be slow on big machines, so a deadline that is only checked
between steps is not enough. While a :class:`Deadline` is active in the main thread it owns
``SIGALRM``: the timer fires when the budget runs out, and the handler raises
:class:`~numa_pin.errors.AdmissionTimeout`, but only inside :meth:`Deadline.interruptible`
sections (deciding, waiting). Anywhere else (enforcing, committing, rolling back) the expiry
is remembered and raised at the next :meth:`Deadline.check`, so a write is never cut in half.

:meth:`Deadline.cancel` ends the admission early from another thread (the warm agent's child
calls it when its client has hung up). Off the main thread there is no timer; checks still work.
"""

from __future__ import annotations

import _thread  # its _local is threading.local, without importing threading (every hook start)
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from numa_pin.errors import AdmissionTimeout

#: the deadline the main thread's admission has active (it owns ``SIGALRM``): the process's, which
#: a helper thread (the agent's watch on its client) sees and may cancel
_main: Deadline | None = None
#: the deadline each other thread's admission has active (admissions in two threads must not
#: see, or leave behind, each other's)
_THREADS = _thread._local()


def current() -> Deadline | None:
    """The active deadline of this thread's admission, else the main thread's, if any."""
    return getattr(_THREADS, "deadline", None) or _main


class Deadline:
    """``seconds`` of budget for ``what`` (named in the timeout message), counted from now, or
    from ``since`` (a :func:`time.monotonic` time, such as :func:`numa_pin.hook.started.process_started`'s: the hook
    process's own start, so the time it took to start counts against the runtime's timeout too)."""

    def __init__(self, seconds: float, what: str = "admission", since: float | None = None) -> None:
        self.seconds = seconds
        self.what = what
        now = time.monotonic()
        self.since_start = since is not None and since < now
        self.expires = (min(since, now) if since is not None else now) + seconds
        self._interruptible = False
        self._reason: str | None = None
        self._armed = False
        self._previous: object = None

    # ---- state --------------------------------------------------------------------------
    def remaining(self) -> float:
        return max(0.0, self.expires - time.monotonic())

    def expired(self) -> bool:
        return self._reason is not None or time.monotonic() >= self.expires

    def _error(self) -> AdmissionTimeout:
        if self._reason is not None:
            return AdmissionTimeout(f"{self.what} stopped: {self._reason}")
        counted = ", counted from the hook's start" if self.since_start else ""
        return AdmissionTimeout(
            f"{self.what} took longer than {self.seconds:g}s (admission_timeout_s{counted}); nothing was allocated"
        )

    def check(self) -> None:
        """Raise :class:`AdmissionTimeout` if the budget is spent or the admission was cancelled."""
        if self.expired():
            raise self._error()

    def cancel(self, reason: str) -> None:
        """End the admission early (safe from any thread): raised at once inside an
        interruptible section, otherwise at the next :meth:`check`."""
        self._reason = reason
        if self._armed and self._interruptible:
            signal.setitimer(signal.ITIMER_REAL, 1e-6)

    # ---- activation ---------------------------------------------------------------------
    def _on_alarm(self, _signum: int, _frame: FrameType | None) -> None:
        if self._interruptible and self.expired():
            raise self._error()

    @contextmanager
    def active(self) -> Iterator[Deadline]:
        """Own ``SIGALRM`` for the duration (main thread only) and register as :func:`current`:
        the process's in the main thread, this thread's elsewhere."""
        global _main
        try:  # only the main thread may handle signals: elsewhere signal() raises ValueError
            self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
            main = True
        except ValueError:
            main = False
        if main:
            signal.setitimer(signal.ITIMER_REAL, max(self.remaining(), 1e-6))
            self._armed = True
            outer, _main = _main, self
        else:
            outer, _THREADS.deadline = getattr(_THREADS, "deadline", None), self
        try:
            yield self
        finally:
            if not main:
                _THREADS.deadline = outer
            else:
                _main = outer
                self._armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, self._previous)  # type: ignore[arg-type]

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A section the timer may interrupt (pure computation or waiting, nothing to undo)."""
        self.check()
        self._interruptible = True
        try:
            if self._armed and self.expired():
                signal.setitimer(signal.ITIMER_REAL, 1e-6)
            yield
        finally:
            self._interruptible = False


__all__ = ["Deadline", "current"]
