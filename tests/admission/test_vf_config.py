"""``numa-pin.io/vf-config``: sriov-cni's VF settings read from annotations, refused in one line
naming the annotation, and kept on the grant."""

import pytest

from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant
from numa_pin.policy.hint import TopologyHint
from numa_pin.requests.request import request_from_oci
from numa_pin.requests.vfconfig import describe, parse_vf_config
from numa_pin.resources.base import Decision, grant_from

ANN = "numa-pin.io/vf-config"


def decision(cid: str) -> Decision:
    return Decision(cid, True, "none", "container", TopologyHint(None, True))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("vlan=100,vlanQoS=3,mac=02:00:5E:00:00:07,spoofchk=off,trust=on,min_tx_rate=10,max_tx_rate=1000,"
         "link_state=enable",
         {"vlan": 100, "vlanQoS": 3, "mac": "02:00:5e:00:00:07", "spoofchk": False, "trust": True,
          "min_tx_rate": 10, "max_tx_rate": 1000, "link_state": "enable"}),
        (" vlan = 4094 , ", {"vlan": 4094}),
        ("vlan=0,vlanQoS=0", {"vlan": 0, "vlanQoS": 0}),
        ("min_tx_rate=100,max_tx_rate=0", {"min_tx_rate": 100, "max_tx_rate": 0}),
        ("link_state=auto", {"link_state": "auto"}),
        ("", {}),
    ],
    ids=["everything", "blanks-and-empty-parts", "untagged", "max-zero-is-no-limit", "link-auto", "empty"],
)
def test_parse(text: str, expected: dict) -> None:
    assert parse_vf_config(text) == expected


@pytest.mark.parametrize(
    "text, match",
    [
        ("vlan=4095", "vlan must be an integer from 0 to 4094"),
        ("vlan=-1", "vlan must be an integer"),
        ("vlan=1e2", "vlan must be an integer"),
        ("vlan=100,vlanQoS=8", "vlanQoS must be an integer from 0 to 7"),
        ("vlanQoS=1", "vlanQoS needs a vlan"),
        ("vlan=0,vlanQoS=2", "non-zero vlanQoS needs a non-zero vlan"),
        ("mac=01:00:5e:00:00:01", "multicast"),
        ("mac=00:00:00:00:00:00", "not an address"),
        ("mac=02:00:5e:00:07", "six hex octets"),
        ("mac=02-00-5e-00-00-07", "six hex octets"),
        ("spoofchk=yes", "spoofchk must be on or off"),
        ("trust=1", "trust must be on or off"),
        ("link_state=up", "link_state must be one of auto, enable, disable"),
        ("min_tx_rate=2000,max_tx_rate=1000", "min_tx_rate 2000 is above max_tx_rate 1000"),
        ("max_tx_rate=4294967295", "max_tx_rate must be an integer"),
        ("vlan=1,vlan=2", "given twice"),
        ("vlan_qos=1", "unknown VF setting"),
        ("trust", "expected key=value"),
        ("vlan=1," * 100, "longer than"),
    ],
    ids=["vlan-too-big", "vlan-negative", "vlan-float", "qos-too-big", "qos-alone", "qos-untagged",
         "mac-multicast", "mac-zero", "mac-short", "mac-dashes", "spoofchk-word", "trust-digit", "link-word",
         "min-above-max", "rate-u32-max", "twice", "unknown-key", "no-value", "too-long"],
)
def test_refused_in_one_line_naming_the_annotation(text: str, match: str) -> None:
    with pytest.raises(RequestError, match=match) as info:
        request_from_oci("c1", {ANN: text, "numa-pin.io/devices": "intel.com/sriov=1"})
    assert info.value.annotation == ANN and str(info.value).startswith(ANN + ": ")
    assert "\n" not in str(info.value)


def test_describe_writes_what_parse_reads() -> None:
    text = "vlan=100,vlanQoS=3,mac=02:00:5e:00:00:07,spoofchk=off,trust=on,min_tx_rate=10,max_tx_rate=1000,link_state=enable"
    assert describe(parse_vf_config(text)) == text


@pytest.mark.parametrize(
    "annotations, name, expected",
    [
        ({ANN: "vlan=10"}, "app", {"vlan": 10}),
        ({ANN: "vlan=10", ANN + ".app": "trust=on"}, "app", {"trust": True}),
        ({ANN: "vlan=10", ANN + ".app": "trust=on"}, "side", {"vlan": 10}),
        ({ANN + ".app": "trust=on"}, "side", {}),
        ({}, "app", {}),
    ],
    ids=["pod-wide", "per-container-replaces", "other-container-keeps-plain", "other-container-only", "none"],
)
def test_per_container_form(annotations: dict, name: str, expected: dict) -> None:
    req = request_from_oci("c1", {**annotations, "io.kubernetes.cri.container-name": name})
    assert dict(req.vf_config) == expected


def test_the_sandbox_asks_nothing() -> None:
    """Kubernetes copies the pod's annotations into the pause container, which gets no VF."""
    req = request_from_oci("sb", {ANN: "vlan=10", "io.kubernetes.cri.container-type": "sandbox"})
    assert req.sandbox and dict(req.vf_config) == {}


def test_kept_on_the_grant_and_only_when_asked() -> None:
    req = request_from_oci("c1", {ANN: "vlan=10,trust=on,link_state=disable"})
    grant = grant_from(req, decision("c1"), pid=1, start_time=1.0, cgroup="/c1", kind=None, created=1.0)
    out = grant.to_dict()
    assert out["vf_config"] == {"vlan": 10, "trust": True, "link_state": "disable"}
    assert Grant.from_dict(out) == grant and dict(Grant.from_dict(out).vf_config) == out["vf_config"]
    plain = grant_from(request_from_oci("c2", {}), decision("c2"), pid=1, start_time=1.0, cgroup="/c2", kind=None,
                       created=1.0)
    assert "vf_config" not in plain.to_dict()


@pytest.mark.parametrize(
    "vf_config",
    [{"vlan": "10"}, {"trust": 1}, {"vlan": True}, {"vlan_qos": 1}, {"mac": ""}, {"max_tx_rate": 1 << 32}],
    ids=["vlan-string", "trust-int", "vlan-bool", "unknown", "empty-mac", "rate-too-big"],
)
def test_the_ledger_refuses_a_malformed_one(vf_config: dict) -> None:
    grant = grant_from(request_from_oci("c1", {}), decision("c1"), pid=1, start_time=1.0, cgroup="/c1", kind=None,
                       created=1.0)
    with pytest.raises(Exception, match="vf_config"):
        Grant.from_dict({**grant.to_dict(), "vf_config": vf_config})
