"""What a ufunc call returns, known before it runs: the output's shape and dtype.

An output buffer (recycled, or one shared by several chunks) can only be handed to a
ufunc as ``out=`` when its shape and dtype are exactly what NumPy would allocate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ufunc_result"]

_NUMERIC_KINDS = frozenset("biufc")
_PY_SCALARS = (bool, int, float, complex)

# (ufunc, input dtypes / python scalar types) -> result dtype. Bounded: cleared when full.
_dtype_memo: dict[tuple[Any, ...], np.dtype[Any]] = {}
_DTYPE_MEMO_MAX = 4096


def ufunc_result(ufunc: np.ufunc, inputs: Sequence[Any]) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """The shape and dtype ``ufunc(*inputs)`` returns, or ``None`` if it cannot be known beforehand.

    The shape is the inputs' broadcast shape. The dtype is NumPy's own answer: the
    ufunc is called once on zero-size arrays of the inputs' dtypes, with Python
    scalars passed as they are, so NEP 50's rules hold exactly (Python scalars are
    "weak": float32 + 1.0 is float32, bool + 1 is int64). ``None`` for a ufunc with
    several outputs, an input that is neither an array nor a number, shapes that do
    not broadcast, a non-numeric result, or a trial that raises (the real call raises
    the same error, without an ``out=``).
    """
    if not isinstance(ufunc, np.ufunc) or ufunc.nout != 1 or ufunc.nin != len(inputs):
        return None
    memo_key: list[Any] = [ufunc]
    trial: list[Any] = []
    shapes: list[tuple[int, ...]] = []
    for x in inputs:
        if isinstance(x, np.ndarray | np.generic):
            memo_key.append(x.dtype)
            trial.append(np.empty(0, x.dtype))  # NumPy 2: arrays of any ndim and numpy scalars are "strong" alike
            shapes.append(x.shape)
        elif isinstance(x, _PY_SCALARS):
            memo_key.append(type(x))
            trial.append(x)
        else:
            return None
    shape = _broadcast(shapes)
    if shape is None:
        return None
    key = tuple(memo_key)
    dtype = _dtype_memo.get(key)
    # Memoized per input types, not values: int8 + 2**40 raises by value, and may then
    # get int8 predicted from an earlier int8 + 3. Harmless: the call raises the same
    # OverflowError with out= as without (only the taken buffer is not recycled).
    if dtype is None:
        try:
            with np.errstate(all="ignore"):  # a cast warning about the scalar is the real call's to give
                dtype = ufunc(*trial).dtype
        except Exception:
            return None
        if dtype.kind not in _NUMERIC_KINDS:
            return None
        if len(_dtype_memo) >= _DTYPE_MEMO_MAX:
            _dtype_memo.clear()
        _dtype_memo[key] = dtype
    return shape, dtype


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """``np.broadcast_shapes`` (3 µs), skipped in the common case of equal shapes and scalars."""
    distinct = {sh for sh in shapes if sh}
    if len(distinct) <= 1:
        return distinct.pop() if distinct else ()
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return None
