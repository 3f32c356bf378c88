"""Reductions over axes (``axis=None`` reduces everything) and softmax."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._opdef import Cost, Prepared, op
from ._checks import check_dtype

if TYPE_CHECKING:
    from .._types import AxisLike, DTypeLike, TensorLike

M, F = Cost.MEMORY, Cost.MATH


def _axes(axis: AxisLike) -> Any:
    # numpy checks the value itself (its error then names the op and the input's shape).
    return tuple(axis) if isinstance(axis, list) else axis


def _k_softmax(xp: Any, x: Any, axis: int) -> Any:
    shifted = xp.asarray(x) - xp.max(x, axis=axis, keepdims=True)  # no overflow in exp
    e = xp.exp(shifted)
    return e / xp.sum(e, axis=axis, keepdims=True)


def _k_log_softmax(xp: Any, x: Any, axis: int) -> Any:
    shifted = xp.asarray(x) - xp.max(x, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


@op("sum", data=1, cost=M)
def sum(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False, dtype: DTypeLike | None = None) -> Prepared:
    """Sum over ``axis``."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims, "dtype": check_dtype(dtype, "sum")}, None


@op("prod", data=1, cost=M)
def prod(
    x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False, dtype: DTypeLike | None = None
) -> Prepared:
    """Product over ``axis``."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims, "dtype": check_dtype(dtype, "prod")}, None


@op("mean", data=1, cost=M)
def mean(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """Arithmetic mean over ``axis``."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims}, None


@op("max", data=1, cost=M)
def max(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """Maximum over ``axis`` (an empty reduction raises InvalidArgumentError)."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims}, None


@op("min", data=1, cost=M)
def min(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """Minimum over ``axis`` (an empty reduction raises InvalidArgumentError)."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims}, None


@op("std", data=1, cost=F)
def std(x: TensorLike, /, *, axis: AxisLike = None, correction: float = 0.0, keepdims: bool = False) -> Prepared:
    """Standard deviation over ``axis`` (``correction=1`` for the sample estimate)."""
    return (x,), {"axis": _axes(axis), "correction": correction, "keepdims": keepdims}, None


@op("var", data=1, cost=F)
def var(x: TensorLike, /, *, axis: AxisLike = None, correction: float = 0.0, keepdims: bool = False) -> Prepared:
    """Variance over ``axis`` (``correction=1`` for the sample estimate)."""
    return (x,), {"axis": _axes(axis), "correction": correction, "keepdims": keepdims}, None


@op("argmax", data=1, cost=M)
def argmax(x: TensorLike, /, *, axis: int | None = None, keepdims: bool = False) -> Prepared:
    """Index of the maximum along ``axis`` (of the flattened tensor if ``None``)."""
    return (x,), {"axis": axis, "keepdims": keepdims}, None


@op("argmin", data=1, cost=M)
def argmin(x: TensorLike, /, *, axis: int | None = None, keepdims: bool = False) -> Prepared:
    """Index of the minimum along ``axis`` (of the flattened tensor if ``None``)."""
    return (x,), {"axis": axis, "keepdims": keepdims}, None


@op(_k_softmax, data=1, cost=F)
def softmax(x: TensorLike, /, *, axis: int = -1) -> Prepared:
    """``exp(x) / sum(exp(x))`` along ``axis``, computed without overflow."""
    return (x,), {"axis": axis}, None


@op(_k_log_softmax, data=1, cost=F)
def log_softmax(x: TensorLike, /, *, axis: int = -1) -> Prepared:
    """``log(softmax(x))`` along ``axis``, computed stably."""
    return (x,), {"axis": axis}, None
