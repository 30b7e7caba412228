"""The one exception tree of numa-pin.

Every error that can reach a user is a :class:`NumaPinError`. Entry points
(``numa-pin``, ``numa-pin-hook``) catch it and print one line; nothing else
is allowed to escape as a traceback.

::

    NumaPinError
    ├── TopologyError                  the machine description is unusable
    │   └── SysfsError(path)           a sysfs/proc file is missing, unreadable or garbage
    ├── ConfigError(key, path)         config.yaml: unknown key, wrong type, bad value
    ├── RequestError(annotation)       a container request is malformed
    ├── PolicyError                    bad policy / scope / option (kubelet's load-time errors)
    ├── AdmissionError                 the container must not start
    │   ├── TopologyAffinityError      the policy rejected the merged hint
    │   ├── AdmissionTimeout           the deadline passed (or the client left) before a decision
    │   ├── RootlessError              a rootless container asked for resources only root can pin
    │   ├── IsolationError(path)       an isolation knob this node cannot honour (also an EnforcementError)
    │   └── AllocationError            an allocator could not satisfy a request
    │       └── SMTAlignmentError      full-pcpus-only could not be honoured
    ├── LedgerError(path, errno)       the node ledger
    │   ├── LedgerLockTimeout          another admission held the lock too long
    │   ├── LedgerCorrupt              checksum / version / JSON failure; never reset silently
    │   └── LedgerOvertaken            a lock-free read overtaken every time (read again under the lock)
    ├── EnforcementError(path, errno)  writing cgroups, moving netdevs, granting devices
    │   └── CgroupEscapeError          a path would leave the cgroup root
    ├── HookInputError                 the OCI state on stdin or config.json is unusable
    ├── AgentError(path)               the warm agent cannot serve its socket
    ├── NriError(path)                 the NRI runtime's socket or what it sent is unusable
    ├── KubeletError(path)             kubelet's pod-resources socket, config or state is unusable
    │   └── KubeletConflictError       kubelet's CPU or memory manager is static: numa-pin will not start
    ├── KubeApiError(path, status)     the Kubernetes API server is unreachable or refused a request
    └── UnsafePathError(path)          a state, cache or socket path others could redirect

Each class documents when it is raised. Errors carry the file, container or
resource involved so the single line a user sees is actionable. An error raised
because of another keeps it as ``__cause__`` (``raise ... from exc``); ``errno``
of the OS-facing errors falls back to the cause's. When an admission fails and
undoing its writes fails too, the undo failures ride on the error that is raised
(:attr:`NumaPinError.rollback_failures`) and are part of its one line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class NumaPinError(Exception):
    """Base class of every error numa-pin raises on purpose."""

    #: short name printed before the message by the entry points: the class's own name
    kind = "NumaPinError"
    #: undo steps that failed while rolling back after this error (empty: all undone)
    rollback_failures: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__

    def add_rollback_failures(self, failures: Iterable[object]) -> None:
        """Record undo steps that failed while rolling back after this error."""
        self.rollback_failures = self.rollback_failures + tuple(str(f) for f in failures)

    def __str__(self) -> str:
        text = super().__str__()
        if self.rollback_failures:
            text += "; rollback incomplete: " + "; ".join(self.rollback_failures)
        return text


def _cause_errno(error: BaseException) -> int | None:
    """The OS error number of ``error``'s chained cause, if it has one."""
    cause = error.__cause__
    value = getattr(cause, "errno", None)
    return value if isinstance(value, int) else None


class TopologyError(NumaPinError, ValueError):
    """The machine topology is inconsistent or unsupported."""


