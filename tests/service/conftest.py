"""Fixtures shared by the service tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from numa_pin.enforcer.devnodes import DeviceNode
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


@pytest.fixture(autouse=True)
def container_files(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[tuple[tuple[DeviceNode, ...], str | None, str | None]]]:
    """What a prestart admission makes inside a container (device nodes, the GPU list, the
    ``PCIDEVICE_*`` file) by pid, in place of the forked child that joins its mount namespace: the
    fake nodes' pids have none. Each call: (nodes, GPU list text, variables text)."""
    made: dict[int, list[tuple[tuple[DeviceNode, ...], str | None, str | None]]] = {}

    def create(pid: int | str, nodes: Sequence[DeviceNode], proc_root: str, rootfs: str | None, undo: object, *,
               gpu_text: str | None = None, env_text: str | None = None) -> tuple[str, ...]:
        made.setdefault(int(pid), []).append((tuple(nodes), gpu_text, env_text))
        return tuple(node.path for node in nodes)

    monkeypatch.setattr("numa_pin.enforcer.devnodes.create_device_nodes", create)
    return made
