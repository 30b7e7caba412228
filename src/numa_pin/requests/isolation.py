"""A container's isolation request: what else keeps off its exclusive CPUs (pure).

Each knob is asked per container by annotation, CRI-O's names and values exactly (so manifests
written for CRI-O's high-performance runtime class work unchanged), or numa-pin's own names for
the same knobs; a node default comes from the config's ``isolation`` section.

==========================  =================================  ================================
field                       CRI-O annotation                   numa-pin annotation
==========================  =================================  ================================
``load_balancing``          ``cpu-load-balancing.crio.io``     ``numa-pin.io/cpu-load-balancing``
                            ``disable``
``quota``                   ``cpu-quota.crio.io: disable``     ``numa-pin.io/cpu-quota``
``irq``                     ``irq-load-balancing.crio.io``     ``numa-pin.io/irq-load-balancing``
                            ``disable`` | ``housekeeping``
``c_states``                ``cpu-c-states.crio.io``           ``numa-pin.io/cpu-c-states``
                            ``enable`` | ``disable`` |
                            ``max_latency:N`` (microseconds)
``governor``                ``cpu-freq-governor.crio.io``      ``numa-pin.io/cpu-freq-governor``
                            a cpufreq governor name
``host``                    (none)                             ``numa-pin.io/host-services``
                                                               ``disable`` (True) | ``enable``
``shared``                  ``cpu-shared.crio.io/<container>`` ``numa-pin.io/cpu-shared``
                            ``enable`` (True) | ``disable``    ``true`` | ``false``
``exec_cpu_affinity``       (CRI-O: the runtime handler's      ``numa-pin.io/exec-cpu-affinity``
                            ``exec_cpu_affinity``)             ``first`` | ``default``
==========================  =================================  ================================

``shared`` is CRI-O's mixed CPUs: the container keeps its exclusive CPUs and runs on the shared
pool too, one cpuset, and its exclusive and shared lists are exported to it
(:mod:`numa_pin.resources.node.cpu`). CRI-O names the container in the key; numa-pin's name is
pod-wide as the other knobs are. Either value word works on either name. It has no node default.

CRI-O's ``enable`` of load balancing, quota and IRQ balancing is its default, so it asks for
nothing (``None``). An annotation applies only to exclusive CPUs: a shared container that
carries one is refused with one line (:func:`check_exclusive`); the node defaults apply to
exclusive containers only and never refuse a shared one. Both spellings of one knob must agree.

The grant keeps the request (:meth:`IsolationRequest.to_dict`, in ``Grant.isolation``) so a
release, a reconcile and a crash cleanup know what it asked (:func:`of_grant`); the exec CPU
affinity excepted.

``exec_cpu_affinity`` is no setting on the machine but a field of the runtime's config
(``process.execCPUAffinity``), which only some paths carry: the request holds only what the
annotations ask (``default`` included, so it overrides the node's ``first``), and the node
default is read where the config is written (:mod:`numa_pin.resources.node.execaffinity`), so a
path that cannot carry it refuses an annotation but never a node default.
"""

from __future__ import annotations

from collections.abc import Mapping

from numa_pin.base.record import record
from numa_pin.base.text import quote
from numa_pin.config.parse import DISABLE, ENABLE, EXEC_DEFAULT, MAX_LATENCY, knob_value
from numa_pin.errors import RequestError

TYPE_CHECKING = False  # typing's flag without importing typing (it costs every hook start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

    from numa_pin.config.model import IsolationConfig

#: field -> (CRI-O annotation, numa-pin annotation)
ANNOTATIONS: dict[str, tuple[str | None, str]] = {
    "load_balancing": ("cpu-load-balancing.crio.io", "numa-pin.io/cpu-load-balancing"),
    "quota": ("cpu-quota.crio.io", "numa-pin.io/cpu-quota"),
    "irq": ("irq-load-balancing.crio.io", "numa-pin.io/irq-load-balancing"),
    "c_states": ("cpu-c-states.crio.io", "numa-pin.io/cpu-c-states"),
    "governor": ("cpu-freq-governor.crio.io", "numa-pin.io/cpu-freq-governor"),
    "host": (None, "numa-pin.io/host-services"),
    "shared": ("cpu-shared.crio.io/{container}", "numa-pin.io/cpu-shared"),
    "exec_cpu_affinity": (None, "numa-pin.io/exec-cpu-affinity"),
}
_WORD = {"load_balancing": "load-balancing", "c_states": "c-states", "host": "host-services", "shared": "cpu-shared",
         "exec_cpu_affinity": "exec-cpu-affinity"}
#: the knobs a bool holds (True: ``host`` disables host services, ``shared`` enables the pool)
_BOOLS = {"host": "disable", "shared": "enable"}
#: the ``numa-pin.io/`` keys (without the prefix) this module reads
NUMA_PIN_KEYS = tuple(names[1][len("numa-pin.io/"):] for names in ANNOTATIONS.values())
FIELDS = tuple(ANNOTATIONS)


