"""Reason files never collide and are pruned; exit codes tell the failure classes apart
(issue 10, §5). Before: ``explain rt-a_b`` showed the rejection of ``rt-a/b``; reason files were
never deleted; rejection, configuration, usage and internal errors shared exit codes 1 and 2.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_pin.base import text
from numa_pin.cli.main import main as cli_main
from numa_pin.entry import hook as hook_main
from numa_pin.errors import EXIT_CONFIG, EXIT_ERROR, EXIT_INTERNAL, EXIT_REJECTED, EXIT_USAGE
from numa_pin.reporting import report
from numa_pin.testing.node import FakeNode


def hook(fake, config, cid: str, annotations: dict, stage: str = "prestart") -> int:
    bundle = fake.root / "bundle"
    bundle.mkdir(exist_ok=True)
    # the pid's cgroup is /c: the bundle says so, as runtimes do
    (bundle / "config.json").write_text(json.dumps({"annotations": annotations, "linux": {"cgroupsPath": "/c"}}))
    state = json.dumps({"id": cid, "bundle": str(bundle), "pid": 77}).encode()
    return hook_main.run(["--config", str(config), stage], io.BytesIO(state))


def test_ids_that_sanitise_alike_do_not_share_a_reason(node, capsys):
    fake, config = node
    assert hook(fake, config, "rt-a/b", {"numa-pin.io/cpus": "999"}) == EXIT_REJECTED
    capsys.readouterr()
    assert cli_main(["explain", "rt-a_b", "--config", str(config)]) == 1
    assert "no grant and no recorded rejection for rt-a_b" in capsys.readouterr().err
    assert cli_main(["explain", "rt-a/b", "--config", str(config)]) == 0
    assert "rejected rt-a/b" in capsys.readouterr().out


@given(st.lists(st.text(min_size=1, max_size=80), min_size=2, max_size=2, unique=True))
def test_reason_paths_of_distinct_ids_differ(ids):
    a, b = (report.reason_path("/s", i) for i in ids)
    assert a != b
    for path in (a, b):
        name = os.path.basename(path)
        assert os.path.dirname(path) == "/s/reasons" and "/" not in name and name not in (".", "..")
        assert len(name.encode()) <= 255


def test_explain_checks_the_id_recorded_in_the_file(node, capsys):
    fake, config = node
    path = Path(report.reason_path(str(fake.state_dir), "x"))
    assert report.write_reason(str(fake.state_dir), "y", "numa-pin: rejected y: planted") is not None
    os.replace(report.reason_path(str(fake.state_dir), "y"), path)  # y's record under x's name
    assert cli_main(["explain", "x", "--config", str(config)]) == 1


def test_admission_and_release_delete_the_reason(node, capsys):
    fake, config = node
    assert hook(fake, config, "c1", {"numa-pin.io/cpus": "999"}) == EXIT_REJECTED
    path = Path(report.reason_path(str(fake.state_dir), "c1"))
    assert path.exists() and path.stat().st_mode & 0o777 == 0o600
    assert hook(fake, config, "c1", {}, stage="poststop") == 0  # runc's poststop after a rejection
    assert path.exists(), "the rejection must stay explainable"
    assert hook(fake, config, "c1", {"numa-pin.io/cpus": "1"}) == 0
    assert not path.exists()
    assert report.write_reason(str(fake.state_dir), "c1", "numa-pin: error c1: stale") is not None
    assert hook(fake, config, "c1", {}, stage="poststop") == 0
    assert not path.exists()


def test_reason_files_are_pruned_oldest_first(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MAX_REASONS", 5)
    state = str(tmp_path / "state")
    for i in range(8):
        path = report.write_reason(state, f"c{i}", f"numa-pin: rejected c{i}: x")
        assert path is not None
        os.utime(path, ns=(i * 10**9, i * 10**9))  # c0 is the oldest
    kept = {json.loads(p.read_text())["container_id"] for p in (tmp_path / "state" / "reasons").iterdir()}
    assert len(kept) == 5 and "c7" in kept and "c0" not in kept


def test_hook_exit_codes(node, tmp_path, capsys, monkeypatch):
    fake, config = node
    assert hook(fake, config, "r", {"numa-pin.io/cpus": "999"}) == EXIT_REJECTED == 1
    assert hook(fake, config, "r", {"numa-pin.io/cpus": "lots"}) == EXIT_REJECTED  # malformed request
    assert hook_main.run(["--wat"], io.BytesIO(b"{}")) == EXIT_USAGE == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: strict\n")
    assert hook(fake, bad, "r", {}) == EXIT_CONFIG == 3
    os.chmod(fake.state_dir, 0o777)
    assert hook(fake, config, "r", {"numa-pin.io/cpus": "1"}) == EXIT_ERROR == 4
    assert "UnsafePathError" in capsys.readouterr().err
    os.chmod(fake.state_dir, 0o700)
    monkeypatch.setattr("numa_pin.hook.admit.admission_for", lambda state, cfg: 1 / 0)
    assert hook(fake, config, "r", {"numa-pin.io/cpus": "1"}) == EXIT_INTERNAL == 70
    assert "internal error r: ZeroDivisionError" in capsys.readouterr().err


def test_cli_exit_codes(node, tmp_path, capsys):
    fake, config = node
    assert cli_main(["status", "--bogus"]) == EXIT_USAGE
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: strict\n")
    assert cli_main(["status", "--config", str(bad)]) == EXIT_CONFIG
    capsys.readouterr()


# ---- bounded reasons (issue 22 items 7 and 13) -------------------------------------------------

BIG = "GPU-" + "x" * 1_400_000  # one pod-spec value: NVIDIA_VISIBLE_DEVICES, an annotation


def hook_with(fake, config, cid: str, annotations: dict, env: list[str]) -> int:
    bundle = fake.root / "bundle"
    bundle.mkdir(exist_ok=True)
    spec = {"annotations": annotations, "process": {"env": env}, "linux": {"cgroupsPath": "/c"}}
    (bundle / "config.json").write_text(json.dumps(spec))
    state = json.dumps({"id": cid, "bundle": str(bundle), "pid": 77}).encode()
    return hook_main.run(["--config", str(config), "prestart"], io.BytesIO(state))


@pytest.mark.parametrize(
    "annotations, env, tail",
    [({}, [f"NVIDIA_VISIBLE_DEVICES={BIG}"], "is not on this machine"),
     ({"numa-pin.io/pod": " " + BIG}, [], "is not a pod name"),
     ({"cdi.k8s.io/x": BIG}, [], "is not a CDI device name")],
    ids=["nvidia-visible-devices", "pod-annotation", "cdi-annotation"],
)
def test_a_huge_value_is_quoted_cut_and_its_reason_stays_explainable(node, capsys, annotations, env, tail):
    fake, config = node
    assert hook_with(fake, config, "big", annotations, env) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 2 * text.MAX_LINE
    assert "characters]" in err and "x" * (text.MAX_LINE + 1) not in err
    assert tail in err, "the value is cut where it is quoted: what is wrong with it still shows"
    path = Path(report.reason_path(str(fake.state_dir), "big"))
    assert path.stat().st_size <= report.MAX_REASON_BYTES
    assert cli_main(["explain", "big", "--config", str(config)]) == 0
    assert "error big: RequestError" in capsys.readouterr().out


def test_a_reason_file_fits_its_reader_whatever_it_is_given(tmp_path):
    """A 4 MB line of control characters (escaping quadruples it), a 10,000-character id and a
    large detail: the file is within what read_reason accepts, and read back for that id only."""
    state = str(tmp_path / "state")
    cid = "c" * 10_000
    path = report.write_reason(state, cid, "numa-pin: rejected: " + "\x01" * (4 << 20), {"kind": "k" * (1 << 20)})
    assert path is not None and os.path.getsize(path) <= report.MAX_REASON_BYTES
    doc = report.read_reason(state, cid)
    assert doc is not None and doc["line"].startswith("numa-pin: rejected: \\x01")
    assert report.read_reason(state, cid[:-1] + "d") is None
    assert list(report.read_reasons(state).values()) == [doc]


def test_a_reason_costs_no_scan_of_the_directory_and_the_bounds_hold(tmp_path, monkeypatch):
    """Thousands of refusals in a row (an NRI plugin adopting a busy node): the directory is listed
    once per :func:`report.prune_every` writes, not once per write, and never holds more than a
    twentieth over its bound."""
    monkeypatch.setattr(report, "MAX_REASONS", 200)
    state = str(tmp_path / "state")
    real, listed = os.listdir, []
    monkeypatch.setattr(report.os, "listdir", lambda path: listed.append(path) or real(path))
    most = 0
    for i in range(1000):
        assert report.write_reason(state, f"c{i}", f"numa-pin: rejected c{i}: x") is not None
        most = max(most, len(real(tmp_path / "state" / "reasons")))
    every = report.prune_every()
    assert every == 10 and len(listed) == 1000 // every
    assert report.MAX_REASONS < most <= report.MAX_REASONS + every
    assert report.read_reason(state, "c999") is not None


def test_the_reasons_directory_is_bounded_in_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MAX_REASONS_BYTES", 4000, raising=False)
    state = str(tmp_path / "state")
    for i in range(20):
        path = report.write_reason(state, f"c{i}", f"numa-pin: rejected c{i}: " + "y" * 500)
        assert path is not None
        os.utime(path, ns=(i * 10**9, i * 10**9))  # c0 is the oldest
    files = list((tmp_path / "state" / "reasons").iterdir())
    assert sum(p.stat().st_size for p in files) <= 4000
    kept = {json.loads(p.read_text())["container_id"] for p in files}
    assert "c19" in kept and "c0" not in kept and len(kept) > 1


def test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_prune_removes(tmp_path):
    import signal
    import subprocess
    import sys

    state = tmp_path / "state"
    report.reasons_dir(str(state))
    killed = subprocess.run(
        [sys.executable, "-c",
         "import os, signal, sys\nfrom numa_pin.base.safefs import create_private\n"
         "fd, tmp = create_private(sys.argv[1], '.reason.')\nos.write(fd, b'{\"container_id\": \"half')\n"
         "os.kill(os.getpid(), signal.SIGKILL)", str(state / "reasons")], timeout=60)
    assert killed.returncode == -signal.SIGKILL
    (left,) = [p for p in (state / "reasons").iterdir() if p.name.startswith(".reason.")]
    fresh = state / "reasons" / ".reason.fresh.tmp"  # a writer at work right now
    fresh.write_bytes(b"{")
    old = left.stat().st_mtime - 3600  # an hour: no writer takes that long
    os.utime(left, (old, old))
    for i in range(report.prune_every()):  # writes are counted; a prune comes once per so many
        assert report.write_reason(str(state), f"c{i}", f"numa-pin: rejected c{i}: x") is not None
    assert not left.exists() and fresh.exists()


def test_reconcile_removes_a_killed_writers_reason_file_when_no_rejection_follows(tmp_path):
    """Issue 36 (6): the temporary reason file of a writer killed mid-write goes with the next
    ``reconcile`` too, not only with the next rejection (which may never come); a file a writer
    is still at work on stays."""
    from numa_pin.base.safefs import create_private
    from numa_pin.config.schema import config_from_dict
    from numa_pin.service.node import NodeService

    fake = FakeNode(tmp_path / "node", machines=tmp_path / "machines")
    reasons = Path(report.reasons_dir(str(fake.state_dir)))
    paths = []
    for _ in range(2):
        fd, path = create_private(str(reasons), ".reason.")
        os.write(fd, b'{"container_id": "half')
        os.close(fd)
        paths.append(Path(path))
    dead, at_work = paths
    old = dead.stat().st_mtime - 3600
    os.utime(dead, (old, old))
    NodeService(config_from_dict(fake.config_dict())).reconcile()
    assert not dead.exists() and at_work.exists()
