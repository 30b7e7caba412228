"""Mixed CPUs (issue 40): ``numa-pin.io/cpu-shared`` and CRI-O's ``cpu-shared.crio.io/<container>``.

A container with exclusive CPUs that asks for the shared pool keeps its exclusive CPUs in the
ledger (no one else is granted them, the pool leaves them out) and runs on them and the pool in
one cpuset, which follows the pool as the shared containers' does; the runtime edit carries that
cpuset and the two lists under CRI-O's variable names and numa-pin's. The oracle of the pool is
the kit's CPUs minus every exclusive grant (no CPUs are reserved in these configs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.base.cpuset import format_list, parse_list
from numa_pin.config.schema import config_from_dict
from numa_pin.errors import PathLimitError, RequestError
from numa_pin.ledger.model import Grant
from numa_pin.requests.request import request_from_oci
from numa_pin.resources.base import path_refusal
from numa_pin.resources.node import cpu as cpu_node
from numa_pin.resources.node.isolation import preview
from numa_pin.resources.runtime import NRI, PRESTART, RUN, precreate_target
from numa_pin.service.node import NodeService
from numa_pin.testing.node import FakeNode

NAME = "io.kubernetes.cri.container-name"


# ---- the request ----------------------------------------------------------------------------

PARSE = [
    ("crio-enable", {"numa-pin.io/cpus": "2", "cpu-shared.crio.io/app": "enable"}, True),
    ("numa-pin-true", {"numa-pin.io/cpus": "2", "numa-pin.io/cpu-shared": "true"}, True),
    ("numa-pin-enable", {"numa-pin.io/cpus": "2", "numa-pin.io/cpu-shared": "enable"}, True),
    ("both-agree", {"numa-pin.io/cpus": "2", "numa-pin.io/cpu-shared": "true", "cpu-shared.crio.io/app": "enable"},
     True),
    ("crio-disable", {"numa-pin.io/cpus": "2", "cpu-shared.crio.io/app": "disable"}, None),
    ("numa-pin-false", {"numa-pin.io/cpus": "2", "numa-pin.io/cpu-shared": "false"}, None),
    ("another-containers-key", {"numa-pin.io/cpus": "2", "cpu-shared.crio.io/sidecar": "enable"}, None),
    ("crio-bare-prefix", {"numa-pin.io/cpus": "2", "cpu-shared.crio.io": "enable"}, None),
    ("shared-container-says-disable", {"cpu-shared.crio.io/app": "disable"}, None),
]


@pytest.mark.parametrize("annotations, want", [p[1:] for p in PARSE], ids=[p[0] for p in PARSE])
def test_the_request_reads_both_names(annotations, want) -> None:
    request = request_from_oci("c1", {NAME: "app", **annotations})
    assert request.isolation.shared is want
    assert request.isolation.words() == (["cpu-shared=enable"] if want else [])


REFUSED = [
    ("crio-without-exclusive-cpus", {"numa-pin.io/memory": "64Mi", "cpu-shared.crio.io/app": "enable"},
     "cpu-shared.crio.io/app", "applies to exclusive CPUs only"),
    ("numa-pin-without-cpus", {"numa-pin.io/cpu-shared": "true"}, "numa-pin.io/cpu-shared",
     "applies to exclusive CPUs only"),
    ("bad-value", {"numa-pin.io/cpus": "1", "cpu-shared.crio.io/app": "yes"}, "cpu-shared.crio.io/app",
     "unknown value"),
    ("names-disagree", {"numa-pin.io/cpus": "1", "cpu-shared.crio.io/app": "enable", "numa-pin.io/cpu-shared": "false"},
     "numa-pin.io/cpu-shared", "disagrees"),
    ("with-load-balancing-off", {"numa-pin.io/cpus": "1", "cpu-shared.crio.io/app": "enable",
                                 "cpu-load-balancing.crio.io": "disable"}, "cpu-shared.crio.io/app", "partition"),
    ("per-container-numa-pin-form", {"numa-pin.io/cpus": "1", "numa-pin.io/cpu-shared.app": "true"},
     "numa-pin.io/cpu-shared.app", "unknown annotation"),
]


@pytest.mark.parametrize("annotations, key, why", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_request_it_cannot_mean_is_refused_in_one_line(annotations, key, why) -> None:
    with pytest.raises(RequestError) as caught:
        request_from_oci("c1", {NAME: "app", **annotations})
    assert caught.value.annotation == key and why in str(caught.value) and "\n" not in str(caught.value)


def test_the_sandbox_that_carries_the_pods_annotations_is_not_refused() -> None:
    request = request_from_oci("s", {"numa-pin.io/cpu-shared": "true", "io.kubernetes.cri.container-type": "sandbox"})
    assert request.sandbox and request.isolation.shared is None


@pytest.mark.parametrize("target, refused", [(RUN, True), (PRESTART, False), (NRI, False),
                                             (precreate_target(False, False), False)],
                         ids=["run", "prestart", "nri", "precreate"])
def test_only_run_cannot_carry_it(target, refused) -> None:
    request = request_from_oci("c1", {"numa-pin.io/cpus": "1", "numa-pin.io/cpu-shared": "true"})
    if refused:
        with pytest.raises(PathLimitError, match="numa-pin.io/cpu-shared"):
            path_refusal([cpu_node.CpuNode()], request, target)
    else:
        path_refusal([cpu_node.CpuNode()], request, target)


def test_the_ledger_keeps_it() -> None:
    grant = Grant("c1", "p", "app", "exclusive", cpus=frozenset({2, 3}), isolation={"shared": True})
    assert Grant.from_dict(grant.to_dict()).isolation == {"shared": True}
    with pytest.raises(ValueError, match="isolation.shared"):
        Grant("c1", "p", "app", "exclusive", cpus=frozenset({2}), isolation={"shared": "enable"})


# ---- the grant and its cpuset on a node -------------------------------------------------------

@pytest.fixture
def node(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeNode, NodeService]:
    fake = FakeNode(tmp_path / "n", "intel-2s-ht", machines=tmp_path_factory.getbasetemp() / "machines")
    return fake, NodeService(config_from_dict(fake.config_dict(policy="restricted")))


def cpus_of(d: Path) -> frozenset[int]:
    return parse_list((d / "cpuset.cpus").read_text())


def admit(svc: NodeService, fake: FakeNode, cid: str, pid: int, annotations: dict[str, str]) -> Grant:
    return svc.admit(request_from_oci(cid, annotations), fake.add_container(cid, pid)).grant


MIXED = {"numa-pin.io/cpus": "2", "numa-pin.io/cpu-shared": "true"}


def test_the_exclusive_cpus_stay_exclusive_and_the_cpuset_follows_the_pool(node) -> None:
    fake, svc = node
    everything = parse_list(fake.cpus)
    shared = admit(svc, fake, "s", 100, {})
    m = admit(svc, fake, "m", 101, MIXED)
    nested = fake.cgroup_dir("m") / "inner"  # a runtime nested in it: it follows with it
    nested.mkdir()
    for name in ("cpuset.cpus", "cpuset.mems"):
        (nested / name).write_text((fake.cgroup_dir("m") / name).read_text())
    assert m.kind == "exclusive" and len(m.cpus) == 2 and m.isolation == {"shared": True}
    assert svc.ledger.read().exclusive_cpus() == m.cpus
    assert cpus_of(fake.cgroup_dir("m")) == everything  # its own two and the pool (everything else)
    assert cpus_of(fake.cgroup_dir("s")) == everything - m.cpus  # the shared one never gets them

    x = admit(svc, fake, "x", 102, {"numa-pin.io/cpus": "4"})  # the pool shrinks under it
    assert not x.cpus & m.cpus
    pool = everything - m.cpus - x.cpus
    assert cpu_node.shared_pool(svc, svc.ledger.read()) == pool
    assert cpus_of(fake.cgroup_dir("m")) == cpus_of(nested) == m.cpus | pool
    assert cpus_of(fake.cgroup_dir("x")) == x.cpus
    assert cpus_of(fake.cgroup_dir("s")) == pool

    svc.release("x")  # and grows back
    assert cpus_of(fake.cgroup_dir("m")) == cpus_of(nested) == everything
    assert cpus_of(fake.cgroup_dir("s")) == everything - m.cpus

    svc.release("m")  # its exclusive CPUs go back to the pool
    assert cpus_of(fake.cgroup_dir("s")) == everything
    assert shared.kind == "shared"


def test_two_mixed_containers_never_share_their_exclusive_cpus(node) -> None:
    fake, svc = node
    everything = parse_list(fake.cpus)
    a = admit(svc, fake, "a", 100, MIXED)
    b = admit(svc, fake, "b", 101, MIXED)
    assert not a.cpus & b.cpus
    assert cpus_of(fake.cgroup_dir("a")) == everything - b.cpus
    assert cpus_of(fake.cgroup_dir("b")) == everything - a.cpus


def test_reconcile_puts_back_a_mixed_cpuset_that_drifted(node) -> None:
    fake, svc = node
    m = admit(svc, fake, "m", 101, MIXED)
    (fake.cgroup_dir("m") / "cpuset.cpus").write_text(format_list(m.cpus) + "\n")
    svc.reconcile()
    assert cpus_of(fake.cgroup_dir("m")) == parse_list(fake.cpus)


@pytest.mark.parametrize("request_known", [True, False], ids=["create", "update"])
def test_the_runtime_edit_carries_the_cpuset_and_both_lists(node, request_known) -> None:
    fake, svc = node
    request = request_from_oci("m", MIXED)
    m = svc.admit(request, None, target=NRI).grant
    pool = parse_list(fake.cpus) - m.cpus
    edit = svc.runtime_edit(m, request if request_known else None, NRI)
    assert edit.cpus == m.cpus | pool and edit.mems == m.mems
    assert edit.env == {"OPENSHIFT_ISOLATED_CPUS": format_list(m.cpus), "NUMA_PIN_EXCLUSIVE_CPUS": format_list(m.cpus),
                        "OPENSHIFT_SHARED_CPUS": format_list(pool), "NUMA_PIN_SHARED_CPUS": format_list(pool)}
    plain = svc.admit(request_from_oci("e", {"numa-pin.io/cpus": "2"}), None, target=NRI).grant
    assert svc.runtime_edit(plain, None, NRI).env == {}  # an exclusive container is told nothing


def test_plan_and_explain_show_it(node) -> None:
    fake, svc = node
    m = admit(svc, fake, "m", 101, MIXED)
    state = svc.ledger.read()
    want = format_list(parse_list(fake.cpus))
    assert preview(svc, state, m, applied=False) == {
        "cpu-shared": f"cpuset {want}: exclusive {format_list(m.cpus)} and the shared pool"}
    assert preview(svc, state, m, applied=True)["cpu-shared"].endswith("; held")
    (fake.cgroup_dir("m") / "cpuset.cpus").write_text(format_list(m.cpus) + "\n")
    assert "drifted to" in preview(svc, state, m, applied=True)["cpu-shared"]
    assert "cpu-shared=enable" in svc.describe_grant(m)  # status's words for it
