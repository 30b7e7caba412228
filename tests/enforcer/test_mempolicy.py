"""The memory policy words, and the kernel's answer to set_mempolicy (issue 26, section 4).

The run and precreate paths are proven elsewhere against the kernel's own account
(``/proc/<pid>/numa_maps``: tests/e2e/test_run_cmd.py) and the written spec
(tests/hook/test_precreate.py); here the pieces.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from numa_pin.enforcer import mempolicy
from numa_pin.errors import RequestError
from numa_pin.requests.request import MEMORY_POLICIES, request_from_oci


def test_every_request_word_has_a_kernel_and_a_runtime_spec_mode():
    assert tuple(mempolicy.MODES) == MEMORY_POLICIES
    # the kernel's uapi numbering (include/uapi/linux/mempolicy.h), an independent table
    assert {w: n for w, (n, _) in mempolicy.MODES.items()} == {
        "bind": 2, "interleave": 3, "preferred-many": 5, "weighted-interleave": 6}


def test_an_unknown_policy_is_named():
    with pytest.raises(RequestError, match="numa-pin.io/memory-policy.*unknown value 'spread'"):
        request_from_oci("c", {"numa-pin.io/memory-policy": "spread"})


@pytest.mark.parametrize("word", ["", "interleave"], ids=["none", "interleave"])
def test_encode_then_apply_in_a_child(word):
    message = mempolicy.encode(word or None, frozenset({0}))
    code = ("import sys; from numa_pin.enforcer.mempolicy import apply_in_child; "
            f"apply_in_child({message!r}); print(open('/proc/self/numa_maps').readline())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert ("interleave:0" in out) == bool(word) and (" default " in out) == (not word)


def test_the_kernel_refusal_is_one_line_with_what_was_asked():
    code = ("from numa_pin.enforcer.mempolicy import set_mempolicy\n"
            "try:\n    set_mempolicy('bind', frozenset({1000}))\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("EnforcementError set_mempolicy bind nodes 1000: ") and out.count("\n") == 1
