"""``numa-pin run [REQUEST FLAGS] -- COMMAND...``: run a plain process with an aligned grant.

The process gets the same decision a container would, from the same ledger, so manual jobs and
containers never share exclusive CPUs. Sequence:

1. fork; the child blocks on a pipe before it execs anything;
2. the parent puts the child in a cgroup of its own (on a systemd host a transient scope,
   ``numa-pin-run-<pid>.scope`` in ``system.slice``, as ``systemd-run --scope`` makes; elsewhere
   ``<cgroup root>/numa-pin/<name>``), admits it (ledger + cpuset), and only then
   lets it exec. A rejection kills the child before it ran a single instruction of COMMAND;
3. the parent is a child subreaper (prctl), so it outlives and reaps everything COMMAND forks,
   forwards SIGINT/SIGTERM/SIGHUP, releases the grant and removes the cgroup at the end.

The exit status is COMMAND's (128+N when killed by signal N).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from numa_pin.cli.common import add_config_argument, add_request_arguments, load, request_from_args

NAME = "run"
HELP = "run a command with NUMA-aligned exclusive CPUs, memory and devices from the node ledger"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    add_request_arguments(parser)
    parser.add_argument("--name", help="id recorded in the ledger (default run-<pid>-<time>)")
    parser.add_argument("--no-new-privs", action="store_true", help="set no_new_privs on the command")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def _wait_status_to_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def run(args: argparse.Namespace) -> int:
    import prctl

    from numa_pin.enforcer import cgroups, procgroup
    from numa_pin.enforcer.systemd import detect
    from numa_pin.errors import RequestError
    from numa_pin.service import NodeService, live_name_message

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise RequestError("no command given (numa-pin run [flags] -- COMMAND ...)", annotation="COMMAND")
    config = load(args)
    name = args.name or f"run-{os.getpid()}-{int(time.time())}"
    request = request_from_args(args, name, config.isolation)
    service = NodeService(config)
    live = service.live_grant(name)
    if live is not None:  # checked again inside the admission's transaction
        raise RequestError(live_name_message(live), annotation="--name")
    systemd = detect(config.proc_root)
    group = None
    if systemd is None:
        layout = cgroups.detect_layout(config.proc_root)
        group = procgroup.create(config.cgroup_root, name, layout.cpuset_version)

    prctl.set_child_subreaper(True)
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: wait for the verdict, then exec
        os.close(go_w)
        verdict = os.read(go_r, 1)
        if verdict != b"1":
            os._exit(125)
        if args.no_new_privs:
            prctl.set_no_new_privs(True)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"numa-pin: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
    os.close(go_r)
    admitted = False
    try:
        if group is not None:
            procgroup.join(group, pid)
        else:  # systemd owns the hierarchy: the job gets a unit of its own, removed once it ends
            assert systemd is not None
            systemd.start_scope(f"numa-pin-run-{pid}.scope", pid, f"numa-pin run {name}", config.proc_root)
        admitted_grant = service.admit(request, pid, kind="process")
        admitted = True
        os.write(go_w, b"1")
    finally:
        if not admitted:
            os.write(go_w, b"0")
            os.waitpid(pid, 0)
            if group is not None:
                procgroup.remove(group)
        os.close(go_w)
    grant = admitted_grant.grant
    print(f"numa-pin: {name}: cpus={sorted(grant.cpus) or 'shared'} mems={sorted(grant.mems)}", file=sys.stderr)
    from numa_pin.kubelet import conflict_warning

    warning = conflict_warning(config.kubelet_root)
    if warning:
        print(warning, file=sys.stderr)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = 0
    try:
        while True:  # reap the command and every orphan it leaves (we are a subreaper)
            try:
                reaped, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if reaped == pid:
                code = _wait_status_to_code(status)
    finally:
        service.release(name)
        if group is not None:
            procgroup.remove(group)
    return code
