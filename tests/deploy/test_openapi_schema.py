"""The manifests against the Kubernetes API's published OpenAPI schema (:mod:`.openapi_check`).

Both the plain file and the Helm chart's rendering are checked object by object; each kind of
mistake the check exists for is put into a copy of the DaemonSet to show it is caught.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from .openapi_check import check_file, check_model, model_of
from .render import render_chart

REPO = Path(__file__).resolve().parents[2]
PLAIN = REPO / "deploy" / "kubernetes" / "numa-pin.yaml"
CHART = REPO / "deploy" / "helm" / "numa-pin"


def _problems(doc: dict[str, Any]) -> list[str]:
    found: list[str] = []
    check_model(doc, model_of(doc["apiVersion"], doc["kind"]), "", found)
    return found


def test_the_plain_file_follows_the_schema() -> None:
    assert check_file(str(PLAIN)) == []


def test_the_rendered_chart_follows_the_schema() -> None:
    docs = render_chart(CHART)
    assert {d["kind"] for d in docs} >= {"DaemonSet", "ConfigMap", "ServiceAccount", "ClusterRole"}
    assert [line for doc in docs for line in _problems(doc)] == []


def _daemonset() -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(PLAIN.read_text()) if d and d["kind"] == "DaemonSet")


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _typo(doc: dict[str, Any]) -> None:
    _container(doc)["volumeMount"] = _container(doc).pop("volumeMounts")


def _wrong_type(doc: dict[str, Any]) -> None:
    doc["spec"]["template"]["spec"]["hostPID"] = "true"


def _missing(doc: dict[str, Any]) -> None:
    del _container(doc)["name"]


def _misplaced(doc: dict[str, Any]) -> None:  # a pod field indented into the container
    _container(doc)["hostNetwork"] = True


@pytest.mark.parametrize("spoil, line", [
    (_typo, "spec.template.spec.containers[0].volumeMount: not a field of V1Container"),
    (_wrong_type, "spec.template.spec.hostPID: expected bool, got str 'true'"),
    (_missing, "spec.template.spec.containers[0].name: required by V1Container, missing"),
    (_misplaced, "spec.template.spec.containers[0].hostNetwork: not a field of V1Container"),
], ids=["typo", "wrong-type", "missing-required", "misplaced"])
def test_a_spoiled_daemonset_is_caught_where_it_is_spoiled(spoil, line: str) -> None:
    doc = copy.deepcopy(_daemonset())
    spoil(doc)
    assert [p.lstrip(".") for p in _problems(doc)] == [line]
