"""SHA-256 hex digests without OpenSSL's start-up cost where it does not pay.

:mod:`hashlib` loads OpenSSL (``_hashlib``), about 2 ms of every hook process that only hashes a
few short strings (reason-file and cache names, the config fingerprint, a small ledger's
checksum). CPython's own SHA-256 module gives the same digests and loads in microseconds, but
hashes several times slower than OpenSSL with the CPU's SHA instructions (2.6 against 0.5 ms for
a busy node's 900 KiB ledger, hashed on every read and every commit): data of :data:`LARGE`
bytes or more goes to :mod:`hashlib`. :mod:`hashlib` is also used where an interpreter was built
without the module. Pure.
"""

from __future__ import annotations

try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # CPython 3.11 (Debian 12)
except ImportError:  # other interpreters and versions
    from hashlib import sha256 as _sha256

#: from this many bytes on, OpenSSL's hashing outweighs its load (once per process)
LARGE = 256 << 10


def sha256_hex(data: bytes) -> str:
    """The SHA-256 digest of ``data`` as 64 lowercase hex digits (``hashlib.sha256(data).hexdigest()``)."""
    if len(data) >= LARGE:
        from hashlib import sha256

        return sha256(data).hexdigest()
    return _sha256(data).hexdigest()


def sha256_hex_parts(*parts: bytes) -> str:
    """:func:`sha256_hex` of the concatenation of ``parts``, without making it."""
    if sum(map(len, parts)) >= LARGE:
        from hashlib import sha256

        h = sha256()
    else:
        h = _sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


__all__ = ["LARGE", "sha256_hex", "sha256_hex_parts"]
