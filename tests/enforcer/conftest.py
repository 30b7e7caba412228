"""Fixtures for the enforcer tests (the fakes themselves live in enforcer_fakes.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from enforcer_fakes import FakeCgroupTree, FakeKernel, FakeProc

from numa_pin.enforcer import cgroups


@pytest.fixture
def fake_proc(tmp_path: Path) -> FakeProc:
    root = tmp_path / "proc"
    root.mkdir()
    return FakeProc(root)


@pytest.fixture
def cgroup_root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    return root


@pytest.fixture
def v1_tree(cgroup_root: Path) -> FakeCgroupTree:
    return FakeCgroupTree(cgroup_root, 1)


@pytest.fixture
def v2_tree(cgroup_root: Path) -> FakeCgroupTree:
    return FakeCgroupTree(cgroup_root, 2)


@pytest.fixture
def kernel_factory(monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeCgroupTree], FakeKernel]:
    """``kernel_factory(tree)`` installs a FakeKernel for ``tree`` as the cgroup writer."""

    def make(tree: FakeCgroupTree) -> FakeKernel:
        k = FakeKernel(tree)
        monkeypatch.setattr(cgroups, "write_cgroup_file", k)
        return k

    return make


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A sleeping child process, killed and reaped afterwards."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
