"""``numa-pin serve --nri``: the command connects to the runtime's socket, registers and answers;
it connects again when the runtime restarts (a new listener on the same path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from numa_pin.errors import NriError
from numa_pin.nri import messages as nri_messages
from numa_pin.nri import plugin
from numa_pin.testing.node import FakeNode

from .fake_runtime import FakeRuntime, container, pod

GI = 1 << 30


def _listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(60)
    return server


def test_the_command_registers_answers_and_comes_back_after_a_runtime_restart(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    node = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines", parent="")
    config = node.write_config(policy="restricted", kubelet_root=str(tmp_path / "no-kubelet"))
    sock_path = tmp_path / "nri.sock"
    m = nri_messages.load()
    server = _listen(sock_path)
    env = {**os.environ, "NUMA_PIN_CONFIG": str(config), "NUMA_PIN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "numa_pin.cli.main", "serve", "--nri", "--nri-socket",
                             str(sock_path), "--nri-index", "07"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        for restart in range(2):
            conn, _ = server.accept()
            runtime = FakeRuntime(conn, m)
            assert (runtime.accept_registration().plugin_idx, restart) == ("07", restart)
            runtime.configure()
            runtime.synchronize([], [])
            p = pod(m, f"u{restart}", "p", "")
            code, text, reply = runtime.create(p, container(m, p, f"c{restart}", cpu_milli=1000, limit_milli=1000,
                                                            memory=GI))
            assert code == 0, text
            assert len(reply.adjust.linux.resources.cpu.cpus.split(",")) == 1
            conn.close()  # the runtime restarts: the plugin connects again
            if restart == 0:
                server.close()
                sock_path.unlink()
                server = _listen(sock_path)
    finally:
        server.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "registered as 07-numa-pin" in err and "Traceback" not in err


def test_without_a_runtime_socket_it_says_so_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(NriError, match=r"nri\.sock: cannot connect .*is NRI enabled"):
        plugin.serve(str(tmp_path / "nri.sock"), lambda: None, nri_messages.load(), env={}, once=True)
