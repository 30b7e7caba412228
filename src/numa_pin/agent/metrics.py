"""The Prometheus exposition of one node: what ``numa-pin metrics`` prints or writes as a
node_exporter textfile, and what the agent's opt-in listener serves.

prometheus_client does the exposition format and the registry; this module only says what the
numbers are. Nothing is kept in memory: every collection reads the counts of
:mod:`numa_pin.reporting.tally` (kept in the state directory by every admission, in whatever process it
ran) and the ledger, the topology and the configured devices, so a restarted agent and a
textfile written by a timer say the same.

Names are kubelet's where kubelet has one (subsystem ``kubelet``: the topology manager's
admissions, the CPU and memory managers' pinning, aligned compute resources, the CPU manager's
pool gauges), so dashboards built for kubelet read numa-pin's nodes too; the rest is
``numa_pin_``. kubelet's ``container_aligned_compute_resources_count`` and its failure twin are
counters whose names end in ``_count``; prometheus_client would rename such a counter, so they
are exposed untyped under kubelet's exact name.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from numa_pin.base.quantity import parse_bytes
from numa_pin.base.safefs import replace_private
from numa_pin.base.text import one_line
from numa_pin.cluster.nrt import reserved_cpus_of
from numa_pin.config.load import entry_config
from numa_pin.config.schema import Config
from numa_pin.devices.inventory import inventory
from numa_pin.errors import NumaPinError
from numa_pin.ledger.model import KINDS
from numa_pin.reporting import tally
from numa_pin.resources.base import NodeView
from numa_pin.resources.node.cpu import shared_pool
from numa_pin.resources.registry import pure_resources
from numa_pin.service.node import open_service

#: the content type of :func:`exposition` (prometheus_client's text format 0.0.4)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_COUNTERS = (
    ("kubelet_topology_manager_admission_requests", "admission_requests",
     "The number of admission requests where resources have to be aligned."),
    ("kubelet_topology_manager_admission_errors", "admission_errors",
     "The number of admission request failures where resources could not be aligned."),
    ("kubelet_cpu_manager_pinning_requests", "cpu_pinning_requests",
     "The number of cpu core allocations which required pinning."),
    ("kubelet_cpu_manager_pinning_errors", "cpu_pinning_errors",
     "The number of cpu core allocations which required pinning failed."),
    ("kubelet_memory_manager_pinning_requests", "memory_pinning_requests",
     "The number of memory pages allocations which required pinning."),
    ("kubelet_memory_manager_pinning_errors", "memory_pinning_errors",
     "The number of memory pages allocations which required pinning that failed."),
    ("numa_pin_releases", "releases", "Grants released (poststop, numa-pin release)."),
    ("numa_pin_reconcile_runs", "reconcile_runs", "Reconcile passes (numa-pin reconcile, the timer)."),
    ("numa_pin_reconcile_repairs", "reconcile_repairs", "Containers whose drifted state a reconcile repaired."),
    ("numa_pin_reconcile_dropped", "reconcile_dropped", "Dead grants a reconcile dropped."),
    ("numa_pin_lock_waits", "lock_waits",
     "Admissions that waited for the ledger lock longer than the notice threshold."),
)


class NodeCollector(Collector):
    """A prometheus_client collector of one node, read afresh at every collection."""
    def __init__(self, config: Config, cache_dir: str | None = None) -> None:
        self.config = config
        self.cache_dir = cache_dir
    def collect(self) -> Iterator[Metric]:
        counts = tally.read(self.config.state_dir)
        yield from counter_families(counts)
        ok = GaugeMetricFamily("numa_pin_node_state_up",
                               "1 when the ledger, topology and devices could be read for this collection.")
        try:
            families = list(node_families(self.config, self.cache_dir))
        except (NumaPinError, OSError, ValueError):
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        yield from families


def counter_families(counts: Mapping[str, float]) -> Iterator[Metric]:
    """The counters and histograms of :mod:`numa_pin.reporting.tally`'s ``counts`` (pure)."""
    for name, key, doc in _COUNTERS:
        family = CounterMetricFamily(name, doc)
        family.add_metric([], counts.get(key, 0))
        yield family
    for what, doc in (("", "Containers whose compute resources were aligned, by scope and boundary."),
                      ("_failure", "Containers whose compute resources could not be aligned, by scope and boundary.")):
        untyped = UnknownMetricFamily(f"kubelet_container_aligned_compute_resources{what}_count",
                                      doc + " (a counter)", labels=["scope", "boundary"])
        for scope in tally.SCOPES:
            for boundary in tally.BOUNDARIES:
                untyped.add_metric([scope, boundary], counts.get(f"aligned{what}:{scope}:{boundary}", 0))
        yield untyped
    rejections = CounterMetricFamily("numa_pin_rejections", "Admissions refused or failed, by reason class.",
                                     labels=["reason"])
    for reason in tally.REASON_CLASSES:
        rejections.add_metric([reason], counts.get(f"rejections:{reason}", 0))
    yield rejections
    yield _histogram("kubelet_topology_manager_admission_duration_ms",
                     "Duration in milliseconds to serve a pod admission request.",
                     counts, "duration_ms", tally.DURATION_MS_BUCKETS)
    yield _histogram("numa_pin_admission_duration_seconds",
                     "Seconds one admission took: decision, enforcement and the ledger commit.",
                     counts, "duration_s", tally.DURATION_S_BUCKETS)


def _histogram(name: str, doc: str, counts: Mapping[str, float], key: str,
               bounds: tuple[float, ...]) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    total = 0.0
    for i, bound in enumerate((*bounds, float("inf"))):
        total += counts.get(f"{key}:{i}", 0)
        buckets.append(("+Inf" if i == len(bounds) else repr(bound), total))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=counts.get(f"{key}:sum", 0.0))


