"""Fixtures the NRI tests share: the kit's built machines for the module, and NRI's messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from numa_pin.nri import messages as nri_messages


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("machines")


@pytest.fixture(scope="module")
def m() -> nri_messages.Messages:
    return nri_messages.load()
