"""One hook invocation: an explicit request in, an explicit result out.

Both ways a hook runs go through :func:`run`: ``numa-pin-hook`` admitting in its own process
(:mod:`numa_pin.entry.hook`) and the warm agent's child running a hook's request
(:mod:`numa_pin.agent.server`). A :class:`HookRequest` carries everything the hook reads: its
arguments, the environment variables it needs, the bytes on its stdin and the directory it was
started in; a :class:`HookResult` everything it says: exit code, stdout bytes (``precreate``
only) and stderr lines. Nothing here reads or rewrites ``os.environ``, ``sys.stderr`` or the
working directory: relative paths (``--config``, ``NUMA_PIN_CONFIG``, ``NUMA_PIN_CACHE_DIR``,
the state's ``bundle``) are resolved against the request's ``cwd``.

Stages: ``prestart`` (default) or ``createRuntime`` admit and enforce (running both is harmless:
the second finds the grant and re-applies it), ``poststop`` releases, ``precreate`` (podman's
hooks.d extension stage) reads the proposed ``config.json`` and returns it with the decision
written into it (:mod:`numa_pin.hook.precreate`); other stages are accepted and do nothing.

A rejection is one line on stderr, ``numa-pin: rejected <container-id>: <kind>: <why>``, kept
in a reason file under ``<state_dir>/reasons/`` and in syslog, because crun and podman hide
hook stderr. Exit codes are :mod:`numa_pin.errors`'s: 0 admitted, released or nothing to do;
1 rejected; 2 usage; 3 configuration; 4 any other numa-pin error; 70 internal error. No
traceback unless ``NUMA_PIN_DEBUG=1`` in the request's environment (then :func:`run` raises).

This module is in the hook's hot set (DEVELOPERS.md): it imports what a stage needs inside the
function that needs it.
"""

from __future__ import annotations

from numa_pin.base.record import field, record

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from numa_pin.base.deadline import Deadline
    from numa_pin.config.model import Config
    from numa_pin.resources.node.warm import WarmState
    from numa_pin.service.node import NodeService

ADMIT_STAGES = frozenset({"prestart", "createRuntime", "create-runtime"})
RELEASE_STAGES = frozenset({"poststop"})
PRECREATE_STAGES = frozenset({"precreate"})
NOOP_STAGES = frozenset({"createContainer", "startContainer", "poststart"})
USAGE = ("usage: numa-pin-hook [--config PATH] [prestart|createRuntime|poststop]  (OCI state on stdin)\n"
         "       numa-pin-hook [--config PATH] precreate  (proposed config.json on stdin, config to use on stdout)")
#: the environment variables a hook reads (all the agent passes on)
HOOK_ENV = ("NUMA_PIN_CONFIG", "NUMA_PIN_CACHE_DIR", "NUMA_PIN_DEBUG")


@record
class HookRequest:
    """What a hook is given: arguments (without the program name), the environment (only
    :data:`HOOK_ENV` is read), stdin and the absolute directory it runs in."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdin: bytes
    cwd: str
    #: when the hook process started (:func:`numa_pin.hook.started.process_started`): the admission's
    #: budget counts from there (None: from the admission's own start)
    started: float | None = None


@record
class HookResult:
    """What a hook says: its exit code, stdout (``precreate`` only) and stderr lines."""

    code: int
    stdout: bytes = b""
    stderr: tuple[str, ...] = field(default_factory=tuple)

    def stderr_text(self) -> str:
        """The stderr lines as the hook prints them."""
        return "".join(line + "\n" for line in self.stderr)


class Usage(ValueError):
    """The hook's arguments are wrong (exit 2), or help was asked for (``code`` 1 with :data:`USAGE`)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def parse_argv(argv: tuple[str, ...] | list[str]) -> tuple[str | None, str]:
    """``(config path or None, stage)`` from the hook's arguments. Raises :class:`Usage`."""
    config: str | None = None
    stage = "prestart"
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            raise Usage(USAGE, code=1)
        if arg == "--config":
            config = next(it, None)
            if not config:
                raise Usage("--config needs a path")
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise Usage(f"unknown option {arg}")
        else:
            stage = arg
    if stage not in ADMIT_STAGES | RELEASE_STAGES | NOOP_STAGES | PRECREATE_STAGES:
        from numa_pin.base.text import quote

        raise Usage(f"unknown stage {quote(stage)}")
    return config, stage


