"""Running containers a Synchronize finds without a grant: adopted within the answer's budget,
and what that budget leaves adopted after the answer.

The runtime waits for one answer to Synchronize, within its request timeout (containerd: 2 s for
the whole of it), and a plugin that answers late is dropped and reconnected, which starts the
same work again. So the adoptions share one budget (:meth:`Handler.deadline`), and the
containers it leaves are not refused: they wait (:attr:`Handler.later`) and are adopted after the
answer, a round at a time, each round with a budget of :data:`LATER_SHARE` of the runtime's
timeout, so that a request the runtime sends meanwhile waits at most that long. The updates that
pin them reach the runtime unasked, as one ``UpdateContainers`` request per round
(:meth:`numa_pin.nri.plugin.Session.run`). A round that adopts nothing ends the wait: what is
left is said in one line and left as it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numa_pin.base.deadline import Deadline
from numa_pin.base.text import cut, one_line
from numa_pin.errors import AdmissionTimeout, NriError, NumaPinError
from numa_pin.nri.messages import RUNTIME_SERVICE
from numa_pin.reporting import report
from numa_pin.resources.runtime import NRI

if TYPE_CHECKING:
    from typing import Any

    from numa_pin.service.adopt import Adoptee

#: the share of the runtime's request timeout one round of adoptions after the answer may take
LATER_SHARE = 0.25


def settle(handler: Any, adoptees: list[Adoptee], budget: Deadline) -> tuple[list[str], list[Adoptee]]:
    """Adopt ``adoptees`` as one batch within ``budget``: the ids adopted, and the adoptees the
    budget left. Each other refusal is said in one line and remembered as the container's reason."""
    by_id = {a.request.container_id: a for a in adoptees}
    adopted: list[str] = []
    left: list[Adoptee] = []
    for outcome in handler.service.adopt_batch(adoptees, budget, NRI):
        if outcome.error is None:
            adopted.append(outcome.container_id)
        elif isinstance(outcome.error, AdmissionTimeout):
            left.append(by_id[outcome.container_id])
        else:
            not_adopted(handler, outcome.container_id, outcome.error)
    report.forget_reasons(handler.service.config.state_dir, adopted)
    return adopted, left


def not_adopted(handler: Any, container_id: str, exc: NumaPinError) -> None:
    """It runs already: say so, and leave it as it is."""
    line = cut(one_line(f"numa-pin: cannot adopt {container_id}: {exc.kind}: {exc}"))
    handler.log(line)
    report.write_reason(handler.service.config.state_dir, container_id, line, {"kind": exc.kind})


def later_round(handler: Any) -> list[Any]:
    """One round of the adoptions the last Synchronize's budget left (:attr:`Handler.later`): the
    ``ContainerUpdate`` messages that pin those adopted. What this round leaves waits for the
    next; a round that adopts nothing ends the wait."""
    waiting, handler.later = handler.later, []
    known = handler.service.ledger.read().grants
    waiting = [a for a in waiting if a.request.container_id not in known]
    if not waiting:
        return []
    budget = Deadline(handler.request_timeout_s * LATER_SHARE, "adoption after the synchronisation")
    adopted, left = settle(handler, waiting, budget)
    if adopted:
        handler.later = left
    elif left:
        handler.log(cut(one_line(f"numa-pin: {len(left)} running container(s) not adopted: a round of "
                                 f"{budget.seconds:g}s adopted none of them; they run as they are")))
    handler.log(f"adopted {len(adopted)} running container(s) after the synchronisation, "
                f"{len(handler.later)} still waiting")
    state = handler.service.ledger.read()
    updates = [handler.update_of(cid, state) for cid in adopted]
    return [u for u in updates if u is not None]


def updates_request(m: Any, updates: list[Any]) -> bytes:
    """The ttrpc request that sends the runtime ``updates`` it did not ask for."""
    body = m.api("UpdateContainersRequest")(update=updates)
    return bytes(m.ttrpc("Request")(service=RUNTIME_SERVICE, method="UpdateContainers",
                                    payload=body.SerializeToString()).SerializeToString())


def updates_answered(handler: Any, response: Any, where: str) -> None:
    """The runtime's answer to :func:`updates_request` (a ttrpc response): what it refused or
    could not apply is said in one line. Raises NriError when the answer cannot be read."""
    if response.status.code:
        handler.log(cut(one_line(f"the runtime refused the updates of adopted containers: "
                                 f"{response.status.message}")))
        return
    try:
        failed = handler.m.api("UpdateContainersResponse").FromString(response.payload).failed
    except Exception as exc:  # protobuf's DecodeError
        raise NriError(f"unreadable UpdateContainersResponse: {exc}", path=where) from exc
    if failed:
        ids = ", ".join(u.container_id for u in failed[:5])
        handler.log(cut(one_line(f"the runtime could not update {len(failed)} adopted container(s): {ids}")))


__all__ = ["LATER_SHARE", "later_round", "not_adopted", "settle", "updates_answered", "updates_request"]
