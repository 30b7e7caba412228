"""``open_service``: the one way every entry point builds the node service."""

from __future__ import annotations

import pytest

from numa_pin.config import Config
from numa_pin.service.node import NodeService, open_service

# (id, cache directory, topology max age given)
SERVICES = [("cli", None, None), ("hook", "cache", None), ("rehearsal", "cache", 30.0)]


@pytest.mark.parametrize(("cache", "max_age"), [s[1:] for s in SERVICES], ids=[s[0] for s in SERVICES])
def test_open_service_builds_what_the_constructor_builds(tmp_path, cache, max_age):
    config = Config(state_dir=str(tmp_path / "state"))
    cache_dir = None if cache is None else str(tmp_path / cache)
    extra = {} if max_age is None else {"topology_max_age": max_age}
    built, made = open_service(config, cache_dir, **extra), NodeService(config, cache_dir, **extra)
    assert type(built) is NodeService
    assert (built.config, built.cache_dir, built.topology_max_age) == (made.config, made.cache_dir,
                                                                       made.topology_max_age)
