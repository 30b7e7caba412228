"""Topology Manager policy options, parsed and checked like kubelet does (pure).

kubelet ``policy_options.go`` and the start of ``NewManager`` (``topology-manager.md`` §6, §7):

* ``prefer-closest-numa-nodes``: Go ``strconv.ParseBool``; GA since 1.32.
* ``max-allowable-numa-nodes``: Go ``strconv.Atoi``, at least 8; GA since 1.35.

numa-pin has no feature gates: both options are always available (they are GA upstream).
Values may be strings (as kubelet's ``map[string]string``) or, from YAML, bools and ints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numa_pin.base import names
from numa_pin.base.record import record
from numa_pin.errors import PolicyError

PREFER_CLOSEST_NUMA_NODES = "prefer-closest-numa-nodes"
MAX_ALLOWABLE_NUMA_NODES = "max-allowable-numa-nodes"
#: kubelet ``defaultMaxAllowableNUMANodes``
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8
KNOWN_OPTIONS = (PREFER_CLOSEST_NUMA_NODES, MAX_ALLOWABLE_NUMA_NODES)

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@record
class PolicyOptions:
    """kubelet ``PolicyOptions``."""

    prefer_closest_numa_nodes: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES


def go_quote(text: str) -> str:
    """Go's ``%q`` for the strings that appear in option errors."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not ch.isprintable():
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_bool(text: str) -> bool:
    """Go ``strconv.ParseBool``. Raises :class:`ValueError` with Go's message."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")


def parse_int(text: str) -> int:
    """Go ``strconv.Atoi`` on a 64-bit platform. Raises :class:`ValueError` with Go's message."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not all("0" <= c <= "9" for c in body):
        raise ValueError(f"strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"strconv.Atoi: parsing {go_quote(text)}: value out of range")
    return value


def parse_options(raw: Mapping[str, str | bool | int] | None) -> PolicyOptions:
    """kubelet ``NewPolicyOptions``.

    Raises :class:`PolicyError`:
    ``unknown Topology Manager Policy option: "x"``;
    ``bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: ...``;
    ``unable to convert policy option to integer "max-allowable-numa-nodes": strconv.Atoi: ...``;
    ``the minimum value of "max-allowable-numa-nodes" should not be less than 8``.
    Unknown names are reported before bad values (Go's map order is random; ours is not).
    """
    if not raw:
        return PolicyOptions()
    for name in sorted(raw):
        if name not in KNOWN_OPTIONS:
            raise PolicyError(f"unknown Topology Manager Policy option: {go_quote(str(name))}")
    prefer_closest = False
    max_nodes = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name in sorted(raw):
        text = _as_text(raw[name])
        if name == PREFER_CLOSEST_NUMA_NODES:
            try:
                prefer_closest = parse_bool(text)
            except ValueError as err:
                raise PolicyError(f"bad value for option {go_quote(name)}: {err}") from None
        else:
            try:
                value = parse_int(text)
            except ValueError as err:
                raise PolicyError(
                    f"unable to convert policy option to integer {go_quote(name)}: {err}"
                ) from None
            if value < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                raise PolicyError(
                    f"the minimum value of {go_quote(name)} should not be less than "
                    f"{DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
                )
            max_nodes = value
    return PolicyOptions(prefer_closest_numa_nodes=prefer_closest, max_allowable_numa_nodes=max_nodes)


def check_machine(
    policy_name: str,
    options: PolicyOptions | Mapping[str, str | bool | int] | None,
    num_nodes: int | Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
) -> PolicyOptions:
    """The load-time checks of kubelet ``NewManager`` (§7), in kubelet's order.

    ``num_nodes`` is the NUMA node count or the node ids (ids are needed to check distances;
    with a count the ids are ``0..N-1``). Returns the parsed options.

    1. policy ``none``: nothing is checked, default options are returned;
    2. the options are parsed (:func:`parse_options` errors);
    3. with prefer-closest-numa-nodes every node needs a complete distance row;
    4. more nodes than ``max-allowable-numa-nodes``: ``unsupported on machines with more than
       N NUMA Nodes`` (plus how numa-pin lifts the limit).

    Raises :class:`PolicyError`. Policy and scope names are checked by
    :func:`numa_pin.policy.registry.get_policy` and :func:`numa_pin.policy.registry.check_scope`.
    """
    if policy_name == names.NONE:
        return PolicyOptions()
    opts = options if isinstance(options, PolicyOptions) else parse_options(options)
    nodes = list(range(num_nodes)) if isinstance(num_nodes, int) else sorted(num_nodes)
    if opts.prefer_closest_numa_nodes:
        missing = [n for n in nodes if distances is None or len(distances.get(n) or ()) < len(nodes)]
        if missing:
            raise PolicyError(
                "cannot discover NUMA topology: error getting NUMA distances for node(s) "
                f"{','.join(str(n) for n in missing)} (prefer-closest-numa-nodes needs NUMA distances)"
            )
    if len(nodes) > opts.max_allowable_numa_nodes:
        raise PolicyError(
            f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes "
            f"(this machine has {len(nodes)}; set the policy option {MAX_ALLOWABLE_NUMA_NODES} "
            "to at least that: numa-pin's merge has no combinatorial limit)"
        )
    return opts
