"""Creation ops: constants, filled arrays, ranges, identity and seeded random values."""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import InvalidArgumentError
from ._base import OpsBase, check_dtype, check_shape, count_bytes

if TYPE_CHECKING:
    from .._tensor import Tensor
    from .._types import DTypeLike, ShapeLike, TensorLike

__all__ = ["CreationOps"]

_FLOAT64 = np.dtype(np.float64)


def _k_constant(value: Any, dtype: np.dtype[Any] | None) -> np.ndarray[Any, Any]:
    arr = np.array(value, dtype=dtype)  # a copy: later changes to the caller's array don't leak in
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"data of dtype {arr.dtype} is not numeric; tensors hold bool, integer, float or complex data")
    return arr


def _k_uniform(
    shape: tuple[int, ...], low: float, high: float, dtype: np.dtype[Any], seed: int | None
) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    base = rng.random(shape, dtype=np.float32 if dtype == np.float32 else np.float64)
    return (low + (high - low) * base).astype(dtype, copy=False)


def _k_normal(
    shape: tuple[int, ...], mean: float, stddev: float, dtype: np.dtype[Any], seed: int | None
) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(shape, dtype=np.float32 if dtype == np.float32 else np.float64)
    return (mean + stddev * base).astype(dtype, copy=False)


def _float_dtype(dtype: DTypeLike | None, op: str) -> np.dtype[Any]:
    dt = check_dtype(dtype, op) or _FLOAT64
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


def _count(value: int, what: str, op: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{op}: {what} must be an int, got {value!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"{op}: {what} must be >= 0, got {n}")
    return n


class CreationOps(OpsBase):
    """Ops that make tensors from python values or from nothing."""

    async def constant(self, value: TensorLike, dtype: DTypeLike | None = None, name: str | None = None) -> Tensor:
        """A tensor holding a copy of ``value`` (nested lists, scalars, ndarrays).

        Raises:
            InvalidArgumentError: ``value`` is ragged, not numeric (strings, objects,
                ``None``), or does not fit ``dtype``.
        """
        dt = check_dtype(dtype, "constant")
        nbytes = None
        if isinstance(value, np.ndarray):
            nbytes = value.size * (dt or value.dtype).itemsize
        return await self._op("constant", _k_constant, (value, dt), name=name, nbytes=nbytes)

    asarray = constant

    async def _filled(self, op: str, shape: ShapeLike, fill: Any, dtype: DTypeLike | None, name: str | None) -> Tensor:
        dims = check_shape(shape, op)
        dt = check_dtype(dtype, op) or (np.asarray(fill).dtype if op == "full" else _FLOAT64)
        return await self._op(op, np.full, (dims, fill, dt), name=name, nbytes=count_bytes(dims, dt))

    async def zeros(self, shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None) -> Tensor:
        """A tensor of zeros (default dtype float64)."""
        return await self._filled("zeros", shape, 0, dtype, name)

    async def ones(self, shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None) -> Tensor:
        """A tensor of ones (default dtype float64)."""
        return await self._filled("ones", shape, 1, dtype, name)

    async def full(
        self, shape: ShapeLike, fill_value: bool | complex, dtype: DTypeLike | None = None, name: str | None = None
    ) -> Tensor:
        """A tensor filled with ``fill_value`` (dtype inferred from it, as numpy does)."""
        if not isinstance(fill_value, bool | int | float | complex | np.generic):
            raise InvalidArgumentError(f"full: fill_value must be a number, got {type(fill_value).__name__}")
        return await self._filled("full", shape, fill_value, dtype, name)

    async def zeros_like(self, x: TensorLike, dtype: DTypeLike | None = None, name: str | None = None) -> Tensor:
        """Zeros with the shape (and, by default, the dtype) of ``x``."""
        dt = check_dtype(dtype, "zeros_like")
        return await self._op("zeros_like", np.zeros_like, (x,), {"dtype": dt}, name=name, data=1)

    async def ones_like(self, x: TensorLike, dtype: DTypeLike | None = None, name: str | None = None) -> Tensor:
        """Ones with the shape (and, by default, the dtype) of ``x``."""
        dt = check_dtype(dtype, "ones_like")
        return await self._op("ones_like", np.ones_like, (x,), {"dtype": dt}, name=name, data=1)

    async def arange(
        self,
        start: float,
        stop: float | None = None,
        step: float = 1,
        dtype: DTypeLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Evenly spaced values in ``[start, stop)`` (``arange(n)`` counts from 0), as numpy's ``arange``."""
        lo, hi = (0, start) if stop is None else (start, stop)  # arange(n) counts 0..n-1
        dt = check_dtype(dtype, "arange")
        nbytes = _arange_bytes(lo, hi, step, dt)
        return await self._op("arange", np.arange, (lo, hi, step), {"dtype": dt}, name=name, nbytes=nbytes)

    async def linspace(
        self,
        start: float,
        stop: float,
        num: int = 50,
        endpoint: bool = True,
        dtype: DTypeLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """``num`` evenly spaced values from ``start`` to ``stop``."""
        n = _count(num, "num", "linspace")
        dt = check_dtype(dtype, "linspace")
        return await self._op(
            "linspace",
            np.linspace,
            (start, stop, n),
            {"endpoint": endpoint, "dtype": dt},
            name=name,
            nbytes=n * (dt or _FLOAT64).itemsize,
        )

    async def eye(
        self,
        n_rows: int,
        n_cols: int | None = None,
        k: int = 0,
        dtype: DTypeLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """A 2-d tensor with ones on diagonal ``k`` and zeros elsewhere."""
        rows = _count(n_rows, "n_rows", "eye")
        cols = rows if n_cols is None else _count(n_cols, "n_cols", "eye")
        dt = check_dtype(dtype, "eye") or _FLOAT64
        return await self._op(
            "eye", np.eye, (rows, cols, k), {"dtype": dt}, name=name, nbytes=count_bytes((rows, cols), dt)
        )

    async def random_uniform(
        self,
        shape: ShapeLike,
        low: float = 0.0,
        high: float = 1.0,
        dtype: DTypeLike | None = None,
        seed: int | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Uniform values in ``[low, high)``; the same ``seed`` gives the same values."""
        dims = check_shape(shape, "random_uniform")
        dt = _float_dtype(dtype, "random_uniform")
        return await self._op(
            "random_uniform", _k_uniform, (dims, low, high, dt, seed), name=name, nbytes=count_bytes(dims, dt)
        )

    async def random_normal(
        self,
        shape: ShapeLike,
        mean: float = 0.0,
        stddev: float = 1.0,
        dtype: DTypeLike | None = None,
        seed: int | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Normal values of the given mean and standard deviation; the same ``seed`` gives the same values."""
        dims = check_shape(shape, "random_normal")
        dt = _float_dtype(dtype, "random_normal")
        return await self._op(
            "random_normal", _k_normal, (dims, mean, stddev, dt, seed), name=name, nbytes=count_bytes(dims, dt)
        )
