"""``numa-pin-hook [--config PATH] [STAGE]``: the OCI runtime hook.

STAGE is ``prestart`` (default) or ``createRuntime`` to admit and enforce (running both is
harmless: the second finds the grant and re-applies it), or ``poststop`` to release. Other
stages are accepted and do nothing, so a hooks.d file listing them cannot break a container.
``precreate`` (podman's hooks.d extension stage) reads the proposed ``config.json`` on stdin,
admits, and prints the config with the decision written into it (:mod:`numa_pin.hook.precreate`).

The OCI state arrives on stdin. A rejection exits 1 with one line on stderr::

    numa-pin: rejected <container-id>: TopologyAffinityError: <why>

and the same line goes to a reason file under ``<state_dir>/reasons/`` (read by ``numa-pin
explain``) and to syslog, because crun and podman hide hook stderr. A successful admission, or
the release of a grant, deletes the container's reason file (a poststop after a rejection keeps
it). No traceback is ever printed unless ``NUMA_PIN_DEBUG=1``.

Exit codes (:mod:`numa_pin.errors`): 0 admitted, released or nothing to do; 1 rejected (no fit,
malformed request or OCI input); 2 usage error; 3 configuration error; 4 any other numa-pin error
(ledger, topology, enforcement, unsafe state paths); 70 internal error.

Start-up cost matters (this runs on every container start), so this module imports only the
standard library at the top; nothing here imports pyroute2, argparse or the CLI. When the warm
agent (``numa-pin serve``) answers on its socket, :func:`main` hands the request to it and only
prints the answer; otherwise, or with ``NUMA_PIN_NO_AGENT=1``, :func:`run` admits in-process
(and, when nothing listened at all, first starts an agent for the next containers).
"""

from __future__ import annotations

import gc
import sys

ADMIT_STAGES = {"prestart", "createRuntime", "create-runtime"}
RELEASE_STAGES = {"poststop"}
PRECREATE_STAGES = {"precreate"}
NOOP_STAGES = {"createContainer", "startContainer", "poststart"}
USAGE = ("usage: numa-pin-hook [--config PATH] [prestart|createRuntime|poststop]  (OCI state on stdin)\n"
         "       numa-pin-hook [--config PATH] precreate  (proposed config.json on stdin, config to use on stdout)")
#: where the parsed config is cached between hook runs (override: NUMA_PIN_CACHE_DIR)
DEFAULT_CACHE_DIR = "/run/numa-pin"


def parse_argv(argv: list[str]) -> tuple[str | None, str]:
    """``(config path or None, stage)`` from the hook's arguments. Raises ValueError (usage)."""
    config: str | None = None
    stage = "prestart"
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            raise SystemExit(USAGE)
        if arg == "--config":
            config = next(it, None)
            if not config:
                raise ValueError("--config needs a path")
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise ValueError(f"unknown option {arg}")
        else:
            stage = arg
    if stage not in ADMIT_STAGES | RELEASE_STAGES | NOOP_STAGES | PRECREATE_STAGES:
        raise ValueError(f"unknown stage {stage!r}")
    return config, stage


def _report(line: str, container_id: str, state_dir: str | None, use_syslog: bool, details: dict | None = None) -> None:
    """Print ``line`` (escaped to one line) and keep it in a reason file and syslog."""
    from numa_pin.text import cut, one_line

    line = cut(one_line(line))
    print(line, file=sys.stderr, flush=True)
    if state_dir:
        from numa_pin.report import write_reason

        write_reason(state_dir, container_id, line, details)
    if use_syslog:
        from numa_pin.report import log_syslog

        log_syslog(line)


def _warn_kubelet(kubelet_root: str, use_syslog: bool) -> None:
    """One warning line (not a rejection) when kubelet's static CPU manager also runs here."""
    from numa_pin.kubelet import conflict_warning

    line = conflict_warning(kubelet_root)
    if line is None:
        return
    print(line, file=sys.stderr, flush=True)
    if use_syslog:
        from numa_pin.report import log_syslog

        log_syslog(line, error=False)


