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


def run(argv: list[str], stdin, stdout=None, started: float | None = None) -> int:
    """The hook in this process: :func:`numa_pin.hook.invoke.run` with this process's environment,
    working directory and ``stdin`` (a binary or text stream), its stderr lines printed to
    ``sys.stderr`` as they come and its stdout (``precreate`` only) written to ``stdout``
    (default: ``sys.stdout``'s buffer); the admission's budget counts from ``started`` (the
    hook process's start; None: from the admission's). Returns the exit code."""
    import os

    from numa_pin.hook.invoke import HOOK_ENV, HookRequest
    from numa_pin.hook.invoke import run as invoke
    from numa_pin.hook.oci import MAX_DOCUMENT_BYTES

    data = stdin.read(MAX_DOCUMENT_BYTES + 1)
    data = data.encode() if isinstance(data, str) else data
    try:
        cwd = os.getcwd()
    except OSError:  # a deleted working directory: only absolute paths mean anything
        cwd = "/"
    env = {k: os.environ[k] for k in HOOK_ENV if k in os.environ}
    result = invoke(HookRequest(tuple(argv), env, data, cwd, started), on_line=_print)
    if result.stdout:
        out = stdout if stdout is not None else sys.stdout.buffer
        out.write(result.stdout)
        out.flush()
    return result.code


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
    if environ.get("NUMA_PIN_NO_AGENT") == "1":
        return run(args, sys.stdin.buffer, started=_started(argv is None))
    import io

    from numa_pin.agent import client, protocol

    data = sys.stdin.buffer.read(protocol.MAX_STDIN_BYTES)
    rc, absent = client.ask_agent(args, data, environ, anchored=argv is None)
    if rc is not None:
        return rc
    import os

    if absent and client.autostart_allowed(os.environ):
        client.start_agent(os.environ)
    return run(args, io.BytesIO(data), started=_started(argv is None))


def _started(script: bool) -> float | None:
    """When this process started, for the script (a process the runtime started for this one
    hook: its budget began then); None when called with arguments (a caller's process)."""
    if not script:
        return None
    from numa_pin.hook.started import process_started

    return process_started()


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
