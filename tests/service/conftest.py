"""Fixtures shared by the service tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.testing.node import FakeNode


@pytest.fixture
def hook_node(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    """The kit's intel-2s-ht node for in-process hooks (no agent, a private cache, no kubelet),
    with its config written as ``fake.config`` (restricted policy)."""
    monkeypatch.setenv("NUMA_PIN_NO_AGENT", "1")
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    fake.config = fake.write_config(policy="restricted", kubelet_root=str(tmp_path / "no-kubelet"))
    return fake
