"""``make stress``: the hostile-input fuzz of ``test_hook_fuzz.py`` for 10,000 cases.

Deselected unless ``NUMA_PIN_STRESS=1`` (tests/conftest.py). ``NUMA_PIN_STRESS_EXAMPLES`` sets
the number of cases; ``NUMA_PIN_STRESS_REPORT`` names a JSON file that receives the figures
(cases per input class, exit codes, slowest case).
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest
from hostile_cases import CASES, Hostile, assert_clean
from hypothesis import HealthCheck, given, settings
from test_hook_fuzz import WriteGuard

from numa_pin.testing.node import FakeNode

pytestmark = pytest.mark.stress
EXAMPLES = int(os.environ.get("NUMA_PIN_STRESS_EXAMPLES", "10000"))
FIGURES: dict = {"cases": 0, "by_class": collections.Counter(), "rc": collections.Counter(), "slowest_s": 0.0,
                 "slowest_case": None}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("stress")
    node = FakeNode(root / "node", "intel-2s-ht", parent="")
    node.add_container("c", 4242)
    config = node.write_config(policy="single-numa-node")
    yield Hostile(node, config, root / "outside")
    FIGURES["by_class"] = dict(FIGURES["by_class"])
    FIGURES["rc"] = {str(k): v for k, v in sorted(FIGURES["rc"].items())}
    report = os.environ.get("NUMA_PIN_STRESS_REPORT")
    text = json.dumps(FIGURES, indent=1, default=repr)
    if report:
        with open(report, "w", encoding="utf-8") as fp:
            fp.write(text + "\n")
    print(f"\nstress figures: {text}")


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=CASES)
def test_stress_hostile_inputs(hostile, case, monkeypatch, capsys):
    started = time.perf_counter()
    rc, err = hostile.run(case, WriteGuard, monkeypatch, capsys)
    took = time.perf_counter() - started
    assert_clean(case, rc, err)
    FIGURES["cases"] += 1
    FIGURES["by_class"][case[0]] += 1
    FIGURES["rc"][rc] += 1
    if took > FIGURES["slowest_s"]:
        FIGURES["slowest_s"], FIGURES["slowest_case"] = round(took, 3), repr(case)[:200]
