"""Creation ops: constants, filled arrays, ranges, identity and seeded random values."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import InvalidArgumentError
from .._kernels import numeric_array
from .._opdef import Cost, Prepared, op
from ._checks import FLOAT64, check_copy, check_device, check_dtype, check_shape, count, count_bytes

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


def check_fill(fill_value: Any, op: str) -> Any:
    """``fill_value`` if it is a number (python or numpy); else InvalidArgumentError."""
    if isinstance(fill_value, np.generic):
        ok = isinstance(fill_value, np.number | np.bool_)  # np.str_("1") is a np.generic too
    else:
        ok = isinstance(fill_value, bool | int | float | complex)
    if not ok:
        raise InvalidArgumentError(f"{op}: fill_value must be a number, got {type(fill_value).__name__}")
    return fill_value


def _filled(opname: str, shape: ShapeLike, fill: Any, dtype: DTypeLike | None) -> Prepared:
    dims = check_shape(shape, opname)
    dt = check_dtype(dtype, opname) or (np.asarray(fill).dtype if opname == "full" else FLOAT64)
    return (dims, fill, dt), None, count_bytes(dims, dt)


@op(_k_constant, cost=C)
def constant(
    value: TensorLike,
    dtype: DTypeLike | None = None,
    name: str | None = None,
    *,
    device: str | None = None,
    copy: bool | None = None,
) -> Prepared:
    """A tensor holding a copy of ``value`` (nested lists, scalars, ndarrays, tensors).

    ``device`` and ``copy`` are the standard's keywords of ``asarray``: the tensor is
    made on the device its session places the op on (``device`` must be ``None`` or a
    device name), and it always owns a copy, so ``copy=False`` (never copy) raises.

    Raises:
        InvalidArgumentError: ``value`` is ragged, not numeric (strings, bytes, objects,
            ``None``), or does not fit ``dtype``. A ``dtype`` never makes strings or
            ``None`` numeric. ``copy=False``: a tensor owns its memory, so a copy is needed.
    """
    check_device(device, "constant")
    if check_copy(copy, "constant") is False:
        raise InvalidArgumentError("constant: copy=False, but a tensor always owns a copy of its data")
    dt = check_dtype(dtype, "constant")
    nbytes = value.size * (dt or value.dtype).itemsize if isinstance(value, np.ndarray) else None
    return (value, dt), None, nbytes


@op(_k_full, cost=C)
def zeros(
    shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None, *, device: str | None = None
) -> Prepared:
    """A tensor of zeros (default dtype float64)."""
    check_device(device, "zeros")
    return _filled("zeros", shape, 0, dtype)


@op(_k_full, cost=C)
def ones(
    shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None, *, device: str | None = None
) -> Prepared:
    """A tensor of ones (default dtype float64)."""
    check_device(device, "ones")
    return _filled("ones", shape, 1, dtype)


@op(_k_full, cost=C)
def full(
    shape: ShapeLike,
    fill_value: bool | complex,
    dtype: DTypeLike | None = None,
    name: str | None = None,
    *,
    device: str | None = None,
) -> Prepared:
    """A tensor filled with ``fill_value`` (dtype inferred from it, as numpy does)."""
    check_device(device, "full")
    return _filled("full", shape, check_fill(fill_value, "full"), dtype)


@op("zeros_like", data=1, cost=Cost.MEMORY)
def zeros_like(
    x: TensorLike, dtype: DTypeLike | None = None, name: str | None = None, *, device: str | None = None
) -> Prepared:
    """Zeros with the shape (and, by default, the dtype) of ``x``."""
    check_device(device, "zeros_like")
    return (x,), {"dtype": check_dtype(dtype, "zeros_like")}, None


@op("ones_like", data=1, cost=Cost.MEMORY)
def ones_like(
    x: TensorLike, dtype: DTypeLike | None = None, name: str | None = None, *, device: str | None = None
) -> Prepared:
    """Ones with the shape (and, by default, the dtype) of ``x``."""
    check_device(device, "ones_like")
    return (x,), {"dtype": check_dtype(dtype, "ones_like")}, None


@op("arange", cost=C)
def arange(
    start: float,
    stop: float | None = None,
    step: float = 1,
    dtype: DTypeLike | None = None,
    name: str | None = None,
    *,
    device: str | None = None,
) -> Prepared:
    """Evenly spaced values in ``[start, stop)`` (``arange(n)`` counts from 0), as numpy's ``arange``."""
    lo, hi = (0, start) if stop is None else (start, stop)  # arange(n) counts 0..n-1
    check_device(device, "arange")
    dt = check_dtype(dtype, "arange")
    return (lo, hi, step), {"dtype": dt}, _arange_bytes(lo, hi, step, dt)


