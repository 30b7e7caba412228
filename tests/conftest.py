"""Suite-wide settings.

Hypothesis runs deterministically (derandomized, no example database) and without per-example
deadlines, so a busy CI machine cannot turn a slow example into a failure. Tests that need more
examples or other health checks set them explicitly on top of this profile.

Test tiers (markers, registered in pyproject.toml): ``root`` tests write real cgroups, network
namespaces or devices and are skipped for other users; ``e2e`` drives real runtimes and ``vm``
boots a multi-NUMA guest (both need root as well). ``make test-fast`` deselects all three.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "numa-pin",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("numa-pin")


def pytest_collection_modifyitems(config, items):
    """Every e2e or vm test needs root too: give it the ``root`` marker."""
    for item in items:
        if item.get_closest_marker("e2e") or item.get_closest_marker("vm"):
            item.add_marker(pytest.mark.root)


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (tier 'root': real cgroups, namespaces, runtimes)")