class _Out:
    """Where a stage's output goes: stderr lines and stdout bytes, kept for the result; each
    line is also handed to ``on_line`` as it comes, if given."""

    def __init__(self, on_line: Callable[[str], None] | None = None) -> None:
        self.lines: list[str] = []
        self.data = bytearray()
        self.on_line = on_line

    def line(self, text: str) -> None:
        from numa_pin.base.text import cut, one_line

        self.lines.append(cut(one_line(text)))
        if self.on_line is not None:
            self.on_line(self.lines[-1])

    def usage(self) -> None:
        for text in USAGE.splitlines():
            self.line(text)

    def write(self, data: bytes) -> int:  # a binary stream, for precreate and rootless
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass

    def result(self, code: int) -> HookResult:
        return HookResult(code, bytes(self.data), tuple(self.lines))


def run(request: HookRequest, on_line: Callable[[str], None] | None = None, *,
        warm_state: WarmState | None = None) -> HookResult:
    """Run one hook invocation; ``on_line`` also gets each stderr line as it comes (a lock
    wait is announced while it lasts). ``warm_state``: the agent child's caches and deferred
    work, handed to the node service (None: a cold service). Raises only with
    ``NUMA_PIN_DEBUG=1`` in ``request.env`` (an internal error then propagates, so a traceback
    can be shown)."""
    out = _Out(on_line)
    try:
        config_path, stage = parse_argv(request.argv)
    except Usage as exc:
        if exc.code != 1:
            out.line(f"numa-pin: {exc}")
        out.usage()
        return out.result(exc.code)
    if stage in NOOP_STAGES:
        return out.result(0)

    from numa_pin.errors import EXIT_INTERNAL, AdmissionError, NumaPinError, exit_code

    ctx = _Context(out)
    try:
        return out.result(_stage(stage, config_path, request, ctx, warm_state))
    except AdmissionError as exc:
        named = {"name": ctx.name} if ctx.name and ctx.name != ctx.cid else {}  # `explain NAME` finds it
        ctx.report(f"numa-pin: rejected {ctx.cid}: {exc.kind}: {exc}", {"kind": exc.kind, **named})
        return out.result(exit_code(exc))
    except NumaPinError as exc:
        ctx.report(f"numa-pin: error {ctx.cid}: {exc.kind}: {exc}", {"kind": exc.kind})
        return out.result(exit_code(exc))
    except Exception as exc:  # the boundary: a user never sees a traceback
        if request.env.get("NUMA_PIN_DEBUG") == "1":
            raise
        ctx.report(f"numa-pin: internal error {ctx.cid}: {type(exc).__name__}: {exc} "
                   "(set NUMA_PIN_DEBUG=1 for a traceback)")
        return out.result(EXIT_INTERNAL)


class _Context:
    """What a failing stage's report needs: the container id and where reasons go, as far as
    the stage got."""

    def __init__(self, out: _Out) -> None:
        self.out = out
        self.cid = "?"
        #: the container's name once its request is read (Kubernetes: ``namespace/pod/container``)
        self.name: str | None = None
        self.state_dir: str | None = None
        self.syslog = False

    def report(self, line: str, details: dict | None = None) -> None:
        """One line on stderr, kept in a reason file and syslog."""
        self.out.line(line)
        line = self.out.lines[-1]
        if self.state_dir:
            from numa_pin.reporting.report import write_reason

            write_reason(self.state_dir, self.cid, line, details)
        if self.syslog:
            from numa_pin.reporting.report import log_syslog

            log_syslog(line)

    def warn_kubelet(self, kubelet_root: str) -> None:
        """One warning line (not a rejection) when kubelet's static CPU manager also runs here."""
        import os

        from numa_pin.base.names import CPU_MANAGER_CHECKPOINT

        if not os.path.exists(os.path.join(kubelet_root, CPU_MANAGER_CHECKPOINT)):
            return  # no CPU manager here: nothing to read, so nothing to import for it
        from numa_pin.cluster.kubelet import conflict_warning

        line = conflict_warning(kubelet_root)
        if line is None:
            return
        self.out.line(line)
        if self.syslog:
            from numa_pin.reporting.report import log_syslog

            log_syslog(line, error=False)


