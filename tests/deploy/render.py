"""The chart's templates rendered without helm, for the tests (helm is not in Debian 12).

The templates under ``deploy/helm/numa-pin/templates`` use two forms of Go template only,
and :func:`render` refuses anything else, so a template that grows a conditional or a loop
fails here instead of being compared wrongly:

* ``{{ .Values.a.b }}``: the value, printed as Go's ``text/template`` prints it (``true`` and
  ``false`` for booleans, numbers and strings as they are);
* ``{{ .Values.a.b | nindent N }}``: sprig's ``nindent``, a newline, then the value with every
  line (the empty one after a final newline too) indented by ``N`` spaces.

Whitespace trimming (``{{-``), pipelines of more functions, ``.Release`` and ``.Chart`` are not
modelled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
FORM = re.compile(r"^ \.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?: \| nindent (\d+))? $")


def lookup(values: Mapping[str, object], dotted: str) -> object:
    """``.Values.a.b`` of ``values``; KeyError names the path."""
    node: object = values
    for part in dotted.strip(".").split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f".Values{dotted}: no such value")
        node = node[part]
    return node


def go_text(value: object) -> str:
    """``value`` as ``{{ }}`` prints it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise TypeError(f"{value!r}: only scalars are substituted")


def render(template: str, values: Mapping[str, object]) -> str:
    """``template`` with each action replaced; ValueError for an action outside the subset."""

    def one(match: re.Match[str]) -> str:
        form = FORM.match(match.group(1))
        if form is None:
            raise ValueError(f"{match.group(0)!r}: not one of the forms this renderer knows")
        text = go_text(lookup(values, form.group(1)))
        if form.group(2) is None:
            return text
        pad = " " * int(form.group(2))
        return "\n" + pad + text.replace("\n", "\n" + pad)

    return ACTION.sub(one, template)


def render_chart(chart: Path) -> list[dict[str, object]]:
    """Every object the chart's templates make with its own ``values.yaml``, in file-name order."""
    values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
    out: list[dict[str, object]] = []
    for path in sorted((chart / "templates").glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(render(path.read_text(encoding="utf-8"), values)) if d)
    return out


#: the order of the plain file's objects (kubectl applies them in this order)
PLAIN_ORDER = ("namespace", "serviceaccount", "rbac", "configmap", "daemonset")
PLAIN_HEAD = """\
# numa-pin's NRI plugin on every node: kubectl apply -f deploy/kubernetes/numa-pin.yaml
# The same objects as the Helm chart in deploy/helm/numa-pin with its default values (tests/deploy
# checks that they stay the same). Install, upgrade, uninstall and the privileges each mount and
# capability is for: docs/kubernetes-deploy.md.
"""


def plain_yaml(chart: Path) -> str:
    """The text of ``deploy/kubernetes/numa-pin.yaml``: the templates rendered with the chart's
    values, comments kept (``python -m tests.deploy.render`` prints it)."""
    values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
    docs = [render((chart / "templates" / f"{name}.yaml").read_text(encoding="utf-8"), values)
            for name in PLAIN_ORDER]
    text = PLAIN_HEAD + "---\n".join(doc.rstrip("\n") + "\n" for doc in docs)
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


if __name__ == "__main__":
    print(plain_yaml(Path(__file__).resolve().parents[2] / "deploy" / "helm" / "numa-pin"), end="")
