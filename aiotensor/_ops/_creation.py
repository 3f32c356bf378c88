"""Creation ops: constants, filled arrays, ranges, identity and seeded random values."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import InvalidArgumentError
from .._kernels import numeric_array
from .._opdef import Cost, Prepared, op
from ._checks import FLOAT64, check_dtype, check_shape, count, count_bytes

if TYPE_CHECKING:
    from .._types import DTypeLike, ShapeLike, TensorLike

C = Cost.CREATE


def _k_constant(xp: Any, value: Any, dtype: Any) -> Any:
    return numeric_array(value, dtype)


def _k_full(xp: Any, shape: tuple[int, ...], fill: Any, dtype: Any) -> Any:
    return xp.full(shape, fill, dtype)


def _k_uniform(xp: Any, shape: tuple[int, ...], low: float, high: float, dtype: Any, seed: int | None) -> Any:
    rng = np.random.default_rng(seed)
    base = rng.random(shape, dtype=np.float32 if dtype == np.float32 else np.float64)
    return (low + (high - low) * base).astype(dtype, copy=False)


def _k_normal(xp: Any, shape: tuple[int, ...], mean: float, stddev: float, dtype: Any, seed: int | None) -> Any:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(shape, dtype=np.float32 if dtype == np.float32 else np.float64)
    return (mean + stddev * base).astype(dtype, copy=False)


def _float_dtype(dtype: DTypeLike | None, op: str) -> np.dtype[Any]:
    dt = check_dtype(dtype, op) or FLOAT64
    if dt.kind != "f":
        raise InvalidArgumentError(f"{op}: dtype must be a float dtype, got {dt}")
    return dt


def _arange_bytes(start: Any, stop: Any, step: Any, dtype: np.dtype[Any] | None) -> int | None:
    # The size before allocating, so that an absurd range fails as ResourceExhaustedError
    # up front (and counts against memory_limit) instead of trying to allocate.
    if not all(isinstance(v, int | float | np.integer | np.floating) for v in (start, stop, step)):
        return None  # complex, tensors, ...: numpy decides, after the kernel
    try:
        span = (float(stop) - float(start)) / float(step)
    except ZeroDivisionError:
        return None  # numpy raises its own error for step 0
    if not math.isfinite(span):
        return None
    itemsize = (dtype or np.result_type(start, stop, step)).itemsize
    return max(0, math.ceil(span)) * itemsize


def _filled(opname: str, shape: ShapeLike, fill: Any, dtype: DTypeLike | None) -> Prepared:
    dims = check_shape(shape, opname)
    dt = check_dtype(dtype, opname) or (np.asarray(fill).dtype if opname == "full" else FLOAT64)
    return (dims, fill, dt), None, count_bytes(dims, dt)


@op(_k_constant, cost=C)
def constant(value: TensorLike, dtype: DTypeLike | None = None, name: str | None = None) -> Prepared:
    """A tensor holding a copy of ``value`` (nested lists, scalars, ndarrays).

    Raises:
        InvalidArgumentError: ``value`` is ragged, not numeric (strings, bytes, objects,
            ``None``), or does not fit ``dtype``. A ``dtype`` never makes strings or
            ``None`` numeric.
    """
    dt = check_dtype(dtype, "constant")
    nbytes = value.size * (dt or value.dtype).itemsize if isinstance(value, np.ndarray) else None
    return (value, dt), None, nbytes


@op(_k_full, cost=C)
def zeros(shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None) -> Prepared:
    """A tensor of zeros (default dtype float64)."""
    return _filled("zeros", shape, 0, dtype)


@op(_k_full, cost=C)
def ones(shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None) -> Prepared:
    """A tensor of ones (default dtype float64)."""
    return _filled("ones", shape, 1, dtype)


@op(_k_full, cost=C)
def full(
    shape: ShapeLike, fill_value: bool | complex, dtype: DTypeLike | None = None, name: str | None = None
) -> Prepared:
    """A tensor filled with ``fill_value`` (dtype inferred from it, as numpy does)."""
    if isinstance(fill_value, np.generic):
        ok = isinstance(fill_value, np.number | np.bool_)  # np.str_("1") is a np.generic too
    else:
        ok = isinstance(fill_value, bool | int | float | complex)
    if not ok:
        raise InvalidArgumentError(f"full: fill_value must be a number, got {type(fill_value).__name__}")
    return _filled("full", shape, fill_value, dtype)


@op("zeros_like", data=1, cost=Cost.MEMORY)
def zeros_like(x: TensorLike, dtype: DTypeLike | None = None, name: str | None = None) -> Prepared:
    """Zeros with the shape (and, by default, the dtype) of ``x``."""
    return (x,), {"dtype": check_dtype(dtype, "zeros_like")}, None


@op("ones_like", data=1, cost=Cost.MEMORY)
def ones_like(x: TensorLike, dtype: DTypeLike | None = None, name: str | None = None) -> Prepared:
    """Ones with the shape (and, by default, the dtype) of ``x``."""
    return (x,), {"dtype": check_dtype(dtype, "ones_like")}, None


@op("arange", cost=C)
def arange(
    start: float, stop: float | None = None, step: float = 1, dtype: DTypeLike | None = None, name: str | None = None
) -> Prepared:
    """Evenly spaced values in ``[start, stop)`` (``arange(n)`` counts from 0), as numpy's ``arange``."""
    lo, hi = (0, start) if stop is None else (start, stop)  # arange(n) counts 0..n-1
    dt = check_dtype(dtype, "arange")
    return (lo, hi, step), {"dtype": dt}, _arange_bytes(lo, hi, step, dt)


@op("linspace", cost=C)
def linspace(
    start: float,
    stop: float,
    num: int = 50,
    endpoint: bool = True,
    dtype: DTypeLike | None = None,
    name: str | None = None,
) -> Prepared:
    """``num`` evenly spaced values from ``start`` to ``stop``."""
    n = count(num, "num", "linspace")
    dt = check_dtype(dtype, "linspace")
    return (start, stop, n), {"endpoint": endpoint, "dtype": dt}, n * (dt or FLOAT64).itemsize


@op("eye", cost=C)
def eye(
    n_rows: int, n_cols: int | None = None, k: int = 0, dtype: DTypeLike | None = None, name: str | None = None
) -> Prepared:
    """A 2-d tensor with ones on diagonal ``k`` and zeros elsewhere."""
    rows = count(n_rows, "n_rows", "eye")
    cols = rows if n_cols is None else count(n_cols, "n_cols", "eye")
    dt = check_dtype(dtype, "eye") or FLOAT64
    return (rows, cols, k), {"dtype": dt}, count_bytes((rows, cols), dt)


@op(_k_uniform, cost=C)
def random_uniform(
    shape: ShapeLike,
    low: float = 0.0,
    high: float = 1.0,
    dtype: DTypeLike | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Prepared:
    """Uniform values in ``[low, high)``; the same ``seed`` gives the same values."""
    dims = check_shape(shape, "random_uniform")
    dt = _float_dtype(dtype, "random_uniform")
    return (dims, low, high, dt, seed), None, count_bytes(dims, dt)


@op(_k_normal, cost=C)
def random_normal(
    shape: ShapeLike,
    mean: float = 0.0,
    stddev: float = 1.0,
    dtype: DTypeLike | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Prepared:
    """Normal values of the given mean and standard deviation; the same ``seed`` gives the same values."""
    dims = check_shape(shape, "random_normal")
    dt = _float_dtype(dtype, "random_normal")
    return (dims, mean, stddev, dt, seed), None, count_bytes(dims, dt)
