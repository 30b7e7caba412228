"""The deb's prerm folds the ledger's journal before a downgrade (issue 34, "every path").

dpkg runs the installed package's prerm with ``upgrade <new version>``; when that version is older
(``dpkg --compare-versions``, Debian's own ordering: ``~rc1`` sorts before the release) the
prerm runs ``numa-pin recover --fold``, so that a release from before the journal reads the whole
ledger. The script is the one in ``packaging/deb`` with its version put in as
``packaging/scripts/build-deb.sh`` does (the same ``sed``), run by ``sh`` with ``numa-pin`` and
``py3clean`` in front on ``PATH``: a stub that records its arguments, or the real CLI on a ledger
in a temporary state directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from numa_pin.ledger import store
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.ledger.store import JOURNAL_FILE, LEDGER_FILE, Ledger

pytestmark = pytest.mark.skipif(shutil.which("dpkg") is None, reason="the prerm compares versions with dpkg")

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _prerm(tmp_path: Path) -> Path:
    """``packaging/deb/prerm`` with its version put in by the build script's own ``sed`` line."""
    build = (REPO / "packaging/scripts/build-deb.sh").read_text()
    assert 'sed "s/@VERSION@/$version/g" "$pk/deb/$f"' in build, "the build no longer substitutes the version"
    script = tmp_path / "prerm"
    done = subprocess.run(["sed", f"s/@VERSION@/{VERSION}/g", str(REPO / "packaging/deb/prerm")],
                          capture_output=True, check=True, text=True)
    assert "@VERSION@" not in done.stdout
    script.write_text(done.stdout)
    return script


def _stubs(tmp_path: Path, numa_pin: str) -> dict[str, str]:
    """``PATH`` with ``numa-pin`` (the shell text ``numa_pin``) and a no-op ``py3clean`` in front."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("numa-pin", numa_pin), ("py3clean", "exit 0\n")):
        (bin_dir / name).write_text("#!/bin/sh\n" + text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}


def _run(script: Path, args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(script), *args], env=env, capture_output=True, text=True, timeout=120)


#: (id, the prerm's arguments, whether it folds)
CALLS = [
    ("downgrade", ("upgrade", "0.0.9"), True),
    ("downgrade-to-a-prerelease", ("upgrade", f"{VERSION}~rc1"), True),
    ("reinstall", ("upgrade", VERSION), False),
    ("upgrade", ("upgrade", f"{VERSION}.1"), False),
    ("remove", ("remove",), False),
    ("deconfigure", ("deconfigure", "in-favour", "other", "1.0"), False),
]


@pytest.mark.parametrize(("args", "folds"), [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_the_prerm_folds_only_before_a_downgrade(tmp_path: Path, args: tuple[str, ...], folds: bool) -> None:
    calls = tmp_path / "calls"
    env = _stubs(tmp_path, f'echo "$*" >>{calls}\n')
    got = _run(_prerm(tmp_path), args, env)
    assert got.returncode == 0, got.stderr
    assert (calls.read_text().splitlines() if calls.exists() else []) == (["recover --fold"] if folds else [])


def test_a_fold_that_fails_fails_the_downgrade_saying_why(tmp_path: Path) -> None:
    env = _stubs(tmp_path, 'echo "numa-pin: LedgerLockTimeout: held" >&2\nexit 1\n')
    got = _run(_prerm(tmp_path), ("upgrade", "0.0.9"), env)
    assert got.returncode == 1
    assert "LedgerLockTimeout" in got.stderr and "numa-pin recover --fold" in got.stderr


def _real_cli(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state_dir}\n")
    env = _stubs(tmp_path, f'exec {sys.executable} -m numa_pin.cli.main "$@"\n')
    return {**env, "PYTHONPATH": str(REPO / "src"), "NUMA_PIN_CONFIG": str(config)}


def test_a_downgrade_leaves_one_version_4_snapshot_of_the_whole_ledger(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "JOURNAL_FROM_BYTES", 0)
    state_dir = tmp_path / "state"
    ledger = Ledger(state_dir)
    with ledger.transaction() as txn:
        txn.state = LedgerState({f"c{n}": Grant(f"c{n}", "pod", f"app{n}", "shared") for n in range(12)})
    for n in range(50, 53):
        with ledger.transaction() as txn:
            txn.put(Grant(f"c{n}", "pod", f"app{n}", "shared"))
    assert (state_dir / JOURNAL_FILE).read_bytes().count(b"\n") >= 1  # the last commits are in the journal
    got = _run(_prerm(tmp_path), ("upgrade", "0.0.9"), _real_cli(tmp_path, state_dir))
    assert got.returncode == 0, got.stderr
    assert not (state_dir / JOURNAL_FILE).exists()
    doc = json.loads((state_dir / LEDGER_FILE).read_bytes())  # what a release from before the journal checks
    canonical = json.dumps(doc["data"], sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    assert doc["version"] == doc["data"]["version"] == 4
    assert doc["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert sorted(doc["data"]["grants"]) == sorted(txn.state.grants)
    assert LedgerState.from_dict(doc["data"]) == txn.state


def test_a_downgrade_without_a_ledger_succeeds_and_makes_none(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    got = _run(_prerm(tmp_path), ("upgrade", "0.0.9"), _real_cli(tmp_path, state_dir))
    assert got.returncode == 0, got.stderr
    assert not state_dir.exists()
