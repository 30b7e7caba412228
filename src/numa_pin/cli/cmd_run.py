"""``numa-pin run [REQUEST FLAGS] -- COMMAND...``: run a plain process with an aligned grant.

The process gets the same decision a container would, from the same ledger, so manual jobs and
containers never share exclusive CPUs. Sequence:

1. fork; the child blocks on a pipe before it execs anything;
2. the parent puts the child in a cgroup of its own (on a systemd host a transient scope,
   ``numa-pin-run-<pid>.scope`` in ``system.slice``, as ``systemd-run --scope`` makes; elsewhere
   ``<cgroup root>/numa-pin/<name>``), admits it (ledger + cpuset), and only then
   lets it exec (with the memory policy asked, :mod:`numa_pin.enforcer.mempolicy`, set on the
   child first). A rejection kills the child before it ran a single instruction of COMMAND;
3. the parent is a child subreaper (prctl), so it outlives and reaps everything COMMAND forks,
   forwards SIGINT/SIGTERM/SIGHUP, releases the grant and removes the cgroup at the end.

The command learns its grant from its environment and a JSON file
(:mod:`numa_pin.cli.run_grant`: ``NUMA_PIN_CPUS``, ``NUMA_PIN_MEMS``, ``CUDA_VISIBLE_DEVICES``,
``PCIDEVICE_*``, ``NUMA_PIN_GRANT_FILE``), sent to the child over the same pipe as the verdict.

``--ranks N`` starts N copies of COMMAND inside the one grant: the child becomes their leader,
forks them, binds each (``sched_setaffinity``) to its share of the grant's CPUs, split as
``hwloc-distrib`` splits them (:func:`numa_pin.allocators.distrib.distribute`), waits for all
and exits with the worst status (the highest). ``--bind-devices closest`` gives each rank
the granted devices nearest its CPUs instead of all of them
(:func:`numa_pin.allocators.devbind.bind_closest`); it is refused (exit 1) when the request
asks no device. ``--cpu-list`` / ``--nodes`` take numactl's
lists: the grant is exactly those CPUs (or ``--cpus`` of them), reserved in the ledger like any
other, and refused when another grant holds one of them.

The exit status is COMMAND's (128+N when killed by signal N).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from numa_pin.cli.common import add_config_argument, add_request_arguments, load, request_from_args
from numa_pin.resources.runtime import RUN

if TYPE_CHECKING:
    from typing import Any

NAME = "run"
HELP = "run a command with NUMA-aligned exclusive CPUs, memory and devices from the node ledger"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: the most a verdict's payload (the environment and the ranks) may take on the pipe
PAYLOAD_LIMIT = 16 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    add_request_arguments(parser)
    parser.add_argument("--name", help="id recorded in the ledger (default run-<pid>-<time>)")
    parser.add_argument("--no-new-privs", action="store_true", help="set no_new_privs on the command")
    parser.add_argument("--ranks", metavar="N", type=int, default=1,
                        help="start N copies, each bound to its share of the grant's CPUs (as hwloc-distrib splits)")
    parser.add_argument("--bind-devices", choices=("none", "closest"), default="none",
                        help="with --ranks: 'closest' gives each rank the granted GPUs and NICs nearest its CPUs "
                             "(default 'none': every rank sees every granted device)")
    parser.add_argument("--cpu-list", metavar="LIST",
                        help="exactly these CPUs, numactl style (0-3,8); --cpus picks that many of them")
    parser.add_argument("--nodes", metavar="LIST", help="only CPUs of these NUMA nodes, numactl style (0,1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def _wait_status_to_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _read_payload(fd: int) -> dict[str, Any]:
    """The JSON the parent sends after a ``1`` verdict (until it closes the pipe)."""
    import json

    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        size += len(chunk)
        if size > PAYLOAD_LIMIT:
            raise ValueError(f"the grant sent to the command exceeds {PAYLOAD_LIMIT} bytes")
        chunks.append(chunk)
    return dict(json.loads(b"".join(chunks) or b"{}"))


def _exec(command: list[str], env: dict[str, str]) -> None:
    os.environ.update(env)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"numa-pin: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)


def _lead(command: list[str], env: dict[str, str], ranks: list[dict[str, Any]]) -> None:
    """The child with ``--ranks``: fork one copy of COMMAND per rank, each bound to its CPUs,
    forward the parent's signals to them, and exit with the worst status (never returns)."""
    pids: list[int] = []
    for rank in ranks:
        pid = os.fork()
        if pid == 0:
            try:
                os.sched_setaffinity(0, rank["cpus"])
            except OSError as exc:
                print(f"numa-pin: rank {rank['env'].get('NUMA_PIN_RANK')}: cannot bind to {rank['cpus']}: "
                      f"{exc.strerror}", file=sys.stderr)
                os._exit(126)
            _exec(command, {**env, **rank["env"]})
        pids.append(pid)

    _forward_signals(pids)
    worst = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        worst = max(worst, _wait_status_to_code(status))
    os._exit(worst)


def _forward_signals(pids: list[int]) -> None:
    """Pass SIGINT, SIGTERM and SIGHUP on to ``pids`` (one gone already is skipped)."""

    def forward(signum, _frame):
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        signal.signal(sig, forward)


