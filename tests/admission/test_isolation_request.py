"""Isolation requests: CRI-O's annotation names and values, numa-pin's own, node defaults, refusals."""

import pytest

from numa_pin.config.schema import config_from_dict
from numa_pin.errors import ConfigError, RequestError
from numa_pin.ledger.model import Grant, LedgerState
from numa_pin.requests import isolation as iso
from numa_pin.requests.request import request_from_oci

CPUS = {"numa-pin.io/cpus": "2"}
SANDBOX = {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": "p1"}


@pytest.mark.parametrize(
    "annotations, fields",
    [
        ({"cpu-load-balancing.crio.io": "disable"}, {"load_balancing": "disable"}),
        ({"cpu-load-balancing.crio.io": "enable"}, {}),
        ({"cpu-quota.crio.io": "disable"}, {"quota": "disable"}),
        ({"irq-load-balancing.crio.io": "disable"}, {"irq": "disable"}),
        ({"irq-load-balancing.crio.io": "housekeeping"}, {"irq": "housekeeping"}),
        ({"irq-load-balancing.crio.io": "enable"}, {}),
        ({"cpu-c-states.crio.io": "enable"}, {"c_states": "enable"}),
        ({"cpu-c-states.crio.io": "disable"}, {"c_states": "disable"}),
        ({"cpu-c-states.crio.io": "max_latency:10"}, {"c_states": "max_latency:10"}),
        ({"cpu-c-states.crio.io": "max_latency:010"}, {"c_states": "max_latency:10"}),
        ({"cpu-freq-governor.crio.io": "performance"}, {"governor": "performance"}),
        ({"numa-pin.io/cpu-quota": "disable"}, {"quota": "disable"}),
        ({"numa-pin.io/irq-load-balancing": "housekeeping"}, {"irq": "housekeeping"}),
        ({"numa-pin.io/host-services": "disable"}, {"host": True}),
        ({"numa-pin.io/host-services": "enable"}, {}),
        ({"cpu-quota.crio.io": "disable", "numa-pin.io/cpu-quota": "disable"}, {"quota": "disable"}),
        ({"cpu-quota.crio.io": " disable "}, {"quota": "disable"}),
    ],
    ids=["lb-disable", "lb-enable", "quota", "irq-disable", "irq-housekeeping", "irq-enable", "cstates-enable",
         "cstates-disable", "cstates-max", "cstates-max-leading-zero", "governor", "np-quota", "np-irq",
         "np-host", "np-host-enable", "both-names-agree", "blanks"],
)
def test_annotations_ask(annotations, fields):
    req = request_from_oci("c1", {**CPUS, **annotations})
    assert req.isolation.asked() == fields
    assert iso.from_dict(req.isolation.to_dict()) == req.isolation


@pytest.mark.parametrize(
    "annotations, bad_key",
    [
        ({"cpu-load-balancing.crio.io": "off"}, "cpu-load-balancing.crio.io"),
        ({"cpu-quota.crio.io": "Disable"}, "cpu-quota.crio.io"),
        ({"irq-load-balancing.crio.io": "true"}, "irq-load-balancing.crio.io"),
        ({"cpu-c-states.crio.io": "max_latency:"}, "cpu-c-states.crio.io"),
        ({"cpu-c-states.crio.io": "max_latency:-1"}, "cpu-c-states.crio.io"),
        ({"cpu-c-states.crio.io": "max_latency:99999999999"}, "cpu-c-states.crio.io"),
        ({"cpu-c-states.crio.io": "max_latency:1e3"}, "cpu-c-states.crio.io"),
        ({"cpu-freq-governor.crio.io": "../../x"}, "cpu-freq-governor.crio.io"),
        ({"cpu-freq-governor.crio.io": ""}, "cpu-freq-governor.crio.io"),
        ({"cpu-freq-governor.crio.io": "p" * 16}, "cpu-freq-governor.crio.io"),
        ({"numa-pin.io/host-services": "yes"}, "numa-pin.io/host-services"),
        ({"cpu-quota.crio.io": "disable", "numa-pin.io/cpu-quota": "enable"}, "numa-pin.io/cpu-quota"),
        ({"numa-pin.io/cpu-quota.app": "disable"}, "numa-pin.io/cpu-quota.app"),
    ],
    ids=["lb-word", "case", "irq-bool", "max-empty", "max-negative", "max-huge", "max-float", "gov-path",
         "gov-empty", "gov-long", "host-word", "names-disagree", "per-container"],
)
def test_bad_values_are_refused_naming_the_annotation(annotations, bad_key):
    with pytest.raises(RequestError) as err:
        request_from_oci("c1", {**CPUS, **annotations})
    assert err.value.annotation == bad_key
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "annotations",
    [{"cpu-quota.crio.io": "disable"}, {"cpu-c-states.crio.io": "enable"}, {"numa-pin.io/host-services": "disable"},
     {"irq-load-balancing.crio.io": "housekeeping"}, {"cpu-freq-governor.crio.io": "performance"}],
    ids=["quota", "cstates", "host", "irq", "governor"],
)
def test_a_shared_container_is_refused(annotations):
    with pytest.raises(RequestError, match="exclusive CPUs only") as err:
        request_from_oci("c1", annotations)
    assert err.value.annotation == next(iter(annotations))


