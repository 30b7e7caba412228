"""Suite-wide settings.

Hypothesis runs deterministically (derandomized, no example database) and without per-example
deadlines, so a busy CI machine cannot turn a slow example into a failure. Tests that need more
examples or other health checks set them explicitly on top of this profile.

Test tiers (markers, registered in pyproject.toml): ``root`` tests write real cgroups, network
namespaces or devices and are skipped for other users; ``@pytest.mark.root`` (on a test, a module's
``pytestmark`` or a ``pytest.param``) is the one way a test says it needs root, and no test checks
``os.geteuid()`` to skip itself. ``e2e`` drives real runtimes and ``vm`` boots a multi-NUMA guest
(both need root as well); ``browser`` opens a page in Debian's headless chromium (skipped without
it). ``make test-fast`` deselects all four. ``stress`` tests run only with ``NUMA_PIN_STRESS=1``
(``make stress``), ``image`` tests (the container image built and run) only with
``NUMA_PIN_IMAGE_TEST=1`` (``make image-test``).

A hook that finds no agent starts one (``numa-pin serve --idle-exit``). Hooks that inherit the
test process's environment do not (``NUMA_PIN_AGENT_AUTOSTART=0``), so a test never leaves an
agent behind by accident; tests of the on-demand agent turn it back on, and hooks a real runtime
runs with their own environment (e2e) get the default, as on a node.
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
os.environ.setdefault("NUMA_PIN_AGENT_AUTOSTART", "0")


def pytest_collection_modifyitems(config, items):
    """Every e2e, vm or image test needs root too: give it the ``root`` marker. ``stress`` tests
    (long fuzz runs, ``make stress``) are deselected unless ``NUMA_PIN_STRESS=1``, ``image`` tests
    (minutes, ``make image-test``) unless ``NUMA_PIN_IMAGE_TEST=1``."""
    for item in items:
        if item.get_closest_marker("e2e") or item.get_closest_marker("vm") or item.get_closest_marker("image"):
            item.add_marker(pytest.mark.root)
    for marker, variable in (("stress", "NUMA_PIN_STRESS"), ("image", "NUMA_PIN_IMAGE_TEST")):
        if os.environ.get(variable) == "1":
            continue
        chosen = [item for item in items if item.get_closest_marker(marker)]
        if chosen:
            config.hook.pytest_deselected(items=chosen)
            items[:] = [item for item in items if not item.get_closest_marker(marker)]


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and os.geteuid() != 0:
        pytest.skip("needs root (tier 'root': real cgroups, namespaces, runtimes)")
