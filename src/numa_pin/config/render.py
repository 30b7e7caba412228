"""Render the key table as YAML and Markdown: ``packaging/config.yaml`` and the docs' table (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from numa_pin.config.keys import BY_KEY, CHILDREN, ITEMS

_PLAIN = re.compile(r"[A-Za-z/][-A-Za-z0-9_./]*")
_YAML_WORDS = frozenset(("y", "n", "yes", "no", "on", "off", "true", "false", "null", "none"))


def yaml_scalar(value: Any) -> str:
    """``value`` as a YAML flow scalar (defaults only: null, bool, number, string, {}, a list of those)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
            return value
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, list):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    raise TypeError(f"no YAML rendering for {value!r}")


def sample_yaml() -> str:
    """The commented sample configuration (``packaging/config.yaml``): every key, its default."""
    lines = [
        "# numa-pin configuration: /etc/numa-pin/config.yaml",
        "#",
        "# Every key is listed with its built-in default; delete what you do not change.",
        "# Precedence: numa-pin --config PATH, then $NUMA_PIN_CONFIG, then this file,",
        "# then the built-in defaults. Unknown keys and bad values are errors.",
        "# Generated from numa_pin.config.schema.ITEMS; see docs/ledger-config.md.",
    ]
    _render_section("", 0, lines)
    return "\n".join(lines) + "\n"


def _render_section(prefix: str, depth: int, lines: list[str]) -> None:
    indent = "  " * depth
    for name in CHILDREN[prefix]:
        key = f"{prefix}.{name}" if prefix else name
        item = BY_KEY.get(key)
        if item is None:
            if depth == 0:
                lines.append("")
            lines.append(f"{indent}{name}:")
            _render_section(key, depth + 1, lines)
            continue
        if depth == 0:
            lines.append("")
        for text_line in _wrap(f"{item.meaning} Type: {item.type}.", 88 - len(indent)):
            lines.append(f"{indent}# {text_line}")
        lines.append(f"{indent}{name}: {yaml_scalar(item.default)}")
        if item.example:
            lines.append(f"{indent}# Example:")
            lines.extend(f"{indent}#   {ex}" for ex in item.example.splitlines())


def _wrap(text: str, width: int) -> list[str]:
    out: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out


def reference_table() -> str:
    """The key table in Markdown (name, type, default, meaning) for the docs."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for item in ITEMS:
        meaning = item.meaning.replace("|", "\\|")
        rows.append(f"| `{item.key}` | {item.type} | `{yaml_scalar(item.default)}` | {meaning} |")
    return "\n".join(rows) + "\n"


__all__ = ["reference_table", "sample_yaml", "yaml_scalar"]