@op("linspace", cost=C)
def linspace(
    start: complex,  # (a float or an int too: complex bounds give complex values)
    stop: complex,
    num: int = 50,
    endpoint: bool = True,
    dtype: DTypeLike | None = None,
    name: str | None = None,
    *,
    device: str | None = None,
) -> Prepared:
    """``num`` evenly spaced values from ``start`` to ``stop`` (without ``stop`` unless ``endpoint``).

    Real bounds give float64 values, complex bounds complex128 (unless ``dtype`` says otherwise).
    """
    check_device(device, "linspace")
    n = count(num, "num", "linspace")
    dt = check_dtype(dtype, "linspace")
    if dt is None and any(isinstance(v, complex | np.complexfloating) for v in (start, stop)):
        itemsize = 16  # complex bounds give complex128 values
    else:
        itemsize = (dt or FLOAT64).itemsize
    return (start, stop, n), {"endpoint": endpoint, "dtype": dt}, n * itemsize


@op("eye", cost=C)
def eye(
    n_rows: int,
    n_cols: int | None = None,
    k: int = 0,
    dtype: DTypeLike | None = None,
    name: str | None = None,
    *,
    device: str | None = None,
) -> Prepared:
    """A 2-d tensor with ones on diagonal ``k`` and zeros elsewhere."""
    check_device(device, "eye")
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


@op(_k_full, cost=C)
def empty(
    shape: ShapeLike, dtype: DTypeLike | None = None, name: str | None = None, *, device: str | None = None
) -> Prepared:
    """A tensor whose contents the standard leaves unspecified: zeros here (default dtype float64).

    Zeros rather than uninitialized memory, so that a tensor never shows the bytes of
    one freed before it (another request's data, in a service).
    """
    check_device(device, "empty")
    return _filled("empty", shape, 0, dtype)


def _k_full_like(xp: Any, x: Any, fill: Any, dtype: Any) -> Any:
    return xp.full_like(x, fill, dtype=dtype)


@op(_k_full_like, data=1, cost=Cost.MEMORY)
def empty_like(x: TensorLike, /, *, dtype: DTypeLike | None = None, device: str | None = None) -> Prepared:
    """A tensor of ``x``'s shape (and, by default, dtype) with unspecified contents: zeros here."""
    check_device(device, "empty_like")
    return (x, 0, check_dtype(dtype, "empty_like")), None, None


@op(_k_full_like, data=1, cost=Cost.MEMORY)
def full_like(
    x: TensorLike, /, fill_value: bool | complex, *, dtype: DTypeLike | None = None, device: str | None = None
) -> Prepared:
    """``fill_value`` in the shape (and, by default, the dtype) of ``x``."""
    check_device(device, "full_like")
    return (x, check_fill(fill_value, "full_like"), check_dtype(dtype, "full_like")), None, None


def _k_triangle(xp: Any, x: Any, fn: str, k: int) -> Any:
    x = xp.asarray(x)
    if x.ndim < 2:  # numpy would treat a vector as the rows of a square matrix
        raise ValueError(f"x must have at least 2 dimensions, got {x.ndim}")
    return getattr(xp, fn)(x, k=k)


@op(_k_triangle, data=1, cost=Cost.MEMORY)
def tril(x: TensorLike, /, *, k: int = 0) -> Prepared:
    """The lower triangle of each matrix of ``x``: zeros above diagonal ``k`` (the last two dimensions)."""
    return (x, "tril", _diagonal(k, "tril")), None, None


@op(_k_triangle, data=1, cost=Cost.MEMORY)
def triu(x: TensorLike, /, *, k: int = 0) -> Prepared:
    """The upper triangle of each matrix of ``x``: zeros below diagonal ``k`` (the last two dimensions)."""
    return (x, "triu", _diagonal(k, "triu")), None, None


def _diagonal(k: Any, op: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise InvalidArgumentError(f"{op}: k must be an int, got {k!r:.60}")
    return int(k)


def _k_from_dlpack(xp: Any, x: Any) -> Any:
    # (Checked here, not in the spec: a tensor argument arrives as its buffer, an ndarray.)
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{type(x).__name__} does not support DLPack (no __dlpack__)")
    # A copy: the producer (torch, another numpy array) may change its memory later.
    return xp.array(xp.from_dlpack(x), copy=True)


@op(_k_from_dlpack, cost=C)
def from_dlpack(x: Any, /, *, device: str | None = None, copy: bool | None = None) -> Prepared:
    """A tensor holding a copy of the data of ``x``, any object with ``__dlpack__`` (a torch tensor, an ndarray).

    ``copy=False`` (never copy) raises: a tensor always owns its memory.
    """
    check_device(device, "from_dlpack")
    if check_copy(copy, "from_dlpack") is False:
        raise InvalidArgumentError("from_dlpack: copy=False, but a tensor always owns a copy of its data")
    return (x,), None, None


def _k_meshgrid(xp: Any, *arrays: Any, indexing: str) -> list[Any]:
    return list(xp.meshgrid(*[xp.asarray(a) for a in arrays], indexing=indexing))


# UNKNOWN: the grids hold the product of the inputs' sizes, which the cost model cannot see.
@op(_k_meshgrid, cost=Cost.UNKNOWN, returns="list")
def meshgrid(*arrays: TensorLike, indexing: str = "xy") -> Prepared:
    """Coordinate grids from 1-d tensors, as a list (``indexing="xy"``: Cartesian, ``"ij"``: matrix)."""
    if indexing not in ("xy", "ij"):
        raise InvalidArgumentError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r:.60}")
    return arrays, {"indexing": indexing}, None
