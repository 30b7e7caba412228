"""SHA-256 hex digests without OpenSSL's start-up cost.

:mod:`hashlib` loads OpenSSL (``_hashlib``), about 2 ms of every hook process that only hashes a
few short strings (the ledger's checksum, reason-file and cache names, the config fingerprint).
CPython's own SHA-256 module gives the same digests and loads in microseconds; :mod:`hashlib` is
used where an interpreter was built without it. Pure.
"""

from __future__ import annotations

try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # CPython 3.11 (Debian 12)
except ImportError:  # other interpreters and versions
    from hashlib import sha256 as _sha256


def sha256_hex(data: bytes) -> str:
    """The SHA-256 digest of ``data`` as 64 lowercase hex digits (``hashlib.sha256(data).hexdigest()``)."""
    return _sha256(data).hexdigest()


__all__ = ["sha256_hex"]
