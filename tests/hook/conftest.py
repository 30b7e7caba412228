"""The fake node most hook tests run on: the kit's laptop, container ``c`` with pid 77 in cgroup
``/c``, policy restricted; ``(node, config path)``. A test module may define its own ``node``."""

from __future__ import annotations

import pytest

from numa_pin.testing.node import FakeNode


@pytest.fixture
def node(tmp_path, monkeypatch):
    fake = FakeNode(tmp_path, "laptop", parent="")
    fake.add_container("c", 77)
    monkeypatch.setenv("NUMA_PIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMA_PIN_DEBUG", raising=False)
    return fake, fake.write_config(settled=False, policy="restricted")
