"""Linear algebra and shape ops: products, reshaping, joining, splitting, indexing, casts.

numpy returns views for many of these; the backend copies a view into a buffer of its
own (see ``_kernels.finalize``) so that every tensor's memory is accounted for exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import InvalidArgumentError
from .._kernels import as_numeric
from .._opdef import Cost, Prepared, op
from ._checks import axes, check_copy, check_device, check_dtype, ints, sequence

if TYPE_CHECKING:
    from .._types import AxisLike, DTypeLike, ShapeLike, TensorLike

M = Cost.MEMORY


def _k_einsum(xp: Any, subscripts: str, *operands: Any) -> Any:
    return xp.einsum(subscripts, *[as_numeric(o) for o in operands], optimize=True)


def _k_concat(xp: Any, arrays: list[Any], axis: int) -> Any:
    return xp.concatenate([as_numeric(a) for a in arrays], axis=axis)


def _k_stack(xp: Any, arrays: list[Any], axis: int) -> Any:
    return xp.stack([as_numeric(a) for a in arrays], axis=axis)


def _k_astype(xp: Any, x: Any, dtype: Any) -> Any:
    return xp.asarray(x).astype(dtype)


def _k_getitem(xp: Any, x: Any, key: Any) -> Any:
    return xp.asarray(x)[key]


def _k_split(xp: Any, x: Any, sections: Any, axis: int) -> list[Any]:
    return list(xp.split(xp.asarray(x), sections, axis=axis))


@op("matmul", data=2, cost=Cost.PRODUCT, plain=True, blas=True)
def matmul(x1: TensorLike, x2: TensorLike, /) -> None:
    """Matrix product ``x1 @ x2``, batched over leading dimensions."""


@op("tensordot", data=2, cost=Cost.PRODUCT, blas=True)
def tensordot(x1: TensorLike, x2: TensorLike, /, *, axes: int | tuple[Sequence[int], Sequence[int]] = 2) -> Prepared:
    """Sum of products over ``axes`` (the last ``axes`` of x1 and first of x2, or explicit lists)."""
    return (x1, x2), {"axes": axes}, None


@op(_k_einsum, cost=Cost.PRODUCT, blas=True)
def einsum(subscripts: str, /, *operands: TensorLike) -> Prepared:
    """Einstein summation, e.g. ``einsum("ij,jk->ik", a, b)`` (contraction order optimized)."""
    if not isinstance(subscripts, str):
        raise InvalidArgumentError(f"einsum: subscripts must be a str, got {type(subscripts).__name__}")
    return (subscripts, *operands), None, None


@op("reshape", data=1, cost=M)
def reshape(x: TensorLike, /, shape: ShapeLike, *, copy: bool | None = None) -> Prepared:
    """The same elements in a new shape (one dimension may be -1).

    ``copy`` is the standard's keyword: tensors are immutable, so whether the result
    shares memory with ``x`` cannot be observed, and every value of it is accepted.
    """
    check_copy(copy, "reshape")
    return (x, ints(shape, "shape", "reshape")), None, None


@op("transpose", data=1, cost=M)
def permute_dims(x: TensorLike, /, axes: Sequence[int] | None = None) -> Prepared:
    """Dimensions reordered by ``axes`` (a transpose; ``None`` reverses them)."""
    if axes is None:
        return (x, None), None, None
    perm = ints(axes, "axes", "permute_dims")
    return (x, (perm,) if isinstance(perm, int) else perm), None, None


@op("expand_dims", data=1, cost=M)
def expand_dims(x: TensorLike, /, axis: int | Sequence[int] = 0) -> Prepared:
    """A new dimension of size 1 at ``axis``."""
    return (x, axes(axis, "expand_dims")), None, None


@op("squeeze", data=1, cost=M)
def squeeze(x: TensorLike, /, axis: AxisLike = None) -> Prepared:
    """Dimensions of size 1 removed (only ``axis`` if given)."""
    return (x, axes(axis, "squeeze")), None, None


@op(_k_concat, cost=M)
def concat(arrays: Sequence[TensorLike], /, *, axis: int = 0) -> Prepared:
    """Tensors joined along an existing axis."""
    return (sequence(arrays, "concat"), axis), None, None


@op(_k_stack, cost=M)
def stack(arrays: Sequence[TensorLike], /, *, axis: int = 0) -> Prepared:
    """Tensors of one shape joined along a new axis."""
    return (sequence(arrays, "stack"), axis), None, None


@op(_k_split, data=1, cost=M, returns="list")
def split(x: TensorLike, /, indices_or_sections: int | Sequence[int], *, axis: int = 0) -> Prepared:
    """``x`` cut along ``axis`` into equal sections, or at the given indices."""
    sections = ints(indices_or_sections, "indices_or_sections", "split")
    return (x, sections if isinstance(sections, int) else list(sections), axis), None, None


@op("broadcast_to", data=1, cost=M)
def broadcast_to(x: TensorLike, /, shape: ShapeLike) -> Prepared:
    """``x`` broadcast to ``shape`` (materialized: the result owns its memory)."""
    return (x, ints(shape, "shape", "broadcast_to")), None, None


@op(_k_astype, data=1, cost=M)
def astype(x: TensorLike, dtype: DTypeLike, /, *, copy: bool = True, device: str | None = None) -> Prepared:
    """``x`` converted to ``dtype`` (numpy's casting rules, ``unsafe`` as numpy's ``astype``).

    ``copy`` and ``device`` are the standard's keywords: the result is always a tensor of
    its own (tensors are immutable, so a copy cannot be told from none), on the device
    the session places the op on (``device`` must be ``None`` or a device name).
    """
    check_copy(copy, "astype")
    check_device(device, "astype")
    dt = check_dtype(dtype, "astype")
    if dt is None:
        raise InvalidArgumentError("astype: dtype must not be None")
    return (x, dt), None, None


@op("take", data=2, cost=Cost.INDEX)
def take(x: TensorLike, indices: TensorLike, /, *, axis: int | None = None) -> Prepared:
    """Elements of ``x`` at ``indices`` along ``axis`` (of the flattened ``x`` if ``None``)."""
    return (x, indices), {"axis": axis}, None


@op(_k_getitem, data=1, cost=Cost.INDEX)
def getitem(x: TensorLike, key: Any, /) -> Prepared:
    """``x[key]`` with numpy indexing (slices, ints, ``None``, ellipsis, int or bool arrays/tensors)."""
    return (x, key), None, None


def _k_matrix_transpose(xp: Any, x: Any) -> Any:
    x = xp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"x must have at least 2 dimensions, got {x.ndim}")
    return xp.swapaxes(x, -1, -2)


def _k_vecdot(xp: Any, x1: Any, x2: Any, axis: int) -> Any:
    return xp.vecdot(x1, x2, axis=axis)


@op(_k_matrix_transpose, data=1, cost=M)
def matrix_transpose(x: TensorLike, /) -> Prepared:
    """The last two dimensions of ``x`` swapped (a stack of matrices, each transposed)."""
    return (x,), None, None


@op(_k_vecdot, data=2, cost=M)
def vecdot(x1: TensorLike, x2: TensorLike, /, *, axis: int = -1) -> Prepared:
    """Dot products of vectors along ``axis`` (``x1`` conjugated), broadcast over the other dimensions."""
    return (x1, x2, axis), None, None
