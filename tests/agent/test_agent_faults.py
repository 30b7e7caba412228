"""The agent is an accelerator, never a dependency: a stopped or frozen agent, a signal to an
idle one, peers that drip their requests or that it refuses.

The node, the real ``numa-pin serve`` and the installed hook are those of test_agent_server.py;
the in-process hook on an identical twin node is the oracle for "the same grant".
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from numa_pin.agent import client, protocol, request, server, spare
from waitfor import wait_for

from .test_agent_server import HOOK, WAIT_S, Node, Served, hook_env, node, run_hook, twin

__all__ = ["node", "twin"]  # fixtures

#: runc's shipped hook timeout: a hook that takes longer than this fails the container start
RUNC_HOOK_TIMEOUT_S = 30


def _tree(agent: Served) -> list[psutil.Process]:
    parent = psutil.Process(agent.proc.pid)
    return [parent, *parent.children(recursive=True)]


def _hook_within_runc_timeout(node: Node, state: bytes, sock: Path) -> tuple[int, str]:
    """The hook as runc runs it: killed (and the container start failed) after 30 s."""
    proc = subprocess.run([HOOK, "--config", str(node.config), "prestart"], input=state, capture_output=True,
                          env=hook_env(node, sock), timeout=RUNC_HOOK_TIMEOUT_S)
    return proc.returncode, proc.stderr.decode()


def test_a_frozen_agent_never_fails_a_container_start(tmp_path, node, twin):
    """SIGSTOP to the agent and its children (a frozen cgroup): connect() still succeeds on the
    listen backlog. The hook runs in-process well inside runc's timeout, and when the agent
    wakes up it finds no request on that connection: one admission, the in-process one."""
    agent = Served(tmp_path / "agent")
    try:
        wait_for(agent.children, "the spare")
        frozen = _tree(agent)
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        state, twin_state = node.state_json(0, {"numa-pin.io/cpus": "2"}), twin.state_json(0, {"numa-pin.io/cpus": "2"})
        try:
            assert _hook_within_runc_timeout(node, state, agent.sock) == (0, "")
        finally:
            for proc in frozen:
                proc.send_signal(signal.SIGCONT)
        assert run_hook(twin, twin_state) == (0, "")
        assert node.grants() == twin.grants() and node.cpus_of(0) == node.granted("c0")
        wait_for(lambda: agent.records("abandoned"), "the woken agent to find the connection given up")
        assert agent.records("served") == []
        assert node.grants() == twin.grants() and node.cpus_of(0) == node.granted("c0")
        # awake again, it serves the next hook
        assert run_hook(node, node.state_json(1), sock=agent.sock) == (0, "")
        assert len(agent.records("served")) == 1
    finally:
        assert agent.stop() == 0


def test_a_child_stopped_during_the_admission_is_given_up_without_a_double_grant(tmp_path, node, twin):
    """The child that accepted the hook stops mid-admission (here: while it waits for the ledger
    lock). Its keepalives stop, the hook gives up and admits in-process; the child, continued,
    sees that its hook went away. The node holds exactly the grant the in-process hook makes."""
    agent = Served(tmp_path / "agent")
    node.state.mkdir(parents=True, exist_ok=True)
    lock = os.open(node.state / "ledger.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the admission waits here, inside the child
    state, twin_state = node.state_json(3, {"numa-pin.io/cpus": "4"}), twin.state_json(3, {"numa-pin.io/cpus": "4"})
    hook = subprocess.Popen([HOOK, "--config", str(node.config), "prestart"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=hook_env(node, agent.sock))
    try:
        hook.stdin.write(state)
        hook.stdin.close()
        child = wait_for(lambda: _waiting_for(node, agent), "the agent's child to wait for the lock")
        child.send_signal(signal.SIGSTOP)
        fcntl.flock(lock, fcntl.LOCK_UN)  # the in-process hook will get it
        assert hook.wait(timeout=RUNC_HOOK_TIMEOUT_S) == 0
        assert hook.stderr.read().decode() in ("", "numa-pin: waiting for the ledger lock (held by another process)\n")
        child.send_signal(signal.SIGCONT)
        wait_for(lambda: _gone(child), "the child to finish")
        assert run_hook(twin, twin_state) == (0, "")
        assert node.grants() == twin.grants()
        assert node.cpus_of(3) == node.granted("c3") and len(node.granted("c3")) == 4
    finally:
        os.close(lock)
        hook.kill()
        hook.wait()
        assert agent.stop() == 0


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # reaped between the two looks
        return True


def _waiting_for(node: Node, agent: Served) -> psutil.Process | None:
    """The agent's child that has the ledger lock file open (it waits for the lock), if any."""
    for proc in agent.children():
        try:
            if any(f.path == str(node.state / "ledger.lock") for f in proc.open_files()):
                return proc
        except psutil.Error:
            continue
    return None


