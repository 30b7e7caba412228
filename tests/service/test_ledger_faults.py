"""A failed ledger write leaves the machine as it found it (issue 22, items 2, 8 and 9).

The commit is inside the rollback: when the write fails (ENOSPC, an fsync that fails with EIO,
a ledger its reader would refuse), every cgroup write of that admission, release or reconcile
is undone. Faults are injected in the store's own I/O; a real full tmpfs is the root-tier proof.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
from pathlib import Path

import pytest

from numa_pin.base import safefs
from numa_pin.config.schema import config_from_dict
from numa_pin.entry.hook import run as hook_run
from numa_pin.errors import EXIT_ERROR, LedgerError
from numa_pin.ledger import store
from numa_pin.requests.request import request_from_oci
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path: Path, tmp_path_factory, monkeypatch) -> FakeNode:
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    return FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")


def service(node: FakeNode) -> NodeService:
    return NodeService(config_from_dict(node.config_dict(policy="restricted")))


def cgroup_files(node: FakeNode) -> dict[str, str]:
    return {str(p.relative_to(node.cgroup_root)): p.read_text() for p in sorted(node.cgroup_root.rglob("*"))
            if p.is_file()}


def _raise(code: int):
    def fail(*_args, **_kwargs):
        raise OSError(code, os.strerror(code))
    return fail


#: (id, what fails, the errno named in the error)
FAULTS = [
    ("enospc-write", "write_all", errno.ENOSPC),
    ("eio-fsync", "fsync", errno.EIO),
    ("eio-fsync-dir", "fsync_dir", errno.EIO),
]


def inject(monkeypatch, where: str, code: int) -> None:
    if where == "fsync":
        monkeypatch.setattr(store.os, "fsync", _raise(code))
    else:  # the one atomic-replace path of numa-pin (safefs.replace_private) looks these up at each call
        monkeypatch.setattr(safefs, where, _raise(code))


@pytest.mark.parametrize("where, code", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_failed_ledger_write_undoes_the_admission(node, monkeypatch, where, code):
    svc = service(node)
    svc.admit(request_from_oci("s", {}), node.add_container("s", 44000))
    pid = node.add_container("x", 44001)
    before, ledger = cgroup_files(node), svc.ledger.read()
    inject(monkeypatch, where, code)
    with pytest.raises(LedgerError, match=errno.errorcode[code]):
        svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), pid)
    monkeypatch.undo()
    assert cgroup_files(node) == before  # x's cpuset and the shrunk shared container are back
    assert svc.ledger.read() == ledger


@pytest.mark.parametrize("where, code", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_failed_ledger_write_undoes_the_release(node, monkeypatch, where, code):
    svc = service(node)
    svc.admit(request_from_oci("s", {}), node.add_container("s", 44000))
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), node.add_container("x", 44001))
    before, ledger = cgroup_files(node), svc.ledger.read()
    inject(monkeypatch, where, code)
    with pytest.raises(LedgerError):
        svc.release("x")
    monkeypatch.undo()
    assert cgroup_files(node) == before  # the shared container did not grow onto x's CPUs
    assert svc.ledger.read() == ledger


@pytest.mark.parametrize("where, code", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_failed_ledger_write_undoes_the_reconcile(node, monkeypatch, where, code):
    svc = service(node)
    svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), node.add_container("x", 44001))
    pid = node.add_container("dead", 44002)
    svc.admit(request_from_oci("dead", {"numa-pin.io/cpus": "2"}), pid)
    node.stop_container("dead", pid)  # a grant to drop, so the reconcile writes the ledger
    (node.cgroup_dir("x") / "cpuset.cpus").write_text("0-63\n")  # drift to repair
    before, ledger = cgroup_files(node), svc.ledger.read()
    inject(monkeypatch, where, code)
    with pytest.raises(LedgerError):
        svc.reconcile()
    monkeypatch.undo()
    assert cgroup_files(node) == before
    assert svc.ledger.read() == ledger


def test_a_full_state_dir_is_a_ledger_error_naming_the_lock(node, monkeypatch, capfd):
    """state_dir full to the last page: recording the lock holder fails with ENOSPC."""
    config = node.write_config(policy="restricted")
    pid = node.add_container("x", 44001)
    monkeypatch.setattr(store.os, "pwrite", _raise(errno.ENOSPC))
    rc = hook_run(["--config", str(config), "prestart"], io.BytesIO(node.oci_state("x", pid, {"numa-pin.io/cpus": "2"})))
    err = capfd.readouterr().err
    assert rc == EXIT_ERROR, err
    assert "LedgerError" in err and "ledger.lock" in err and "ENOSPC" in err and "internal error" not in err


def test_the_writer_never_commits_a_ledger_its_reader_refuses(node, monkeypatch):
    """One grant that would take the ledger past the reader's limit is refused (rolled back);
    the ledger stays readable and the next ordinary admission works."""
    svc = service(node)
    svc.admit(request_from_oci("s", {}), node.add_container("s", 44000))
    monkeypatch.setattr(store, "MAX_LEDGER_BYTES", len(store.encode(svc.ledger.read())) + 200)
    pid = node.add_container("big", 44001)
    before = cgroup_files(node)
    with pytest.raises(LedgerError, match="refusing to write a ledger of"):
        svc.admit(request_from_oci("big", {"numa-pin.io/cpus": "2"}), pid)
    assert cgroup_files(node) == before
    assert set(svc.ledger.read().grants) == {"s"}  # the reader (same limit) still takes it
    monkeypatch.undo()
    svc.admit(request_from_oci("small", {"numa-pin.io/cpus": "2"}), node.add_container("small", 44002))
    assert set(svc.ledger.read().grants) == {"s", "small"}


@pytest.mark.parametrize("field", ["io.kubernetes.pod.uid", "io.kubernetes.cri.container-name"],
                         ids=["pod-id", "container-name"])
def test_a_grant_with_an_unbounded_name_or_pod_is_refused(node, field):
    svc = service(node)
    pid = node.add_container("x", 44001)
    with pytest.raises(LedgerError, match=f"more than {store.MAX_NAME_CHARS}"):
        svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "2", field: "n" * 2_000_000}), pid)
    assert svc.ledger.read().grants == {}


@pytest.mark.root
def test_a_real_full_tmpfs_undoes_the_admission(node, tmp_path):
    """ENOSPC for real: the state directory on a tiny tmpfs filled to its last page (the lock
    holder or the ledger cannot be written): a ledger error, and nothing changed."""
    state = tmp_path / "tiny"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(state)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    svc = NodeService(config_from_dict(node.config_dict(policy="restricted", state_dir=str(state))))
    try:
        svc.admit(request_from_oci("s", {}), node.add_container("s", 44000))
        filler = state / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        pid = node.add_container("x", 44001)
        before, ledger = cgroup_files(node), svc.ledger.read()
        with pytest.raises(LedgerError, match="ENOSPC"):
            svc.admit(request_from_oci("x", {"numa-pin.io/cpus": "4"}), pid)
        assert cgroup_files(node) == before and svc.ledger.read() == ledger
    finally:
        svc.ledger.cache.let_go()  # the service holds the ledger it read last open
        subprocess.run(["umount", str(state)], check=True)
