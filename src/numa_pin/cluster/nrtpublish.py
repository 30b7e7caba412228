"""This node's ``NodeResourceTopology`` kept current in the API server, from the serving process.

:func:`publish` is one create-or-update of the object (:func:`numa_pin.cluster.nrt.build_nrt`'s, the
one ``numa-pin nrt`` prints) through :class:`~numa_pin.cluster.kubeapi.ApiServer`: GET it; absent,
POST it; present and numa-pin's, PUT it with the ``resourceVersion`` just read (a 409, someone
wrote in between, reads and tries once more). numa-pin owns only an object that carries the
label ``app.kubernetes.io/managed-by: numa-pin``; an object of the same name without it (NFD's
topology-updater, another exporter) is left as it is and nothing is written.

:class:`Publisher` runs it beside the server, in a thread of its own, so an admission never
waits on the API server: it publishes at start, then whenever it is told (:meth:`notify`) or a
watched file (the ledger) changed, at most once every ``interval_s`` seconds, and always the
state as it is when it builds (so the last change is always published, at most ``interval_s``
late). A failure is logged once per distinct message and retried with an exponential backoff
(``interval_s`` doubling up to ``max_backoff_s``); the next success says so in one line.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from numa_pin.base.text import cut, one_line
from numa_pin.cluster.kubeapi import ApiServer
from numa_pin.cluster.nrt import API_VERSION
from numa_pin.errors import KubeApiError, NumaPinError

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "numa-pin"
DEFAULT_INTERVAL_S = 10.0
DEFAULT_POLL_S = 1.0
DEFAULT_MAX_BACKOFF_S = 300.0
#: what :func:`publish` did
CREATED, UPDATED, FOREIGN = "created", "updated", "foreign"


def owned(obj: Any) -> bool:
    """Whether an object of the API server carries numa-pin's managed-by label."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return isinstance(labels, dict) and labels.get(MANAGED_BY_LABEL) == MANAGER


def labelled(obj: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
    """``obj`` with numa-pin's label (and the ``resourceVersion`` a replace must carry)."""
    meta = dict(obj.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), MANAGED_BY_LABEL: MANAGER}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {**obj, "metadata": meta}


def publish(api: ApiServer, obj: dict[str, Any]) -> str:
    """Create or replace ``obj`` (a NodeResourceTopology); :data:`CREATED`, :data:`UPDATED`, or
    :data:`FOREIGN` when an object of that name is not numa-pin's (nothing written).

    Raises:
        KubeApiError: the API server cannot be reached, or refused (a 409 twice included).
    """
    collection = f"/apis/{API_VERSION}/noderesourcetopologies"
    name = obj["metadata"]["name"]
    item = f"{collection}/{quote(name, safe='')}"
    for attempt in (1, 2):
        current = api.request("GET", item)
        if current.status == 404:
            answer, done = api.request("POST", collection, labelled(obj)), CREATED
        elif current.status == 200:
            if not owned(current.doc):
                return FOREIGN
            version = str((current.doc.get("metadata") or {}).get("resourceVersion") or "")
            answer, done = api.request("PUT", item, labelled(obj, version)), UPDATED
        else:
            raise _refused("GET", current.status, current.doc, api.base + item)
        if 200 <= answer.status < 300:
            return done
        if answer.status != 409 or attempt == 2:
            raise _refused("POST" if done == CREATED else "PUT", answer.status, answer.doc, api.base + item)
    raise AssertionError("unreachable")  # pragma: no cover


def _refused(method: str, status: int, doc: Any, url: str) -> KubeApiError:
    why = doc.get("message") if isinstance(doc, dict) else None
    return KubeApiError(cut(one_line(f"{method}: {status} {why or 'refused'}")), path=url, status=status)


class Publisher:
    """Keeps the object in the API server current, from a daemon thread (:meth:`start`).

    ``build`` makes the object from the node as it is now; ``send`` publishes it
    (:func:`publish` bound to an API server: :data:`CREATED`/:data:`UPDATED`/:data:`FOREIGN`);
    ``watched`` are files whose change (inode, size, mtime) calls for a publish, checked every
    ``poll_s``; ``log`` takes one line."""

    def __init__(self, build: Callable[[], dict[str, Any]], send: Callable[[dict[str, Any]], str], *,
                 log: Callable[[str], None], interval_s: float = DEFAULT_INTERVAL_S,
                 watched: Sequence[str] = (), poll_s: float = DEFAULT_POLL_S,
                 max_backoff_s: float = DEFAULT_MAX_BACKOFF_S) -> None:
        self.build, self.send, self.log = build, send, log
        self.interval_s, self.poll_s, self.max_backoff_s = interval_s, poll_s, max_backoff_s
        self.watched = tuple(watched)
        self.published = 0
        self._wake = threading.Event()
        self._pending = True  # publish at start
        self._stopped = False
        self._thread: threading.Thread | None = None

    def notify(self) -> None:
        """The grants changed: publish (within ``interval_s`` of the previous publish). Never blocks."""
        self._pending = True
        self._wake.set()

    def start(self) -> Publisher:
        self._thread = threading.Thread(target=self.run, name="numa-pin-nrt-publisher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        """The loop: wait for a change, publish it when the interval (or the backoff) allows."""
        seen = file_stamps(self.watched)
        last: dict[str, Any] | None = None
        last_outcome = last_error = None
        failures = 0
        not_before = 0.0
        while not self._stopped:
            stamp = file_stamps(self.watched)
            if stamp != seen:
                seen, self._pending = stamp, True
            now = time.monotonic()
            if self._pending and now >= not_before:
                self._pending = False
                try:
                    obj = self.build()
                    if obj != last or last_outcome == FOREIGN:
                        outcome = self.send(obj)
                        last = obj if outcome != FOREIGN else None
                        if outcome == FOREIGN and last_outcome != FOREIGN:
                            self.log(f"numa-pin: NodeResourceTopology {obj['metadata']['name']} exists and is not "
                                     f"numa-pin's (no {MANAGED_BY_LABEL}: {MANAGER} label): left alone, not published")
                        elif outcome != FOREIGN:
                            self.published += 1
                            if last_outcome is None or last_outcome == FOREIGN or last_error is not None:
                                self.log(f"numa-pin: NodeResourceTopology {obj['metadata']['name']} {outcome}")
                        last_outcome, last_error, failures = outcome, None, 0
                    not_before = now + self.interval_s
                except (NumaPinError, OSError, ValueError, KeyError) as exc:
                    line = cut(one_line(f"numa-pin: publishing the NodeResourceTopology: "
                                        f"{getattr(exc, 'kind', type(exc).__name__)}: {exc}"))
                    failures += 1
                    backoff = min(self.max_backoff_s, self.interval_s * 2 ** (failures - 1))
                    if line != last_error:
                        self.log(f"{line} (retrying, every {backoff:g}s at most)")
                        last_error = line
                    self._pending = True
                    not_before = time.monotonic() + backoff
            wait = self.poll_s if not self._pending else max(0.0, min(self.poll_s, not_before - now))
            self._wake.wait(wait)
            self._wake.clear()


def file_stamps(paths: Sequence[str]) -> tuple[tuple[int, int, int] | None, ...]:
    """(inode, size, mtime) of each of ``paths`` (None: missing): a change of any says the file changed."""
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


__all__ = ["CREATED", "FOREIGN", "MANAGED_BY_LABEL", "MANAGER", "UPDATED", "Publisher", "file_stamps", "labelled",
           "owned", "publish"]