@pytest.mark.parametrize(
    "annotations",
    [{"cpu-quota.crio.io": "enable"}, {"irq-load-balancing.crio.io": "enable"},
     {"numa-pin.io/host-services": "enable"}, {**SANDBOX, "cpu-quota.crio.io": "disable"}],
    ids=["quota-enable", "irq-enable", "host-enable", "sandbox"],
)
def test_what_asks_nothing_passes_on_a_shared_container(annotations):
    assert request_from_oci("c1", annotations).isolation.empty


def test_node_defaults_fill_what_the_annotations_leave_out():
    cfg = config_from_dict({"isolation": {"quota": "disable", "c_states": "max_latency:5", "host": True,
                                          "governor": "performance"}})
    req = request_from_oci("c1", {**CPUS, "cpu-c-states.crio.io": "disable", "numa-pin.io/host-services": "enable"},
                           isolation=cfg.isolation)
    assert req.isolation == iso.IsolationRequest(quota="disable", c_states="disable", governor="performance")
    # the defaults never reach (or refuse) a container without exclusive CPUs
    assert request_from_oci("c2", {}, isolation=cfg.isolation).isolation.empty


@pytest.mark.parametrize(
    "section, key",
    [({"quota": "off"}, "isolation.quota"), ({"c_states": 5}, "isolation.c_states"),
     ({"isolated_cpus": "always"}, "isolation.isolated_cpus"), ({"host": "yes"}, "isolation.host"),
     ({"irq": "housekeep"}, "isolation.irq")],
    ids=["quota", "cstates-int", "isolated", "host", "irq"],
)
def test_bad_node_defaults_are_config_errors(section, key):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"isolation": section})
    assert err.value.key == key


@pytest.mark.parametrize(
    "c_states, written",
    [("enable", "0"), ("disable", "n/a"), ("max_latency:20", "20")],
    ids=["enable", "disable", "max"],
)
def test_c_states_map_to_crio_resume_latency_values(c_states, written):
    assert iso.IsolationRequest(c_states=c_states).latency_us == written


def test_the_grant_keeps_the_request_through_the_ledger():
    from numa_pin.admission.decide import decide
    from numa_pin.resources.base import NodeSettings, grant_from
    from numa_pin.testing import machine, shapes

    req = request_from_oci("c1", {**CPUS, "irq-load-balancing.crio.io": "housekeeping",
                                  "cpu-load-balancing.crio.io": "disable"})
    decision = decide(machine.expected_topology(shapes.SHAPES["laptop"]()), LedgerState(), req, NodeSettings())
    grant = grant_from(req, decision, pid=None, start_time=None, cgroup=None, kind=None, created=1.0)
    again = LedgerState.from_dict(LedgerState({"c1": grant}).to_dict()).grants["c1"]
    assert iso.of_grant(again) == req.isolation
    assert (iso.of_grant(again).irq, iso.of_grant(again).load_balancing) == ("housekeeping", "disable")
    assert iso.of_grant(again.as_shared()).empty
    # a grant without the key (an older ledger) asks nothing
    plain = {**again.to_dict()}
    del plain["isolation"]
    assert iso.of_grant(Grant.from_dict(plain)).empty