def _stage(stage: str, config_path: str | None, request: HookRequest, ctx: _Context,
           warm_state: WarmState | None = None) -> int:
    import io

    from numa_pin.config.load import at_dir, entry_config
    from numa_pin.errors import EXIT_OK

    data = b""
    state = None
    if stage in PRECREATE_STAGES:
        from numa_pin.hook.oci import MAX_DOCUMENT_BYTES
        from numa_pin.hook.precreate import container_id_from_cgroups_path, read_proposed

        data = request.stdin[: MAX_DOCUMENT_BYTES + 1]
        cgroups_path = (read_proposed(data).get("linux") or {}).get("cgroupsPath")
        ctx.cid = container_id_from_cgroups_path(cgroups_path if isinstance(cgroups_path, str) else None) or "?"
    else:
        from numa_pin.base.record import replace
        from numa_pin.hook.oci import read_state

        state = read_state(io.BytesIO(request.stdin))
        ctx.cid = state.id
        if not state.bundle.startswith("/"):
            state = replace(state, bundle=at_dir(request.cwd, state.bundle))
    from numa_pin.hook.rootless import is_rootless

    if is_rootless():
        from numa_pin.hook.rootless import run_rootless

        return run_rootless(stage, ctx.cid, data if state is None else None, state, lambda: entry_config(
            config_path, request.env, cwd=request.cwd, cached=True, or_defaults=True)[0], ctx.out)
    config, cache_dir = entry_config(config_path, request.env, cwd=request.cwd, cached=True)
    ctx.state_dir, ctx.syslog = config.state_dir, config.syslog
    from numa_pin.service.node import open_service

    # a lock wait goes to syslog: an outcome is one line
    service = open_service(config, cache_dir, warm_state=warm_state)
    from numa_pin.reporting.report import forget_reason

    if state is None:
        import json

        from numa_pin.hook.precreate import precreate

        result = precreate(data, service, _budget(config, ctx, request))
        ctx.out.write(json.dumps(result.spec).encode())
        if result.grant is not None:
            ctx.warn_kubelet(config.kubelet_root)
        return EXIT_OK
    if stage in RELEASE_STAGES:
        # runc runs poststop after a rejected prestart too: the rejection's reason is kept
        # for `numa-pin explain` unless a grant was actually released
        if service.release(state.id) is not None:
            forget_reason(config.state_dir, state.id)
        return EXIT_OK
    from numa_pin.hook.admit import admission_for

    admission, owner, rootfs = admission_for(state, config)
    ctx.name = admission.qualified_name
    if not state.pid:
        from numa_pin.errors import HookInputError

        raise HookInputError(f"container {ctx.cid}: the runtime passed no pid at {stage}")
    from numa_pin.resources.runtime import PRESTART

    try:
        service.admit(admission, state.pid, owner=owner, rootfs=rootfs, target=PRESTART,
                      deadline=_budget(config, ctx, request))
    except Exception as exc:
        from numa_pin.errors import AdmissionTimeout, LedgerError

        if not isinstance(exc, (AdmissionTimeout, LedgerError)):  # the ledger is busy or unreadable: liveness
            _abandon_pending(service, state.id)  # drops the grant later; the hook's time is spent
        raise
    forget_reason(config.state_dir, state.id)  # an earlier rejection no longer explains this container
    ctx.warn_kubelet(config.kubelet_root)
    return EXIT_OK


def _budget(config: Config, ctx: _Context, request: HookRequest) -> Deadline:
    """The admission's deadline: ``admission_timeout_s`` from the hook process's start."""
    from numa_pin.base.deadline import Deadline

    return Deadline(config.admission_timeout_s, f"admission of {ctx.cid}", since=request.started)


def _abandon_pending(service: NodeService, container_id: str) -> None:
    """A refused prestart or createRuntime: the runtime will not start the container (a failing
    hook of those stages stops it, runtime-spec), so the grant precreate made for it (no pid yet)
    goes now, not when its grace ends. A grant bound to a process is left alone. Never raises:
    what cannot be released is logged, and liveness drops it later."""
    from numa_pin.errors import NumaPinError

    try:
        grant = service.ledger.read().grants.get(container_id)
        if grant is not None and grant.pid is None:
            service.release(container_id, pending_only=True)
    except NumaPinError as exc:
        from numa_pin.reporting.report import log_syslog

        log_syslog(f"numa-pin: {container_id}: the grant of a refused container was not released: {exc}")


__all__ = ["ADMIT_STAGES", "HOOK_ENV", "NOOP_STAGES", "PRECREATE_STAGES", "RELEASE_STAGES", "USAGE", "HookRequest",
           "HookResult", "Usage", "parse_argv", "run"]
