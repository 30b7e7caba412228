"""Fakes for the IRQ and load-balancing knobs: a fake ``/proc/irq`` and a fake irqbalance.

* :func:`make_irqs` lays out ``<proc>/irq/<n>/smp_affinity_list`` and ``default_smp_affinity``;
  :func:`affinities` reads them back as text, exactly as written;
* :class:`FakeIrqbalance` is a process whose ``comm`` is ``irqbalance`` (its environment as
  given) and, with ``socket=True``, a server on ``<proc>/<pid>/root/run/irqbalance/irqbalance<pid>.sock``
  that speaks irqbalance's protocol: it checks the sender's credentials (uid 0), answers
  ``setup`` with ``SLEEP 10 BANNED <mask>`` and records every command it is sent.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from numa_pin.base.cpuset import format_list


def make_irqs(proc_root: Path, irqs: dict[int, str], default_mask: str) -> Path:
    base = proc_root / "irq"
    for irq, cpus in irqs.items():
        (base / str(irq)).mkdir(parents=True, exist_ok=True)
        (base / str(irq) / "smp_affinity_list").write_text(cpus + "\n")
    base.mkdir(parents=True, exist_ok=True)
    (base / "default_smp_affinity").write_text(default_mask + "\n")
    return base


def affinities(proc_root: Path) -> dict[str, str]:
    base = proc_root / "irq"
    out = {d.name: (d / "smp_affinity_list").read_text().strip() for d in base.iterdir() if d.is_dir()}
    out["default"] = (base / "default_smp_affinity").read_text().strip()
    return out


class FakeIrqbalance:
    def __init__(self, proc_root: Path, pid: int, env: dict[str, str] | None = None, *, socket_: bool = True,
                 banned: frozenset[int] = frozenset()) -> None:
        self.pid = pid
        self.banned = banned
        self.commands: list[str] = []
        self.refused = 0
        d = proc_root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "comm").write_text("irqbalance\n")
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items()))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.path = d / "root" / "run" / "irqbalance" / f"irqbalance{pid}.sock"
        if socket_:
            self.path.parent.mkdir(parents=True)
            self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dfd = os.open(self.path.parent, os.O_PATH | os.O_DIRECTORY)
            try:
                self.server.bind(f"/proc/self/fd/{dfd}/{self.path.name}")
            finally:
                os.close(dfd)
            self.server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self.server.listen(4)
            self.server.settimeout(0.2)
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                msg, anc, _flags, _addr = conn.recvmsg(500, socket.CMSG_SPACE(12))
                creds = [data for level, kind, data in anc if level == socket.SOL_SOCKET
                         and kind == socket.SCM_CREDENTIALS]
                if not creds or int.from_bytes(creds[0][4:8], "little") != 0:
                    self.refused += 1  # irqbalance drops a sender that is not root
                    continue
                text = msg.decode()
                self.commands.append(text)
                if text.startswith("setup"):
                    mask = sum(1 << c for c in self.banned)
                    conn.sendall(f"SLEEP 10 BANNED {mask:08x}".encode())

    def settings(self) -> list[str]:
        return [c for c in self.commands if c.startswith("settings")]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self.server.close()


def cpus_text(cpus: frozenset[int]) -> str:
    return format_list(cpus)
