"""Reductions over axes (``axis=None`` reduces everything) and softmax."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._opdef import Cost, Prepared, op
from ._checks import check_dtype, count

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


@op("all", data=1, cost=M)
def all(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """Whether every element along ``axis`` is true (non-zero; NaN counts as true; bool)."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims}, None


@op("any", data=1, cost=M)
def any(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """Whether any element along ``axis`` is true (non-zero; NaN counts as true; bool)."""
    return (x,), {"axis": _axes(axis), "keepdims": keepdims}, None


def _k_count_nonzero(xp: Any, x: Any, axis: Any, keepdims: bool) -> Any:
    n = xp.count_nonzero(x, axis=axis, keepdims=keepdims)
    return xp.asarray(n, dtype=xp.int64)  # numpy gives a python int for the whole array


@op(_k_count_nonzero, data=1, cost=M)
def count_nonzero(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """The number of non-zero elements along ``axis`` (int64)."""
    return (x, _axes(axis), keepdims), None, None


def _k_cumulative(xp: Any, x: Any, fn: str, axis: int | None, dtype: Any, include_initial: bool) -> Any:
    x = xp.asarray(x)
    if axis is None:
        if x.ndim != 1:  # the standard requires the axis unless x is 1-d
            raise ValueError(f"axis is required for a {x.ndim}-d input (axis=None only for 1-d)")
        axis = 0
    if include_initial:
        # The identity goes in front of the input, not of the result: the first element
        # after it is then ``identity op x[0]``, as the reference computes it (for complex
        # ``1 * (0+infj)`` is ``nan+infj``, and ``0 + -0.0`` is ``0.0``).
        shape = list(x.shape)
        shape[axis] = 1
        initial = xp.full(shape, 0 if fn == "cumsum" else 1, dtype=x.dtype)
        x = xp.concatenate([initial, x], axis=axis)
    return getattr(xp, fn)(x, axis=axis, dtype=dtype)


@op(_k_cumulative, data=1, cost=M)
def cumulative_sum(
    x: TensorLike, /, *, axis: int | None = None, dtype: DTypeLike | None = None, include_initial: bool = False
) -> Prepared:
    """Cumulative sum along ``axis`` (optional for 1-d ``x``); ``include_initial`` starts with a 0."""
    return (x, "cumsum", axis, check_dtype(dtype, "cumulative_sum"), include_initial), None, None


@op(_k_cumulative, data=1, cost=M)
def cumulative_prod(
    x: TensorLike, /, *, axis: int | None = None, dtype: DTypeLike | None = None, include_initial: bool = False
) -> Prepared:
    """Cumulative product along ``axis`` (optional for 1-d ``x``); ``include_initial`` starts with a 1."""
    return (x, "cumprod", axis, check_dtype(dtype, "cumulative_prod"), include_initial), None, None


def _k_diff(xp: Any, x: Any, axis: int, n: int, prepend: Any, append: Any) -> Any:
    kwargs = {k: v for k, v in (("prepend", prepend), ("append", append)) if v is not None}
    return xp.diff(x, n=n, axis=axis, **kwargs)


@op(_k_diff, data=1, cost=M)
def diff(
    x: TensorLike,
    /,
    *,
    axis: int = -1,
    n: int = 1,
    prepend: TensorLike | None = None,
    append: TensorLike | None = None,
) -> Prepared:
    """The ``n``-th forward difference ``x[i + 1] - x[i]`` along ``axis``, after joining ``prepend``/``append``."""
    return (x, axis, count(n, "n", "diff"), prepend, append), None, None