@record
class IsolationRequest:
    """What one container asks to be kept off its exclusive CPUs; ``None``: nothing asked."""

    load_balancing: str | None = None  # "disable" | None
    quota: str | None = None  # "disable" | None
    irq: str | None = None  # "disable" | "housekeeping" | None
    c_states: str | None = None  # "enable" | "disable" | "max_latency:N" | None
    governor: str | None = None  # a cpufreq governor | None
    host: bool | None = None  # host services off its CPUs (True), or not (False / None)
    shared: bool | None = None  # the shared pool too, beside its exclusive CPUs (True), or not (None)
    exec_cpu_affinity: str | None = None  # "first" | "default" | None (annotations only)

    @property
    def empty(self) -> bool:
        """Asks for nothing."""
        return not any(self.asked())

    def asked(self) -> dict[str, Any]:
        """The knobs it asks for, by field name (host only when True)."""
        out = {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}
        if out.get("host") is False:
            del out["host"]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The knobs asked, for the ledger (``{}`` asks nothing); not the exec CPU affinity, which
        the runtime's config keeps and nothing on the node undoes or repairs."""
        return {f: v for f, v in self.asked().items() if f != "exec_cpu_affinity"}

    def words(self) -> list[str]:
        """``key=value`` words for ``plan``, ``explain`` and ``status``."""
        return [f"{_WORD.get(f, f)}={_BOOLS[f] if v is True else v}" for f, v in self.asked().items()]

    @property
    def latency_us(self) -> str | None:
        """What ``power/pm_qos_resume_latency_us`` gets, as CRI-O writes it: ``enable`` lifts
        every limit (``0``), ``disable`` forbids every C-state (``n/a``), ``max_latency:N`` N."""
        if self.c_states is None:
            return None
        if self.c_states == ENABLE:
            return "0"
        if self.c_states == DISABLE:
            return "n/a"
        return self.c_states[len(MAX_LATENCY):]


#: a request that asks nothing
NONE = IsolationRequest()


def from_dict(d: Mapping[str, Any] | None) -> IsolationRequest:
    """Inverse of :meth:`IsolationRequest.to_dict` (values checked as an annotation's).
    Raises :class:`RequestError` for an unknown field or a bad value."""
    if not d:
        return NONE
    values: dict[str, Any] = {}
    for name, value in d.items():
        if name not in ANNOTATIONS:
            raise RequestError(f"unknown isolation knob {quote(str(name))}", annotation="isolation")
        values[name] = value if name in _BOOLS and isinstance(value, bool) else _value(name, str(value), name)
    return IsolationRequest(**values)


def of_grant(grant: Any) -> IsolationRequest:
    """The isolation a ledger grant asked for (``Grant.isolation``); :data:`NONE` when none."""
    return from_dict(getattr(grant, "isolation", None))


def _value(field: str, text: str, annotation: str) -> str | bool | None:
    """One annotation's value, as the request holds it (None: the knob's default, nothing asked)."""
    try:
        return knob_value(field, text)
    except ValueError as exc:
        raise RequestError(str(exc), annotation=annotation) from None


def keys_of(field: str, container: str) -> tuple[str, ...]:
    """The annotations that ask knob ``field`` of container ``container`` (CRI-O's ``cpu-shared``
    key names the container; without a name it names none)."""
    keys = ANNOTATIONS[field]
    crio = keys[0]
    if crio is not None and "{container}" in crio:
        crio = crio.format(container=container) if container else None
    return tuple(k for k in (crio, keys[1]) if k is not None)


def explicit(annotations: Mapping[str, str], container: str = "") -> dict[str, str | bool | None]:
    """The knobs the annotations of container ``container`` name, by field (a knob set to its
    default maps to None).

    Raises:
        RequestError: a bad value, or CRI-O's and numa-pin's names of one knob disagreeing.
    """
    out: dict[str, str | bool | None] = {}
    for field in FIELDS:
        seen: list[tuple[str, str | bool | None]] = []
        for key in keys_of(field, container):
            if key in annotations:
                seen.append((key, _value(field, annotations[key], key)))
        if len(seen) == 2 and seen[0][1] != seen[1][1]:
            raise RequestError(f"disagrees with {seen[0][0]}={quote(annotations[seen[0][0]])}",
                               annotation=seen[1][0])
        if seen:
            out[field] = seen[0][1]
    return out


def isolation_request(annotations: Mapping[str, str], defaults: IsolationConfig | None,
                      container: str = "") -> IsolationRequest:
    """The isolation the annotations of container ``container`` ask, each knob they leave out
    taken from the node ``defaults`` (the config's ``isolation`` section; None: no defaults;
    ``shared`` has none).

    Raises:
        RequestError: a bad value, two names of one knob that disagree (naming the annotation),
            or the shared pool asked beside ``load_balancing: disable``.
    """
    asked = explicit(annotations, container)
    values: dict[str, Any] = {}
    for field in FIELDS:
        if field in asked:
            values[field] = asked[field]
        elif defaults is not None and field != "exec_cpu_affinity":  # read where the config is written
            values[field] = getattr(defaults, field, None)
    values["host"] = True if values.get("host") is True else None  # not asked and refused alike
    if values.get("shared") and values.get("load_balancing") == DISABLE:
        key = next(k for k in keys_of("shared", container) if k in annotations)
        raise RequestError("the shared pool cannot join CPUs kept out of load balancing (its partition would "
                           "take the pool's CPUs too); ask one or the other", annotation=key)
    return IsolationRequest(**values)


def check_exclusive(annotations: Mapping[str, str], exclusive: bool, container: str = "") -> None:
    """Refuse isolation annotations on a container without exclusive CPUs (one line, naming
    the first such annotation; CRI-O fails such a container's creation too). A knob set to its
    default (``enable``; ``cpu-shared``'s ``disable``) asks nothing and passes."""
    if exclusive:
        return
    for field in FIELDS:
        for key in keys_of(field, container):
            if key in annotations:
                value = _value(field, annotations[key], key)
                if value is not None and value is not False and value != EXEC_DEFAULT:
                    raise RequestError(
                        f"{quote(annotations[key])} applies to exclusive CPUs only, and this container "
                        "has none (ask for them with numa-pin.io/cpus, or a Guaranteed pod's whole CPUs)",
                        annotation=key,
                    )


__all__ = [
    "ANNOTATIONS", "FIELDS", "NONE", "NUMA_PIN_KEYS", "IsolationRequest", "check_exclusive", "explicit",
    "from_dict", "isolation_request", "keys_of", "of_grant",
]