def _payload(service: Any, grant: Any, ranks: int, bind: str = "none") -> tuple[dict[str, Any], str | None, list[str]]:
    """(what the child is sent, the grant file written, warnings): the grant's variables, and
    with ``ranks`` > 1 each rank's share and variables (its devices' too when ``bind`` is
    ``closest``). Raises OSError writing the file."""
    import json
    import tempfile

    from numa_pin.allocators.devbind import BIND_CLOSEST, bind_closest
    from numa_pin.allocators.distrib import distribute
    from numa_pin.base.record import replace
    from numa_pin.cli.run_grant import grant_document, grant_env, rank_env

    topology = service.topology
    shares = distribute(topology, grant.cpus, ranks) if ranks > 1 and grant.cpus else []
    bound = bind_closest(topology, shares, grant.devices) if bind == BIND_CLOSEST and shares else []
    fd, path = tempfile.mkstemp(prefix=f"numa-pin-grant-{os.getpid()}-", suffix=".json")
    try:
        os.fchmod(fd, 0o644)
        doc = grant_document(grant, topology, shares, bound)
        _write_all(fd, (json.dumps(doc, indent=2) + "\n").encode())
    finally:
        os.close(fd)
    env, warnings = grant_env(grant, topology, path)
    payload: dict[str, Any] = {"env": env}
    if shares:
        payload["ranks"] = [{"cpus": sorted(share), "env": rank_env(
            share, i, ranks, topology, replace(grant, devices=bound[i]) if bound else None)}
            for i, share in enumerate(shares)]
    return payload, path, warnings


def run(args: argparse.Namespace) -> int:
    import json

    import prctl

    from numa_pin.base.record import replace
    from numa_pin.cli.run_grant import explicit_cpuset
    from numa_pin.enforcer import mempolicy, procgroup
    from numa_pin.enforcer.mounts import detect_layout
    from numa_pin.enforcer.systemd import detect
    from numa_pin.errors import RequestError
    from numa_pin.service.node import live_name_message, open_service

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise RequestError("no command given (numa-pin run [flags] -- COMMAND ...)", annotation="COMMAND")
    if args.ranks < 1:
        raise RequestError(f"--ranks must be at least 1, got {args.ranks}", annotation="--ranks")
    config = load(args)
    name = args.name or f"run-{os.getpid()}-{int(time.time())}"
    args.subject = name  # a refusal from here on names the job, as the hook's names the container
    service = open_service(config)
    explicit = explicit_cpuset(args.cpu_list, args.nodes, service.topology)
    if explicit is not None and args.cpus is None:
        args.cpus = str(len(explicit))
    from numa_pin.requests.request import with_memory_tier

    request = with_memory_tier(request_from_args(args, name, config.isolation), config.memory_tiers)
    if request.memory_policy:
        mempolicy.check_kernel(request.memory_policy, config.sysfs_root)
    if explicit is not None:
        request = replace(request, cpuset=explicit)
    if args.ranks > 1 and not request.exclusive:
        raise RequestError("ranks share exclusive CPUs: give --cpus, --cpu-list or --nodes", annotation="--ranks")
    if args.bind_devices == "closest" and not any(request.amounts.devices.values()):
        raise RequestError("--bind-devices closest binds granted devices to ranks, and the request asks none: "
                           "give --devices RES=N", annotation="--bind-devices")
    live = service.live_grant(name)
    if live is not None:  # checked again inside the admission's transaction
        raise RequestError(live_name_message(live), annotation="--name")
    systemd = detect(config.proc_root)
    group = None
    if systemd is None:
        layout = detect_layout(config.proc_root)
        group = procgroup.create(config.cgroup_root, name, layout.cpuset_version)

    prctl.set_child_subreaper(True)
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: wait for the verdict, then exec (it never returns into the parent's code)
        try:
            os.close(go_w)
            verdict = os.read(go_r, 1)
            if verdict != b"1":
                os._exit(125)
            payload = _read_payload(go_r)
            os.close(go_r)
            mempolicy.apply_in_child(payload.get("mempolicy", "").encode())
            if args.no_new_privs:
                prctl.set_no_new_privs(True)
            if payload.get("ranks"):
                _lead(command, payload["env"], payload["ranks"])
            _exec(command, payload.get("env", {}))
        except BaseException as exc:  # noqa: BLE001 - a forked child must not unwind into the parent's code
            print(f"numa-pin: cannot start {command[0]}: {exc}", file=sys.stderr)
        os._exit(125)
    os.close(go_r)
    admitted = False
    grant_file: str | None = None
    try:
        if group is not None:
            procgroup.join(group, pid)
        else:  # systemd owns the hierarchy: the job gets a unit of its own, removed once it ends
            assert systemd is not None
            systemd.start_scope(f"numa-pin-run-{pid}.scope", pid, f"numa-pin run {name}", config.proc_root)
        admitted_grant = service.admit(request, pid, kind="process", target=RUN)
        try:
            payload, grant_file, warnings = _payload(service, admitted_grant.grant, args.ranks,
                                                        args.bind_devices)
            payload["mempolicy"] = mempolicy.encode(request.memory_policy, admitted_grant.grant.mems).decode()
            os.write(go_w, b"1")
            _write_all(go_w, json.dumps(payload).encode())
        except BaseException:
            service.release(name)
            if grant_file is not None:
                _unlink(grant_file)
            raise
        admitted = True
    finally:
        if not admitted:
            try:
                os.write(go_w, b"0")
            except OSError:  # the child is gone already (it read a verdict, then failed)
                pass
            os.waitpid(pid, 0)
            if group is not None:
                procgroup.remove(group)
        os.close(go_w)
    grant = admitted_grant.grant
    print(f"numa-pin: {name}: cpus={sorted(grant.cpus) or 'shared'} mems={sorted(grant.mems)}", file=sys.stderr)
    for problem in warnings:
        print(f"numa-pin: {name}: {problem}", file=sys.stderr)
    from numa_pin.cluster.kubelet import conflict_warning

    warning = conflict_warning(config.kubelet_root)
    if warning:
        print(warning, file=sys.stderr)

    _forward_signals([pid])
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
        if grant_file is not None:
            _unlink(grant_file)
    return code


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
