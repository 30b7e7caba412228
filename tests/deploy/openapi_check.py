"""Kubernetes objects against the API's published OpenAPI schema, as the official client carries it.

The official Kubernetes Python client (``kubernetes`` on PyPI, a test dependency) is generated
from the API server's OpenAPI document: each model's ``openapi_types`` and ``attribute_map`` are
the schema's fields, their JSON names and types, and which are required is the schema's too. This
walks every object of the files given (YAML, several documents each) through those models: a
field the schema does not have (a typo, an indentation slip), a value of the wrong type, or a
required field left out is one line ``FILE: KIND/NAME: PATH: what``. Debian 12's
``python3-kubernetes`` (22.6) predates fields the manifests use (``appArmorProfile``, Kubernetes
1.30), so the client comes from PyPI (its pydantic models, 33 or later).

``python tests/deploy/openapi_check.py deploy/kubernetes/numa-pin.yaml``: exit 1 when any line.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml
from kubernetes import client

SCALARS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "datetime": (str,), "date": (str,),
           "bytes": (str,)}
LIST = re.compile(r"List\[(.+)\]$")
DICT = re.compile(r"Dict\[str, (.+)\]$")


def model_of(api_version: str, kind: str) -> str:
    """The client's model name for an object: ``apps/v1`` ``DaemonSet`` -> ``V1DaemonSet``."""
    version = api_version.rsplit("/", 1)[-1]
    return version[0].upper() + version[1:] + kind


def check(value: Any, type_name: str, where: str, problems: list[str]) -> None:
    """Append a line to ``problems`` for each place ``value`` is not of ``type_name``."""
    if type_name == "object":
        return
    if found := LIST.match(type_name):
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check(item, found.group(1), f"{where}[{i}]", problems)
        return
    if found := DICT.match(type_name):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a map, got {type(value).__name__}")
            return
        for key, item in value.items():
            check(item, found.group(1), f"{where}.{key}", problems)
        return
    if type_name in SCALARS:
        ok = isinstance(value, SCALARS[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        if not ok:
            problems.append(f"{where}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    check_model(value, type_name, where, problems)


def check_model(value: Any, type_name: str, where: str, problems: list[str]) -> None:
    model = getattr(client, type_name, None)
    if model is None:
        problems.append(f"{where}: the schema has no {type_name}")
        return
    if not isinstance(value, dict):
        problems.append(f"{where}: expected a {type_name} object, got {type(value).__name__}")
        return
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{where}.{key}: not a field of {type_name}")
        else:
            check(item, model.openapi_types[fields[key]], f"{where}.{key}", problems)
    missing = [model.attribute_map[a] for a in required(model) if model.attribute_map[a] not in value]
    problems += [f"{where}.{name}: required by {type_name}, missing" for name in missing]


def required(model: Any) -> list[str]:
    """The attributes of ``model`` (a pydantic model of the client) the schema requires."""
    return [name for name, f in model.model_fields.items() if f.is_required() and name in model.attribute_map]


def check_file(path: str) -> list[str]:
    problems: list[str] = []
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        name = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        found: list[str] = []
        check_model(doc, model_of(str(doc.get("apiVersion", "")), str(doc.get("kind", ""))), "", found)
        problems += [f"{path}: {name}: {line.lstrip('.')}" for line in found]
    return problems


def main(argv: list[str]) -> int:
    problems = [line for path in argv for line in check_file(path)]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