def node_families(config: Config, cache_dir: str | None = None) -> Iterator[Metric]:
    """The gauges read from the node: resources per NUMA node, grants by kind, the CPU manager's
    pool. Raises NumaPinError or OSError when the ledger, topology or config cannot be read."""
    service = open_service(config, cache_dir)
    state = service.ledger.read()
    topology, settings = service.topology, service.settings
    reserved = reserved_cpus_of(topology, settings)
    view = NodeView(topology, settings, state, inventory(topology, settings.device_resources), reserved)
    gauges = {
        field: GaugeMetricFamily(f"numa_pin_numa_node_{field}", doc, labels=["numa_node", "resource"])
        for field, doc in (
            ("capacity", "What the NUMA node has, per resource (CPUs and devices: a count; memory: bytes)."),
            ("allocatable", "Capacity minus what the config reserves for the system."),
            ("available", "Allocatable minus what grants hold: free for the next admission."),
        )
    }
    for resource in settings.resources or pure_resources():
        for node, entries in sorted(resource.zones(view).items()):
            for entry in entries:
                for field, family in gauges.items():
                    family.add_metric([str(node), entry["name"]], parse_bytes(entry[field], entry["name"]))
    yield from gauges.values()
    grants = GaugeMetricFamily("numa_pin_grants", "Grants in the ledger, by kind.", labels=["kind"])
    for kind in sorted({*KINDS, *(g.kind for g in state.grants.values())}):
        grants.add_metric([kind], sum(1 for g in state.grants.values() if g.kind == kind))
    yield grants
    exclusive = state.exclusive_cpus()
    pool = shared_pool(service, state)
    shared = GaugeMetricFamily("kubelet_cpu_manager_shared_pool_size_millicores",
                               "The size of the shared CPU pool for non-guaranteed QoS pods, in millicores.")
    shared.add_metric([], 1000 * len(pool))
    yield shared
    count = GaugeMetricFamily("kubelet_cpu_manager_exclusive_cpu_allocation_count",
                              "The total number of CPUs exclusively allocated to containers running on this node.")
    count.add_metric([], len(exclusive))
    yield count
    per_numa = GaugeMetricFamily("kubelet_cpu_manager_allocation_per_numa",
                                 "Number of CPUs allocated per NUMA node.", labels=["numa_node"])
    for node in topology.node_ids:
        per_numa.add_metric([str(node)], len(exclusive & topology.nodes[node].cpus))
    yield per_numa


def registry(config: Config, cache_dir: str | None = None) -> CollectorRegistry:
    """A registry of one :class:`NodeCollector` (not prometheus_client's global one)."""
    out = CollectorRegistry(auto_describe=False)
    out.register(NodeCollector(config, cache_dir))
    return out


def exposition(config: Config, cache_dir: str | None = None) -> bytes:
    """The node's metrics in the Prometheus text format."""
    return generate_latest(registry(config, cache_dir))


#: the longest one scrape is served, all of it (a scraper dripping a byte at a time is cut)
SCRAPE_DEADLINE_S = 20.0


def _past_deadline(_signum: int, _frame: object) -> None:
    raise TimeoutError("the scrape's deadline passed")


def serve_scrape(conn: socket.socket, environ: Mapping[str, str] | None = None, timeout_s: float = 10.0,
                 deadline_s: float = SCRAPE_DEADLINE_S) -> None:
    """Answer one HTTP request on ``conn`` with prometheus_client's handler (``GET /metrics``,
    content negotiation, gzip), the config read afresh (``NUMA_PIN_CONFIG``, else the default
    file). The agent's scrape child runs it. A config that cannot be loaded is a 500 with its
    one line; the connection is bounded by ``timeout_s`` per read and write, and the whole
    scrape by ``deadline_s`` (an interval timer, ``SIGALRM``: run it in a process's main
    thread, as the child does), past which it is cut unanswered and the function returns."""
    previous = signal.signal(signal.SIGALRM, _past_deadline)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, deadline_s)
            _serve_scrape(conn, environ, timeout_s)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutError:
        pass  # cut at its deadline
    finally:
        signal.signal(signal.SIGALRM, previous)


def _serve_scrape(conn: socket.socket, environ: Mapping[str, str] | None, timeout_s: float) -> None:
    conn.setblocking(True)
    conn.settimeout(timeout_s)
    try:
        handler: type[BaseHTTPRequestHandler] = MetricsHandler.factory(
            registry(entry_config(None, os.environ if environ is None else environ)[0]))
    except NumaPinError as exc:
        message = one_line(f"{exc.kind}: {exc}")
        handler = type("ConfigFailed", (BaseHTTPRequestHandler,), {
            "do_GET": lambda self: self.send_error(500, "numa-pin config error", message),
            "log_message": lambda self, *args: None,
        })
    try:
        handler(conn, conn.getpeername(), None)  # type: ignore[arg-type]
    except OSError:
        pass  # the scraper went away or timed out


def write_textfile(path: str, data: bytes) -> None:
    """Replace ``path`` (0644, for node_exporter's textfile collector) atomically with ``data``
    (:func:`numa_pin.base.safefs.replace_private`: readers see the old or the new file, never a part;
    the temporary file starts with a dot, which the collector skips). Raises OSError."""

    directory = os.path.dirname(os.path.abspath(path))
    replace_private(directory, os.path.abspath(path), data, prefix=f".{os.path.basename(path)}.", mode=0o644)


__all__ = ["CONTENT_TYPE", "NodeCollector", "counter_families", "exposition", "node_families", "registry",
           "SCRAPE_DEADLINE_S", "serve_scrape", "write_textfile"]
