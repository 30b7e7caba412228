"""``numa-pin serve`` under systemd socket activation (``LISTEN_FDS``/``LISTEN_PID``, fd 3).

The oracle for the protocol is systemd's own ``systemd-socket-activate``: it listens on the
path, waits for the first connection and only then execs ``numa-pin serve`` with the listening
socket on fd 3, exactly as a ``.socket`` unit does. A hook that connects before the agent
exists must still be served by it (the log shows ``served``), and a stopped agent must leave
the socket to its owner. The refusals are checked in-process with fake environments and in a
child whose fd 3 is not a listening socket.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from numa_pin.agent import listener
from numa_pin.errors import AgentError
from numa_pin.testing.node import FakeNode
from waitfor import wait_for

BIN = Path(sys.executable).parent
HOOK = shutil.which("numa-pin-hook", path=str(BIN))
NUMA_PIN = shutil.which("numa-pin", path=str(BIN))
ACTIVATE = shutil.which("systemd-socket-activate")
WAIT_S = 60.0


@pytest.mark.parametrize(
    "environ, want",
    [
        ({}, None),
        ({"LISTEN_FDS": "1"}, None),
        ({"LISTEN_FDS": "1", "LISTEN_PID": "1"}, None),  # meant for another process
        ({"LISTEN_FDS": "0", "LISTEN_PID": "SELF"}, None),
        ({"LISTEN_FDS": "two", "LISTEN_PID": "SELF"}, "not numbers"),
        ({"LISTEN_FDS": "2", "LISTEN_PID": "SELF"}, "passed 2 sockets"),
    ],
    ids=["none", "no-pid", "other-pid", "zero-fds", "garbage", "two-sockets"],
)
def test_systemd_listener_reads_the_environment(environ, want):
    env = {k: (str(os.getpid()) if v == "SELF" else v) for k, v in environ.items()}
    if want is None:
        assert listener.systemd_listener(env) is None
    else:
        with pytest.raises(AgentError, match=want):
            listener.systemd_listener(env)


_WRONG_FD3 = """
import os, socket, sys
from numa_pin.agent import listener
from numa_pin.errors import AgentError
kind = sys.argv[1]
if kind == "file":
    fd = os.open(os.devnull, os.O_RDONLY)
elif kind == "datagram":
    fd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).detach()
else:  # a stream socket nobody called listen() on
    fd = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).detach()
os.dup2(fd, 3)
try:
    listener.systemd_listener({"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid())})
except AgentError as exc:
    print(exc)
else:
    print("accepted")
"""


@pytest.mark.parametrize("kind, want", [("file", "not a socket"), ("datagram", "not a listening Unix stream"),
                                        ("unlistened", "not a listening Unix stream")])
def test_systemd_listener_refuses_a_wrong_fd3(kind, want):
    out = subprocess.run([sys.executable, "-c", _WRONG_FD3, kind], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert want in out.stdout


@pytest.mark.skipif(HOOK is None or NUMA_PIN is None, reason="numa-pin scripts not installed")
@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is not installed (package systemd)")
def test_socket_activated_agent_serves_the_first_hook_and_leaves_the_socket(tmp_path, tmp_path_factory):
    node = FakeNode(tmp_path / "node", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    node.add_container("c0", 5000)
    node.add_container("c1", 5001)
    config = node.write_config(policy="single-numa-node")
    sock, log, err = tmp_path / "agent.sock", tmp_path / "agent.log", tmp_path / "agent.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMA_PIN_", "LISTEN_"))}
    with open(err, "wb") as err_fp:
        # --socket names a path that must stay unused: the passed socket wins
        activator = subprocess.Popen(
            [ACTIVATE, "-l", str(sock), NUMA_PIN, "serve", "--socket", str(tmp_path / "unused.sock"),
             "--log", str(log)],
            stdout=subprocess.DEVNULL, stderr=err_fp, env=env,
        )
    try:

        def listening() -> bool:
            assert activator.poll() is None, err.read_text()
            return sock.exists()

        wait_for(listening, lambda: f"the activator to listen at {sock}: {err.read_text()}")
        hook_env = {**env, "NUMA_PIN_CACHE_DIR": str(node.cache_dir), "NUMA_PIN_AGENT_SOCKET": str(sock)}
        for i in (0, 1):  # the first connection starts the agent; the second finds it running
            proc = subprocess.run([HOOK, "--config", str(config), "prestart"], capture_output=True,
                                  input=node.oci_state(f"c{i}", 5000 + i, {"numa-pin.io/cpus": "2"}),
                                  env=hook_env, timeout=120)
            assert (proc.returncode, proc.stderr) == (0, b"")
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert [r["outcome"] for r in records] == ["served", "served"], records
        assert len({r["pid"] for r in records}) == 2 and records[0]["pid"] != activator.pid  # forked children
        assert "serving the socket systemd passed" in err.read_text()
        assert not (tmp_path / "unused.sock").exists()
        activator.send_signal(signal.SIGTERM)  # the activator exec'd into the agent: same pid
        assert activator.wait(timeout=WAIT_S) == 0
        assert sock.exists(), "the socket belongs to systemd; a stopped agent must not unlink it"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with pytest.raises(ConnectionRefusedError):  # nobody listens once the owner is gone too
            probe.connect(str(sock))
        probe.close()
    finally:
        if activator.poll() is None:
            activator.kill()
            activator.wait()