class SysfsError(TopologyError):
    """A sysfs or proc file could not be read or parsed.

    ``path`` is the file involved; ``errno`` is set when the OS reported one.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, errno: int | None = None) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        self.errno = errno
        super().__init__(f"{self.path}: {reason}")


class ConfigError(NumaPinError, ValueError):
    """The configuration file or a configuration value is invalid.

    ``key`` is the dotted key involved (``policy_options.max-allowable-numa-nodes``),
    ``path`` the file it came from, when known.
    """

    def __init__(self, message: str, *, key: str | None = None, path: str | None = None) -> None:
        self.key = key
        self.path = path
        where = ""
        if path:
            where += f"{path}: "
        if key:
            where += f"{key}: "
        super().__init__(f"{where}{message}")


class RequestError(NumaPinError, ValueError):
    """A resource request (annotation, CLI flag, config.json field) is malformed.

    ``annotation`` names the annotation or field that was wrong.
    """

    def __init__(self, message: str, *, annotation: str | None = None) -> None:
        self.annotation = annotation
        prefix = f"{annotation}: " if annotation else ""
        super().__init__(f"{prefix}{message}")


class PolicyError(NumaPinError, ValueError):
    """An unknown policy, scope or policy option, or an option value kubelet would refuse."""


class AdmissionError(NumaPinError):
    """The container (or process) must not start."""


class TopologyAffinityError(AdmissionError):
    """The topology policy refused the merged hint (kubelet's ``TopologyAffinityError``)."""


class AdmissionTimeout(AdmissionError):
    """The admission ran past its deadline (``admission_timeout_s``) or its client went away."""


class RootlessError(AdmissionError):
    """A container run without root (rootless podman) asked numa-pin for CPUs, memory or devices:
    pinning them needs the root runtime's cgroups and the node ledger."""


class PathLimitError(AdmissionError):
    """The path the request came in by (a hook stage, NRI, ``numa-pin run``) cannot carry
    something it asks, such as a memory policy at prestart; the message names the path and
    one that can. Raised before anything is decided or written."""


class AllocationError(AdmissionError):
    """An allocator could not satisfy a request; the message is kubelet's where one exists."""


class SMTAlignmentError(AllocationError):
    """``full-pcpus-only`` could not be honoured (kubelet's ``SMTAlignmentError``)."""


class _OsFailure(NumaPinError):
    """A failure on one file, namespace or socket: ``path`` names it; ``errno`` is the OS error
    number, given or taken from the chained cause (``raise ...(...) from exc``)."""

    def __init__(self, message: str, *, path: str | None = None, errno: int | None = None) -> None:
        self.path = path
        self._errno = errno
        super().__init__(f"{path}: {message}" if path else message)

    @property
    def errno(self) -> int | None:
        return self._errno if self._errno is not None else _cause_errno(self)


class LedgerError(_OsFailure):
    """The node ledger could not be read or written. ``path`` is the ledger file."""


class LedgerLockTimeout(LedgerError):
    """The ledger lock was not obtained within the bounded wait."""


class LedgerCorrupt(LedgerError):
    """The ledger failed its checksum, version or JSON checks. It is never reset silently."""


class LedgerOvertaken(LedgerError):
    """A reader without the lock found the snapshot replaced every time it read (a writer
    compacting faster than it reads); the ledger reads it again under the lock."""


class EnforcementError(_OsFailure):
    """Applying a grant to the system failed (cgroup write, netdev move, device grant).
    ``path`` is the file or namespace written."""


class IsolationError(AdmissionError, EnforcementError):
    """An isolation knob the grant asks cannot be honoured on this node: a kernel, cgroup or
    cpufreq feature it lacks (cpuset partitions, ``sched_load_balance`` off at a cgroup v1 root,
    PM QoS, a cpufreq policy or governor, the cpu controller), an irqbalance that cannot be
    told, another grant holding a shared setting at another value, or the kernel refusing the
    isolated partition. The container must not start (exit 1, the ``rejected`` line); found
    before the knob's writes, or with them rolled back. Still an :class:`EnforcementError` for
    the code that tolerates one (``explain``'s preview, ``reconcile``'s repairs). ``path`` names
    the file or directory that lacks it."""


class CgroupEscapeError(EnforcementError):
    """A cgroup path would resolve outside the configured cgroup root."""


class HookInputError(NumaPinError, ValueError):
    """The OCI state on stdin or the bundle's config.json is unusable."""


class AgentError(_OsFailure):
    """``numa-pin serve`` cannot create or hold its socket. ``path`` is the socket."""


class NriError(_OsFailure):
    """The NRI plugin cannot reach the runtime's socket, or the runtime sent frames or messages
    it cannot read. ``path`` is the socket."""


class KubeletError(_OsFailure):
    """kubelet's pod-resources API did not answer in time, answered more than numa-pin reads, or
    answered what it cannot decode; or kubelet's config or manager state file cannot be read.
    ``path`` is the socket or the file."""


class KubeletConflictError(KubeletError):
    """kubelet's CPU or memory manager runs the static policy (its config or its state file
    says so): kubelet and numa-pin would both hand out the same CPUs or NUMA memory, so
    ``numa-pin serve --nri`` does not start (exit 1). ``path`` is the file that says so."""


class KubeApiError(_OsFailure):
    """The Kubernetes API server cannot be reached (no in-cluster account, TLS refused, a
    timeout), refused a request, or answered what cannot be read. ``path`` is the URL or the
    account's file; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, *, path: str | None = None, status: int = 0) -> None:
        self.status = status
        super().__init__(message, path=path)


class UnsafePathError(NumaPinError):
    """A state, cache or socket directory or file that someone other than root and this user
    could replace: writable by group or others without the sticky bit, owned by another
    non-root user, a symbolic link where none is followed, or not the kind of file expected.
    ``path`` is the offending directory or file."""

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


# ---- exit codes ------------------------------------------------------------------------
#: exit codes of ``numa-pin-hook`` and ``numa-pin`` (docs/troubleshooting.md, "Exit codes")
EXIT_OK = 0
#: the container or process must not start: it cannot be placed (:class:`AdmissionError`) or its
#: request or OCI input is malformed (:class:`RequestError`, :class:`HookInputError`); or the NRI
#: plugin must not start beside kubelet's static managers (:class:`KubeletConflictError`)
EXIT_REJECTED = 1
#: the command line is wrong
EXIT_USAGE = 2
#: the configuration file is unusable (:class:`ConfigError`, :class:`PolicyError`)
EXIT_CONFIG = 3
#: any other numa-pin error: ledger, topology, enforcement, agent, unsafe paths, OS errors
EXIT_ERROR = 4
#: a bug: an exception numa-pin did not expect (``EX_SOFTWARE`` of sysexits.h)
EXIT_INTERNAL = 70


def exit_code(error: BaseException) -> int:
    """The exit code an entry point returns for ``error`` (pure)."""
    if isinstance(error, (AdmissionError, RequestError, HookInputError, KubeletConflictError)):
        return EXIT_REJECTED
    if isinstance(error, (ConfigError, PolicyError)):
        return EXIT_CONFIG
    if isinstance(error, (NumaPinError, OSError)):
        return EXIT_ERROR
    return EXIT_INTERNAL


__all__ = [
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_REJECTED",
    "EXIT_USAGE",
    "AdmissionError",
    "AdmissionTimeout",
    "AgentError",
    "NriError",
    "KubeletConflictError",
    "KubeletError",
    "KubeApiError",
    "AllocationError",
    "PathLimitError",
    "CgroupEscapeError",
    "ConfigError",
    "EnforcementError",
    "HookInputError",
    "IsolationError",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerLockTimeout",
    "LedgerOvertaken",
    "NumaPinError",
    "PolicyError",
    "RequestError",
    "RootlessError",
    "SMTAlignmentError",
    "SysfsError",
    "TopologyAffinityError",
    "TopologyError",
    "UnsafePathError",
    "exit_code",
]
