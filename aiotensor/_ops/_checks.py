"""Argument checks the op specs share: they run on the caller's side, before any kernel."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._devices import canonical_device
from .._errors import InvalidArgumentError, InvalidDeviceError
from .._kernels import NUMERIC_KINDS

if TYPE_CHECKING:
    from .._types import AxisLike, DTypeLike

__all__ = [
    "FLOAT64",
    "axes",
    "check_copy",
    "check_device",
    "check_dtype",
    "check_shape",
    "count",
    "count_bytes",
    "integer",
    "ints",
    "real",
    "sequence",
]

FLOAT64 = np.dtype(np.float64)


def check_dtype(dtype: DTypeLike | None, op: str) -> np.dtype[Any] | None:
    """``np.dtype(dtype)`` if it is numeric, ``None`` for ``None``; else InvalidArgumentError."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as exc:  # a malformed string like "i4,," parses as code
        raise InvalidArgumentError(f"{op}: {dtype!r} is not a dtype ({exc})") from None
    if dt.kind not in NUMERIC_KINDS:
        raise InvalidArgumentError(
            f"{op}: dtype {dt} is not numeric; tensors hold bool, integer, float or complex data"
        )
    return dt


def check_shape(shape: int | Sequence[int], op: str) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints; else InvalidArgumentError."""
    dims = (shape,) if isinstance(shape, int | np.integer) else shape
    try:
        out = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise InvalidArgumentError(f"{op}: shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in out):
        raise InvalidArgumentError(f"{op}: shape {out} has a negative dimension")
    return out


def count_bytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes of an array of this shape and dtype, in exact integer arithmetic."""
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def ints(value: Any, what: str, op: str) -> int | tuple[int, ...]:
    """One int, or several as a tuple (numpy takes several axes only as a tuple).

    Checked on the caller's side so that a bad value is an InvalidArgumentError rather
    than a TypeError from deep inside the kernel.
    """
    try:
        if isinstance(value, int | np.integer):
            return operator.index(value)
        return tuple(operator.index(v) for v in value)
    except TypeError:
        raise InvalidArgumentError(f"{op}: {what} must be an int or a sequence of ints, got {value!r:.60}") from None


def axes(axis: AxisLike, op: str) -> int | tuple[int, ...] | None:
    """An axis argument: None, an int, or a tuple of ints."""
    return None if axis is None else ints(axis, "axis", op)


def count(value: int, what: str, op: str) -> int:
    """A non-negative int argument (a length, a number of rows)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{op}: {what} must be an int, got {value!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"{op}: {what} must be >= 0, got {n}")
    return n


def sequence(xs: Any, op: str) -> list[Any]:
    """The tensors of concat/stack: a non-empty list or tuple."""
    if not isinstance(xs, list | tuple):
        raise InvalidArgumentError(f"{op}: expected a sequence of tensors, got {type(xs).__name__}")
    if not xs:
        raise InvalidArgumentError(f"{op}: needs at least one tensor")
    return list(xs)


def check_device(device: str | None, op: str) -> str | None:
    """The standard's ``device=``: ``None`` or a device name (``"/cpu:0"``), canonical; else InvalidArgumentError.

    Only the name's form is checked here, where no session is known: the op runs on the
    device its session places it on (``with s.device(...)``).
    """
    if device is None:
        return None
    try:
        return canonical_device(device)
    except InvalidDeviceError as exc:
        raise InvalidArgumentError(f"{op}: device: {exc}") from None


def check_copy(copy: bool | None, op: str) -> bool | None:
    """The standard's ``copy=``: ``None``, ``True`` or ``False``; else InvalidArgumentError."""
    if copy is not None and not isinstance(copy, bool):
        raise InvalidArgumentError(f"{op}: copy must be None or a bool, got {copy!r:.60}")
    return copy


def integer(value: Any, what: str, op: str) -> int:
    """An int argument (a bool is refused: ``n=True`` is a mistake, not 1); else InvalidArgumentError."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{op}: {what} must be an int, got a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{op}: {what} must be an int, got {value!r:.40}") from None


def real(value: Any, what: str, op: str) -> float:
    """A real-number argument (int or float, not a bool) as a float; else InvalidArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidArgumentError(f"{op}: {what} must be a real number, got {value!r:.40}")
    return float(value)
