"""SessionConfig and ResourceCleanupStrategy."""

from __future__ import annotations

import dataclasses

import pytest

import aiotensor as at


def test_strategy_enum_has_exactly_the_three_tf_values() -> None:
    assert [s.name for s in at.ResourceCleanupStrategy] == ["IN_BACKGROUND", "ON_SAFE_POINTS", "ON_SESSION_CLOSE"]


def test_config_defaults_and_immutability() -> None:
    config = at.SessionConfig()
    assert (config.allow_soft_placement, config.log_device_placement, config.max_workers, config.memory_limit) == (
        False,
        False,
        None,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_workers = 2  # type: ignore[misc]


@pytest.mark.parametrize("field", ["max_workers", "memory_limit"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_config_rejects_bad_sizes(field: str, bad: object) -> None:
    with pytest.raises(at.InvalidArgumentError, match=field):
        at.SessionConfig(**{field: bad})  # type: ignore[arg-type]