def run(argv: list[str], stdin, stdout=None) -> int:
    """The hook, minus process setup; returns the exit code. Only ``precreate`` writes to
    ``stdout`` (default: ``sys.stdout``'s buffer)."""
    import os
    try:
        config_path, stage = parse_argv(argv)
    except ValueError as exc:
        from numa_pin.text import one_line

        print(f"numa-pin: {one_line(exc)}\n{USAGE}", file=sys.stderr)
        return 2
    if stage in NOOP_STAGES:
        return 0

    from numa_pin.errors import EXIT_INTERNAL, EXIT_OK, AdmissionError, NumaPinError, exit_code

    cid = "?"
    state_dir: str | None = None
    use_syslog = False
    try:
        if stage in PRECREATE_STAGES:
            from numa_pin.hook.oci import MAX_DOCUMENT_BYTES
            from numa_pin.hook.precreate import container_id_from_cgroups_path, read_proposed

            data = stdin.read(MAX_DOCUMENT_BYTES + 1)
            data = data.encode() if isinstance(data, str) else data
            cgroups_path = (read_proposed(data).get("linux") or {}).get("cgroupsPath")
            cid = container_id_from_cgroups_path(cgroups_path if isinstance(cgroups_path, str) else None) or "?"
        else:
            from numa_pin.hook.oci import read_state

            state = read_state(stdin)
            cid = state.id
        from numa_pin.hook.rootless import is_rootless

        if is_rootless():
            from numa_pin.hook.rootless import run_rootless

            precreate_data = data if stage in PRECREATE_STAGES else None
            return run_rootless(stage, cid, precreate_data, None if precreate_data is not None else state,
                                config_path, stdout if stdout is not None else sys.stdout.buffer)
        from numa_pin.config.load import load_config

        cache_dir = os.environ.get("NUMA_PIN_CACHE_DIR", DEFAULT_CACHE_DIR)
        config = load_config(config_path, os.environ, cache_dir=cache_dir)
        state_dir, use_syslog = config.state_dir, config.syslog
        from numa_pin.service import NodeService

        service = NodeService(config, cache_dir=cache_dir)
        from numa_pin.report import forget_reason

        if stage in PRECREATE_STAGES:
            import json

            from numa_pin.hook.precreate import precreate

            result = precreate(data, service)
            out = stdout if stdout is not None else sys.stdout.buffer
            out.write(json.dumps(result.spec).encode())
            out.flush()
            if result.grant is not None:
                _warn_kubelet(config.kubelet_root, use_syslog)
            return EXIT_OK
        if stage in RELEASE_STAGES:
            # runc runs poststop after a rejected prestart too: the rejection's reason is kept
            # for `numa-pin explain` unless a grant was actually released
            if service.release(state.id) is not None:
                forget_reason(state_dir, state.id)
            return EXIT_OK
        from numa_pin.hook.admit import admission_for

        request, owner, rootfs = admission_for(state, config)
        if not state.pid:
            from numa_pin.errors import HookInputError

            raise HookInputError(f"container {cid}: the runtime passed no pid at {stage}")
        service.admit(request, state.pid, owner=owner, rootfs=rootfs)
        forget_reason(state_dir, state.id)  # an earlier rejection no longer explains this container
        _warn_kubelet(config.kubelet_root, use_syslog)
        return EXIT_OK
    except AdmissionError as exc:
        _report(f"numa-pin: rejected {cid}: {exc.kind}: {exc}", cid, state_dir, use_syslog, {"kind": exc.kind})
        return exit_code(exc)
    except NumaPinError as exc:
        _report(f"numa-pin: error {cid}: {exc.kind}: {exc}", cid, state_dir, use_syslog, {"kind": exc.kind})
        return exit_code(exc)
    except Exception as exc:  # the boundary: a user never sees a traceback
        if os.environ.get("NUMA_PIN_DEBUG") == "1":
            raise
        _report(
            f"numa-pin: internal error {cid}: {type(exc).__name__}: {exc} (set NUMA_PIN_DEBUG=1 for a traceback)",
            cid, state_dir, use_syslog,
        )
        return EXIT_INTERNAL


def main(argv: list[str] | None = None) -> int:
    """The ``numa-pin-hook`` script: hand the hook to the warm agent (``numa-pin serve``) when
    one answers on its socket, else (or with ``NUMA_PIN_NO_AGENT=1``) run it in this process.

    When no agent listens at all, a root hook in the host's namespaces starts one on demand
    (:func:`numa_pin.agent.client.start_agent`) for the containers that follow, then admits this
    one in-process without waiting for it. ``NUMA_PIN_AGENT_AUTOSTART=0`` turns that off."""
    if argv is None:  # the script: a process that lives for one admission, whose memory goes
        gc.disable()  # with it; the collector's passes over ~170 module imports only cost time
    args = sys.argv[1:] if argv is None else argv
    environ = _environ()
    if environ.get("NUMA_PIN_NO_AGENT") == "1" or "precreate" in args:  # the agent returns no stdout
        return run(args, sys.stdin.buffer)
    import io

    from numa_pin.agent import client, protocol

    data = sys.stdin.buffer.read(protocol.MAX_STDIN_BYTES)
    rc, absent = client.ask_agent(args, data, environ)
    if rc is not None:
        return rc
    import os

    if absent and client.autostart_allowed(os.environ):
        client.start_agent(os.environ)
    return run(args, io.BytesIO(data))


def _environ() -> dict[str, str]:
    """The environment as :data:`os.environ` has it, without importing :mod:`os` (the hook
    starts without site, which would have; a hook the agent serves never needs the rest of it)."""
    if "os" in sys.modules:
        return dict(sys.modules["os"].environ)
    import posix

    return {k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
            for k, v in posix.environ.items()}


if __name__ == "__main__":
    sys.exit(main())
