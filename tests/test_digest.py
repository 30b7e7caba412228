"""numa_pin.base.digest: the same digests as hashlib on both sides of the size where it switches."""

from __future__ import annotations

import hashlib
import os

import pytest

from numa_pin.base import digest


@pytest.mark.parametrize("size", [0, 1, 64, digest.LARGE - 1, digest.LARGE, digest.LARGE + 1, 3 * digest.LARGE],
                         ids=["empty", "one", "block", "below", "at", "above", "ledger"])
def test_sha256_hex_is_hashlibs_digest(size: int) -> None:
    data = os.urandom(size)
    assert digest.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_small_data_never_loads_openssl(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook that hashes only short strings keeps OpenSSL unloaded (its start-up cost)."""
    import sys

    monkeypatch.delitem(sys.modules, "hashlib", raising=False)
    digest.sha256_hex(b"x" * 1024)
    assert "hashlib" not in sys.modules


@pytest.mark.parametrize("sizes", [(), (0, 0), (1, 2, 3), (digest.LARGE - 10, 5, 5), (digest.LARGE, 1), (7, 2 * digest.LARGE)],
                         ids=["none", "empty", "small", "at", "above", "ledger"])
def test_sha256_hex_parts_is_hashlibs_digest_of_their_concatenation(sizes: tuple[int, ...]) -> None:
    parts = [os.urandom(n) for n in sizes]
    assert digest.sha256_hex_parts(*parts) == hashlib.sha256(b"".join(parts)).hexdigest()
