"""Device name normalization."""

from __future__ import annotations

import pytest

from aiotensor import InvalidDeviceError
from aiotensor._devices import CPU0, canonical_device


@pytest.mark.parametrize("name", ["/cpu:0", "cpu:0", "CPU", "/CPU:0", "/device:CPU:0", " cpu "])
def test_spellings_of_cpu0(name: str) -> None:
    assert canonical_device(name) == CPU0


def test_other_devices_keep_their_kind_and_index() -> None:
    assert canonical_device("/GPU:1") == "/gpu:1"
    assert canonical_device("worker:3") == "/worker:3"


@pytest.mark.parametrize("bad", ["", "/", "cpu:x", "1cpu", "/cpu:0:1", 3, None])
def test_malformed_names(bad: object) -> None:
    with pytest.raises(InvalidDeviceError):
        canonical_device(bad)
