"""The functions of :mod:`aiotensor.xp` that are not one op applied to its arguments.

Creation functions take the standard's ``device=`` (the CPU: a tensor lives on its
session's device) and give tensor-less expressions, evaluated in the session that runs
them. Functions with several results return one expression per result, all reading one
node. Where the standard names an op the table does not have yet, the function says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._errors import IndexOutOfRangeError, InvalidDeviceError
from .._expr import Expr, Operand
from .._meta import broadcast
from .._opdef import INTERNAL_OPS, OPS
from ._node import meta_shape, node, several

if TYPE_CHECKING:
    from .._types import DTypeLike, ShapeLike, TensorLike

__all__ = [
    "CPU",
    "NEEDS_OP",
    "Info",
    "UniqueAllResult",
    "UniqueCountsResult",
    "UniqueInverseResult",
    "__array_namespace_info__",
    "arange",
    "asarray",
    "astype",
    "broadcast_arrays",
    "broadcast_shapes",
    "empty",
    "empty_like",
    "eye",
    "from_dlpack",
    "full",
    "full_like",
    "linspace",
    "matrix_transpose",
    "meshgrid",
    "ones",
    "ones_like",
    "positive",
    "unique_all",
    "unique_counts",
    "unique_inverse",
    "unstack",
    "zeros",
    "zeros_like",
]

#: The device of every tensor of a local session.
CPU = "/cpu:0"
#: Hand-written functions that need an op the table may not have yet: absent until it does.
NEEDS_OP = {"unique_all": "unique_all", "unique_counts": "unique_counts", "unique_inverse": "unique_inverse"}


def _device(device: Any, fn: str) -> None:
    if device is not None and str(device) not in (CPU, "cpu"):
        raise InvalidDeviceError(f"{fn}: device {device!r} is not one of {Info().devices()}")


# -- creation ------------------------------------------------------------------------------
def asarray(obj: Any, /, *, dtype: DTypeLike | None = None, device: Any = None, copy: bool | None = None) -> Expr:
    """``obj`` (a tensor, expression, array, number or nested sequence) as an array expression of ``dtype``."""
    _device(device, "asarray")
    if isinstance(obj, Operand):
        if dtype is not None:
            return node(OPS["astype"], (obj, dtype), None)
        return Expr(OPS["getitem"], (obj, Ellipsis), None, None)
    if copy is False and not isinstance(obj, np.ndarray | np.generic):
        raise ValueError("asarray: copy=False, but a Python object needs a copy to become an array")
    return node(OPS["constant"], (obj,), {"dtype": dtype})


def from_dlpack(x: Any, /, *, device: Any = None, copy: bool | None = None) -> Expr:
    """An array expression holding the value of a DLPack producer ``x`` (copied into the evaluating session)."""
    _device(device, "from_dlpack")
    return asarray(np.from_dlpack(x))


def zeros(shape: ShapeLike, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """An array of zeros (float64 by default)."""
    _device(device, "zeros")
    return node(OPS["zeros"], (shape,), {"dtype": dtype})


def ones(shape: ShapeLike, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """An array of ones (float64 by default)."""
    _device(device, "ones")
    return node(OPS["ones"], (shape,), {"dtype": dtype})


def empty(shape: ShapeLike, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """An array of ``shape`` whose values are unspecified (zeros here)."""
    return zeros(shape, dtype=dtype, device=device)


def full(shape: ShapeLike, fill_value: bool | complex, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """An array filled with ``fill_value`` (its dtype inferred from it, as the standard says)."""
    _device(device, "full")
    return node(OPS["full"], (shape, fill_value), {"dtype": dtype})


def zeros_like(x: TensorLike, /, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """Zeros with the shape (and, by default, the dtype) of ``x``."""
    _device(device, "zeros_like")
    return node(OPS["zeros_like"], (x,), {"dtype": dtype})


def ones_like(x: TensorLike, /, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """Ones with the shape (and, by default, the dtype) of ``x``."""
    _device(device, "ones_like")
    return node(OPS["ones_like"], (x,), {"dtype": dtype})


def empty_like(x: TensorLike, /, *, dtype: DTypeLike | None = None, device: Any = None) -> Expr:
    """An array with the shape (and, by default, the dtype) of ``x``, values unspecified (zeros here)."""
    return zeros_like(x, dtype=dtype, device=device)


def full_like(
    x: TensorLike, /, fill_value: bool | complex, *, dtype: DTypeLike | None = None, device: Any = None
) -> Expr:
    """``fill_value`` with the shape (and, by default, the dtype) of ``x``."""
    _device(device, "full_like")
    if "full_like" in OPS:
        return node(OPS["full_like"], (x, fill_value), {"dtype": dtype})
    target = dtype if dtype is not None else getattr(x, "dtype", None)
    if target is None:
        raise TypeError("full_like: the dtype of x is known only when it runs: give dtype=")
    return node(OPS["astype"], (node(OPS["zeros_like"], (x,), {"dtype": dtype}) + fill_value, target), None)


def arange(
    start: float, /, stop: float | None = None, step: float = 1, *, dtype: DTypeLike | None = None, device: Any = None
) -> Expr:
    """Evenly spaced values in ``[start, stop)`` (``arange(n)`` counts from 0)."""
    _device(device, "arange")
    return node(OPS["arange"], (start, stop, step), {"dtype": dtype})


def linspace(
    start: float,
    stop: float,
    /,
    num: int,
    *,
    dtype: DTypeLike | None = None,
    device: Any = None,
    endpoint: bool = True,
) -> Expr:
    """``num`` evenly spaced values from ``start`` to ``stop``."""
    _device(device, "linspace")
    return node(OPS["linspace"], (start, stop, num), {"endpoint": endpoint, "dtype": dtype})


def eye(
    n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: DTypeLike | None = None, device: Any = None
) -> Expr:
    """A 2-d array with ones on diagonal ``k`` and zeros elsewhere."""
    _device(device, "eye")
    return node(OPS["eye"], (n_rows, n_cols), {"k": k, "dtype": dtype})


def meshgrid(*arrays: TensorLike, indexing: str = "xy") -> list[Expr]:
    """Coordinate arrays from 1-d arrays (``"xy"``: Cartesian, ``"ij"``: matrix indexing)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    sizes = [meta_shape(a, "meshgrid")[0] if meta_shape(a, "meshgrid") else 1 for a in arrays]
    axes = list(range(len(arrays)))
    if indexing == "xy" and len(arrays) > 1:
        axes[0], axes[1] = 1, 0
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for a, axis in zip(arrays, axes, strict=True):
        shape = [1] * len(arrays)
        shape[axis] = -1
        out.append(node(OPS["broadcast_to"], (node(OPS["reshape"], (a, shape), None), tuple(sizes)), None))
    return out


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the given shapes broadcast to (a Python tuple: nothing to compute)."""
    return tuple(np.broadcast_shapes(*shapes))


def broadcast_arrays(*arrays: TensorLike) -> list[Expr]:
    """The arrays broadcast against each other."""
    shapes = [meta_shape(a, "broadcast_arrays") for a in arrays]
    shape = broadcast(list(shapes))
    if shape is None:
        raise ValueError(f"broadcast_arrays: shapes {shapes} do not broadcast")
    return [node(OPS["broadcast_to"], (a, shape), None) for a in arrays]


def unstack(x: TensorLike, /, *, axis: int = 0) -> tuple[Expr, ...]:
    """The slices of ``x`` along ``axis``, as a tuple."""
    shape = meta_shape(x, "unstack")
    if not -len(shape) <= axis < len(shape):
        raise IndexOutOfRangeError(f"unstack: axis {axis} is out of range for {len(shape)} dimensions")
    axis %= len(shape)
    return tuple(node(OPS["getitem"], (x, (slice(None),) * axis + (i,)), None) for i in range(shape[axis]))


def astype(x: TensorLike, dtype: DTypeLike, /, *, copy: bool = True, device: Any = None) -> Expr:
    """``x`` converted to ``dtype`` (a new array; ``copy=False`` changes nothing: arrays are immutable)."""
    _device(device, "astype")
    return node(OPS["astype"], (x, dtype), None)


def matrix_transpose(x: TensorLike, /) -> Expr:
    """The transpose of the last two dimensions."""
    return node(OPS.get("matrix_transpose") or INTERNAL_OPS["swap_matrix_axes"], (x,), None)


def positive(x: TensorLike, /) -> Expr:
    """Element-wise ``+x``."""
    if "positive" in OPS:
        return node(OPS["positive"], (x,), None)
    return node(OPS["getitem"], (x, Ellipsis), None)


# -- several results ------------------------------------------------------------------------
class UniqueAllResult(NamedTuple):
    """``unique_all``'s results."""

    values: Expr
    indices: Expr
    inverse_indices: Expr
    counts: Expr


