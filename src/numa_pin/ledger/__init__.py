"""The crash-safe node ledger: who holds which CPUs, NUMA nodes, memory and devices.

* :mod:`~numa_pin.ledger.model` — frozen :class:`Grant`, :class:`PodRecord` and
  :class:`LedgerState` with pure queries and updates (no I/O);
* :mod:`~numa_pin.ledger.records` — the small records a grant carries (:class:`GpuAccess`);
* :mod:`~numa_pin.ledger.store` — :class:`Ledger`: checksummed JSON file, lock-free
  reads, ``flock``-serialised transactions with atomic, fsynced replacement;
* :mod:`~numa_pin.ledger.transaction` — :class:`Transaction`, the view a transaction's
  ``with`` block works on (pure);
* :mod:`~numa_pin.ledger.liveness` — :func:`is_alive` (pid + start time, or cgroup) and
  the pure :func:`collect_garbage`.

Standard library only.
"""

from numa_pin.ledger.liveness import collect_garbage, is_alive
from numa_pin.ledger.model import (
    KIND_EXCLUSIVE,
    KIND_PROCESS,
    KIND_SHARED,
    LEDGER_VERSION,
    Grant,
    LedgerState,
    PodNetdev,
    PodRecord,
)
from numa_pin.ledger.records import GpuAccess
from numa_pin.ledger.store import Ledger, Transaction

__all__ = [
    "KIND_EXCLUSIVE",
    "KIND_PROCESS",
    "KIND_SHARED",
    "LEDGER_VERSION",
    "GpuAccess",
    "Grant",
    "Ledger",
    "LedgerState",
    "PodNetdev",
    "PodRecord",
    "Transaction",
    "collect_garbage",
    "is_alive",
]
