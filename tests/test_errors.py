"""The errors that name a file, namespace or socket keep its path and the OS error number."""

from __future__ import annotations

import errno

import pytest

from numa_pin.errors import AgentError, EnforcementError, LedgerError, LedgerLockTimeout, NumaPinError

CLASSES = [LedgerError, LedgerLockTimeout, EnforcementError, AgentError]


def _raised(cls: type[NumaPinError], given: int | None) -> NumaPinError:
    try:
        try:
            raise OSError(errno.ENOENT, "No such file or directory")
        except OSError as exc:
            raise cls("cannot open", path="/run/numa-pin/x", errno=given) from exc  # type: ignore[call-arg]
    except NumaPinError as error:
        return error
    raise AssertionError("not raised")


@pytest.mark.parametrize("cls", CLASSES, ids=[c.__name__ for c in CLASSES])
@pytest.mark.parametrize("given, expected", [(None, errno.ENOENT), (errno.EACCES, errno.EACCES)],
                         ids=["from-cause", "given"])
def test_errno_is_given_or_taken_from_the_cause(cls, given, expected):
    error = _raised(cls, given)
    assert error.errno == expected  # type: ignore[attr-defined]
    assert error.path == "/run/numa-pin/x" and str(error) == "/run/numa-pin/x: cannot open"  # type: ignore[attr-defined]
    assert error.kind == cls.__name__
