"""A formula used by the tests of compiling and of running programs, on tensors and on numpy."""

from __future__ import annotations

from typing import Any


def formula(t: Any) -> Any:
    """The formula on a tensor (an expression) or an array (numpy's values)."""
    y = t * 2.0 + 1.0
    y = y * y - t
    return abs(y) / 3.0
