"""Pod-scope totals from the pod's own resources (issue 34, item 2): NRI's
``PodSandbox.linux.pod_resources`` and CRI-O's ``pod-linux-resources.crio.io``, read as kubelet
reads pod-level resources, give the decision the same pod annotated ``numa-pin.io/pod-*`` gets.

The oracle is the annotated pod: the same containers, the totals written as annotations. The
pod (two Guaranteed containers of 10 CPUs and 30Gi on the 16-CPU, 54Gi-free nodes of
``intel-2s-ht``, restricted, pod scope) is chosen so that the totals change the decision: without them the pod is aligned to
the first container's node and the second container does not fit there.
"""

from __future__ import annotations

import json

import pytest

from numa_pin.admission.decide import NodeSettings, decide
from numa_pin.errors import RequestError
from numa_pin.ledger.model import Grant, LedgerState, PodRecord
from numa_pin.requests.limits import ContainerLimits
from numa_pin.requests.request import Amounts, Inference, pod_totals, request_from_oci
from numa_pin.testing import machine, shapes

GI = 1 << 30
PERIOD = 100_000
TOPOLOGY = machine.expected_topology(shapes.SHAPES["intel-2s-ht"]())
POD_SCOPE = NodeSettings(policy="restricted", scope="pod")
POD = {"io.kubernetes.cri.sandbox-id": "sb1", "io.kubernetes.cri.container-type": "container"}
ANNOTATED = {"numa-pin.io/pod-cpus": "20", "numa-pin.io/pod-memory": "60Gi"}