class UniqueCountsResult(NamedTuple):
    """``unique_counts``'s results."""

    values: Expr
    counts: Expr


class UniqueInverseResult(NamedTuple):
    """``unique_inverse``'s results."""

    values: Expr
    inverse_indices: Expr


def _op(name: str) -> Any:
    d = OPS.get(name)
    if d is None:  # (not exported then: see __init__)
        raise NotImplementedError(f"{name}: the op table has no {name!r} op yet")
    return d


def unique_all(x: TensorLike, /) -> UniqueAllResult:
    """The unique values of ``x``, their first indices, the inverse indices and the counts."""
    return UniqueAllResult(*several(_op("unique_all"), (x,), None, 4))


def unique_counts(x: TensorLike, /) -> UniqueCountsResult:
    """The unique values of ``x`` and their counts."""
    return UniqueCountsResult(*several(_op("unique_counts"), (x,), None, 2))


def unique_inverse(x: TensorLike, /) -> UniqueInverseResult:
    """The unique values of ``x`` and the inverse indices (``values[inverse_indices]`` is ``x``)."""
    return UniqueInverseResult(*several(_op("unique_inverse"), (x,), None, 2))


# -- inspection -----------------------------------------------------------------------------
class Info:
    """What ``__array_namespace_info__()`` returns: the namespace's capabilities, devices and dtypes."""

    def capabilities(self) -> dict[str, Any]:
        """Boolean indexing and data-dependent shapes are supported; up to 64 dimensions."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> str:
        """The device arrays are created on."""
        return CPU

    def devices(self) -> list[str]:
        """The devices of the namespace."""
        return [CPU]

    def default_dtypes(self, *, device: Any = None) -> dict[str, np.dtype[Any]]:
        """The default dtypes: float64, complex128, int64 and the index type int64."""
        _device(device, "default_dtypes")
        f, c, i = np.dtype(np.float64), np.dtype(np.complex128), np.dtype(np.int64)
        return {"real floating": f, "complex floating": c, "integral": i, "indexing": i}

    def dtypes(self, *, device: Any = None, kind: str | tuple[str, ...] | None = None) -> dict[str, np.dtype[Any]]:
        """The dtypes of the namespace, by name (only those of ``kind`` if given)."""
        from ._dtypes import DTYPES

        _device(device, "dtypes")
        if kind is None:
            return dict(DTYPES)
        return {n: dt for n, dt in DTYPES.items() if np.isdtype(dt, kind)}


def __array_namespace_info__() -> Info:
    """The namespace's inspection object (capabilities, devices, default dtypes, dtypes)."""
    return Info()