@pytest.mark.parametrize("idle_exit_s", [None, 600], ids=["serve", "idle-exit"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_an_idle_agent_at_once(tmp_path, signum, idle_exit_s):
    agent = Served(tmp_path / "agent", idle_exit_s=idle_exit_s)
    wait_for(agent.children, "the spare")
    agent.proc.send_signal(signum)
    assert agent.proc.wait(timeout=WAIT_S) == 0  # not after 600 s of idleness
    assert not agent.sock.exists()


def _drip(sock_path: Path, outcome: list[str], drops: int = 40, every_s: float = 0.25) -> None:
    """A peer that is accepted, then sends a byte of its request every ``every_s`` seconds."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(WAIT_S)
    try:
        conn.connect(str(sock_path))
        if conn.recv(1) != protocol.ACCEPTED:
            outcome.append("refused")
            return
        conn.settimeout(every_s)
        payload = protocol.frame(b"x" * 4096)  # never complete within ``drops`` bytes
        for i in range(drops):
            try:
                if conn.recv(1) == b"":
                    outcome.append("cut off")
                    return
            except TimeoutError:
                pass
            except OSError:  # ECONNRESET: closed with our bytes unread
                outcome.append("cut off")
                return
            try:
                conn.send(payload[i:i + 1])
            except OSError:
                outcome.append("cut off")
                return
        outcome.append("still connected")
    finally:
        conn.close()


def test_slow_drip_peers_are_cut_off_by_a_total_deadline(tmp_path, node):
    """The request deadline is for the whole request, not for each recv(): peers that send a
    byte every 0.25 s are cut off after it, and free their admission slots for a real hook."""
    agent = Served(tmp_path / "agent", max_children=4, read_timeout_s=1.0)
    try:
        outcome: list[str] = []
        drips = [threading.Thread(target=_drip, args=(agent.sock, outcome)) for _ in range(4)]
        for t in drips:
            t.start()
        for t in drips:
            t.join(WAIT_S)
        assert "cut off" in outcome and "still connected" not in outcome, outcome
        assert run_hook(node, node.state_json(0, {"numa-pin.io/cpus": "2"}), sock=agent.sock) == (0, "")
        assert len(agent.records("served")) == 1
        assert [r for r in agent.records("bad-request") if "in time" in r["reason"]]
    finally:
        assert agent.stop() == 0


def _ns_links(root: Path, pid: str, links: dict[str, str]) -> None:
    (root / pid / "ns").mkdir(parents=True)
    for name, target in links.items():
        os.symlink(target, root / pid / "ns" / name)


HOST_NS = {"pid": "pid:[1]", "mnt": "mnt:[2]", "net": "net:[3]", "cgroup": "cgroup:[4]"}


@pytest.mark.parametrize(
    "request_fields, peer_ns, refused",
    [
        ({"version": "0.0.0-old"}, HOST_NS, "restart"),
        ({"home": "/elsewhere/numa_pin"}, HOST_NS, "/elsewhere"),
        ({}, {**HOST_NS, "mnt": "mnt:[9]"}, "mnt namespace"),
    ],
    ids=["other-version", "other-installation", "other-mount-ns"],
)
def test_a_refused_request_neither_steers_the_rehearsal_nor_counts_as_activity(tmp_path, request_fields,
                                                                               peer_ns, refused):
    proc_root = tmp_path / "proc"
    _ns_links(proc_root, "self", HOST_NS)
    _ns_links(proc_root, "4242", peer_ns)
    path = str(tmp_path / "run" / "agent.sock")
    lock_fd, listener = server.open_socket(path)
    agent = server.AgentServer(path, lock_fd, listener, proc_root=str(proc_root), idle_exit_s=60)
    ours, theirs = socket.socketpair()
    try:
        fields = {"version": protocol.__version__, "home": protocol.HOME, **request_fields}
        body = protocol.encode_request(["--config", str(tmp_path / "refused.yaml"), "prestart"], b"{}",
                                       {"NUMA_PIN_CACHE_DIR": str(tmp_path / "refused-cache")}, "/",
                                       fields["home"])
        body = body.replace(protocol.__version__.encode(), fields["version"].encode(), 1)
        theirs.sendall(protocol.frame(body))
        before = agent.last_active
        agent.handler.handle(ours, request.Peer(4242, os.geteuid(), os.getegid()))
        assert theirs.recv(1) == protocol.ACCEPTED
        assert refused in client.read_reply(theirs, time.monotonic() + WAIT_S).decode()
        assert not agent.spares.read(time.monotonic())  # no activity
        assert agent.spares.rehearsal is None and agent.last_active == before
        lines, rest = spare.read_notes(agent.spares.notes_r, b"")
        assert lines == [] and rest == b""
    finally:
        ours.close()
        theirs.close()
        agent.close()


def test_an_agent_of_another_version_retires_while_refused_hooks_keep_coming(tmp_path, node):
    agent = Served(tmp_path / "agent", version="0.0.0-old", idle_exit_s=1)
    stop = threading.Event()

    def hooks() -> None:  # what every container start on this node does: ask, be refused
        while not stop.is_set():
            client.try_agent(["--config", str(node.config), "poststop"], node.state_json(0),
                             hook_env(node, agent.sock), str(agent.sock))
            time.sleep(0.05)  # the pace of container starts (the behaviour under test)

    asking = threading.Thread(target=hooks)
    asking.start()
    try:
        assert agent.proc.wait(timeout=WAIT_S) == 0
        assert agent.records("fallback"), "hooks were refused while it ran"
    finally:
        stop.set()
        asking.join(WAIT_S)
        agent.stop(signal.SIGKILL)


def test_agent_errors_keep_their_errno_and_cause(tmp_path):
    import errno

    from numa_pin.agent import listener
    from numa_pin.errors import AgentError

    path = str(tmp_path / "run" / "agent.sock")
    held = listener.take_lock(path)
    try:
        with pytest.raises(AgentError, match="another numa-pin serve is running") as info:
            listener.take_lock(path)
        assert info.value.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == info.value.errno
        (tmp_path / "run" / "file").write_text("")
        with pytest.raises(AgentError, match="cannot listen") as info:
            listener.listen(str(tmp_path / "run" / "file" / "s.sock"))
        assert info.value.errno == errno.ENOTDIR and isinstance(info.value.__cause__, OSError)
    finally:
        os.close(held)