def guaranteed(milli: int, memory: int, cgroup: str) -> ContainerLimits:
    """kubelet's resources for request = limit = ``milli`` CPUs and ``memory`` (cpuManagerPolicy none)."""
    return ContainerLimits(cgroups_path=cgroup, cpu_quota=milli * PERIOD // 1000, cpu_period=PERIOD,
                           cpu_shares=milli * 1024 // 1000, memory_limit=memory)


def crio(limits: ContainerLimits) -> str:
    """CRI-O's annotation: the sandbox's CRI LinuxContainerResources marshalled by Go (omitempty)."""
    doc = {"cpu_period": limits.cpu_period, "cpu_quota": limits.cpu_quota, "cpu_shares": limits.cpu_shares,
           "memory_limit_in_bytes": limits.memory_limit, "oom_score_adj": -997}
    return json.dumps({k: v for k, v in doc.items() if v})


POD_20 = guaranteed(20_000, 60 * GI, "/kubepods/podu1")
FORMS = {  # how the totals reach the request: (extra annotations, pod_limits)
    "annotated": (ANNOTATED, None),
    "nri-pod-resources": ({}, POD_20),
    "crio-annotation": ({"pod-linux-resources.crio.io": crio(POD_20)}, None),
    "crio-annotation-old-name": ({"io.kubernetes.cri-o.PodLinuxResources": crio(POD_20)}, None),
    "none": ({}, None),
}


def run_pod(form: str) -> list[tuple[bool, frozenset[int] | None, int, str]]:
    """Admit the pod's two containers in order; per container (admitted, pod affinity, CPUs, error kind)."""
    extra, pod_limits = FORMS[form]
    state, out = LedgerState(), []
    for cid in ("c1", "c2"):
        ann = {**POD, "io.kubernetes.cri.container-name": cid, **extra}
        request = request_from_oci(cid, ann, limits=guaranteed(10_000, 30 * GI, f"/kubepods/podu1/{cid}"),
                                   pod_limits=pod_limits)
        d = decide(TOPOLOGY, state, request, POD_SCOPE)
        if d.admit:
            state = state.with_grant(Grant(cid, request.pod_id, cid, "exclusive", cpus=d.cpus, mems=d.mems,
                                           affinity=d.hint.affinity, policy=d.policy, scope=d.scope))
            if d.pod_affinity is not None and request.pod_id not in state.pods:
                state = state.with_pod(PodRecord(request.pod_id, d.pod_affinity, d.policy, d.scope))
        pod = state.pods.get(request.pod_id)
        out.append((d.admit, pod.affinity if pod else None, len(d.cpus), "" if d.admit else d.error.kind))
    return out


@pytest.mark.parametrize("form", ["nri-pod-resources", "crio-annotation", "crio-annotation-old-name"])
def test_pod_resources_decide_as_the_annotated_totals(form: str) -> None:
    expected = run_pod("annotated")
    assert [admit for admit, *_ in expected] == [True, True] and expected[0][1] == frozenset(TOPOLOGY.node_ids)
    assert run_pod(form) == expected
    assert run_pod("none") != expected, "the totals must matter here (else the test proves nothing)"


CONTAINER = guaranteed(2000, GI, "/kubepods/podu1/c1")
CASES = [  # (id, annotations beyond the pod's, pod_limits, container limits, inference, expected totals)
    ("guaranteed", {}, POD_20, CONTAINER, Inference(), Amounts(cpus=20, memory=60 * GI)),
    ("systemd-slice", {}, guaranteed(20_000, 2 * GI, "kubepods-podu1.slice"), CONTAINER, Inference(),
     Amounts(cpus=20, memory=2 * GI)),
    ("burstable-parent", {}, guaranteed(20_000, 2 * GI, "/kubepods/burstable/podu1"), CONTAINER, Inference(), None),
    ("request-below-limit", {}, ContainerLimits(cpu_quota=2_000_000, cpu_period=PERIOD, cpu_shares=1024, memory_limit=2 * GI), ContainerLimits("/x/c1"),
     Inference(), None),
    ("fractional-cpus", {}, guaranteed(2500, 2 * GI, "/kubepods/podu1"), CONTAINER, Inference(), None),
    ("no-memory-limit", {}, guaranteed(2000, 0, "/kubepods/podu1"), CONTAINER, Inference(), None),
    ("inference-off", {}, POD_20, CONTAINER, Inference(guaranteed_cpus=False), None),
    ("parent-from-container", {}, ContainerLimits(cpu_quota=2_000_000, cpu_period=PERIOD, cpu_shares=20480, memory_limit=60 * GI), CONTAINER, Inference(),
     Amounts(cpus=20, memory=60 * GI)),
    ("annotation-wins-per-key", {"numa-pin.io/pod-memory": "1Gi"}, POD_20, CONTAINER, Inference(),
     Amounts(cpus=20, memory=GI)),
    ("annotations-win", ANNOTATED | {"numa-pin.io/pod-cpus": "4"}, POD_20, CONTAINER, Inference(),
     Amounts(cpus=4, memory=60 * GI)),
    ("crio-null", {"pod-linux-resources.crio.io": "null"}, None, CONTAINER, Inference(), None),
    ("crio-new-name-wins", {"pod-linux-resources.crio.io": crio(POD_20),
                            "io.kubernetes.cri-o.PodLinuxResources": crio(guaranteed(4000, GI, ""))},
     None, CONTAINER, Inference(), Amounts(cpus=20, memory=60 * GI)),
]


@pytest.mark.parametrize(("extra", "pod_limits", "limits", "inference", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pod_totals(extra, pod_limits, limits, inference, expected) -> None:
    assert pod_totals({**POD, **extra}, pod_limits, limits, inference) == expected


@pytest.mark.parametrize("text", ["{", "[1]", '{"cpu_quota": "2"}', '{"memory_limit_in_bytes": -1}',
                                  '{"cpu_period": 1.5}', '{"cpu_shares": true}', '{"a": [[[[[1]]]]]}'],
                         ids=["not-json", "not-object", "string", "negative", "float", "bool", "too-deep"])
def test_a_bad_crio_annotation_is_refused_naming_it(text: str) -> None:
    with pytest.raises(RequestError) as err:
        request_from_oci("c1", {**POD, "pod-linux-resources.crio.io": text}, limits=CONTAINER)
    assert err.value.annotation == "pod-linux-resources.crio.io"
