"""Reading results in tests: narrowing ops that may return several tensors (``apply``, fused and batched
calls), and an expression's evaluation as comparable data (:func:`outcome`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import aiotensor as at
from aiotensor._expr import Expr


def one(result: at.Tensor | tuple[at.Tensor, ...]) -> at.Tensor:
    """``result``, checked to be a single tensor (not a tuple of outputs)."""
    assert isinstance(result, at.Tensor), f"expected one tensor, got {type(result).__name__}"
    return result


async def outcome(make: Callable[[], Expr], *, ordered: bool = True) -> tuple[Any, ...]:
    """An expression's evaluation as comparable data: its value's dtype, shape and bytes, or its error; its warnings.

    The warnings are ``(category, message)`` in the order they came, or, with
    ``ordered=False``, ``(category name, message)`` sorted (for two paths that may warn
    in another order).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = await make().eval()
            got: tuple[Any, ...] = ("ok", value.dtype, value.shape, np.ascontiguousarray(value).tobytes())
        except Exception as exc:
            got = ("error", type(exc), str(exc))
    if ordered:
        return (*got, [(w.category, str(w.message)) for w in caught])
    return (*got, sorted((w.category.__name__, str(w.message)) for w in caught))
