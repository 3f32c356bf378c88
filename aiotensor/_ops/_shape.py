"""Linear algebra and shape ops: products, reshaping, joining, splitting, indexing, casts.

numpy returns views for many of these; the backend copies a view into a buffer of its
own (see ``_kernels.finalize``) so that every tensor's memory is accounted for exactly.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import InvalidArgumentError
from ._base import CheckedKernel, OpsBase, as_numeric, check_dtype

if TYPE_CHECKING:
    from .._tensor import Tensor
    from .._types import AxisLike, DTypeLike, ShapeLike, TensorLike

__all__ = ["ShapeOps"]


def _k_einsum(subscripts: str, *operands: Any) -> Any:
    return np.einsum(subscripts, *[as_numeric(o) for o in operands], optimize=True)


def _k_concat(arrays: list[Any], axis: int) -> Any:
    return np.concatenate([as_numeric(a) for a in arrays], axis=axis)


def _k_stack(arrays: list[Any], axis: int) -> Any:
    return np.stack([as_numeric(a) for a in arrays], axis=axis)


def _k_astype(x: Any, dtype: np.dtype[Any]) -> Any:
    return np.asarray(x).astype(dtype)


def _k_getitem(x: Any, key: Any) -> Any:
    return np.asarray(x)[key]


def _k_split(x: Any, sections: Any, axis: int) -> list[Any]:
    return np.split(np.asarray(x), sections, axis=axis)


def _tensors(xs: Sequence[TensorLike], op: str) -> list[TensorLike]:
    if not isinstance(xs, list | tuple):
        raise InvalidArgumentError(f"{op}: expected a sequence of tensors, got {type(xs).__name__}")
    if not xs:
        raise InvalidArgumentError(f"{op}: needs at least one tensor")
    return list(xs)


def _ints(value: Any, what: str, op: str) -> int | tuple[int, ...]:
    # One int, or several as a tuple (numpy takes several axes only as a tuple). Checked
    # here, on the caller's side, so that a bad value is an InvalidArgumentError rather
    # than a TypeError from deep inside the argument handling.
    try:
        if isinstance(value, int | np.integer):
            return operator.index(value)
        return tuple(operator.index(v) for v in value)
    except TypeError:
        raise InvalidArgumentError(f"{op}: {what} must be an int or a sequence of ints, got {value!r:.60}") from None


def _axes(axis: AxisLike, op: str) -> int | tuple[int, ...] | None:
    return None if axis is None else _ints(axis, "axis", op)


class ShapeOps(OpsBase):
    """Matrix products, contractions and ops that rearrange elements."""

    async def matmul(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Matrix product ``x1 @ x2``, batched over leading dimensions."""
        return await self._op("matmul", np.matmul, (x1, x2), name=name, data=2)

    async def tensordot(
        self,
        x1: TensorLike,
        x2: TensorLike,
        /,
        *,
        axes: int | tuple[Sequence[int], Sequence[int]] = 2,
        name: str | None = None,
    ) -> Tensor:
        """Sum of products over ``axes`` (the last ``axes`` of x1 and first of x2, or explicit lists)."""
        return await self._op("tensordot", np.tensordot, (x1, x2), {"axes": axes}, name=name, data=2)

    async def einsum(self, subscripts: str, /, *operands: TensorLike, name: str | None = None) -> Tensor:
        """Einstein summation, e.g. ``einsum("ij,jk->ik", a, b)`` (contraction order optimized)."""
        if not isinstance(subscripts, str):
            raise InvalidArgumentError(f"einsum: subscripts must be a str, got {type(subscripts).__name__}")
        return await self._op("einsum", _k_einsum, (subscripts, *operands), name=name)

    async def reshape(self, x: TensorLike, /, shape: ShapeLike, *, name: str | None = None) -> Tensor:
        """The same elements in a new shape (one dimension may be -1)."""
        return await self._op("reshape", np.reshape, (x, _ints(shape, "shape", "reshape")), name=name, data=1)

    async def permute_dims(self, x: TensorLike, /, axes: Sequence[int], *, name: str | None = None) -> Tensor:
        """Dimensions reordered by ``axes`` (a transpose)."""
        perm = _ints(axes, "axes", "permute_dims")
        perm = (perm,) if isinstance(perm, int) else perm
        return await self._op("permute_dims", np.transpose, (x, perm), name=name, data=1)

    async def expand_dims(self, x: TensorLike, /, axis: int | Sequence[int] = 0, *, name: str | None = None) -> Tensor:
        """A new dimension of size 1 at ``axis``."""
        return await self._op("expand_dims", np.expand_dims, (x, _axes(axis, "expand_dims")), name=name, data=1)

    async def squeeze(self, x: TensorLike, /, axis: AxisLike = None, *, name: str | None = None) -> Tensor:
        """Dimensions of size 1 removed (only ``axis`` if given)."""
        return await self._op("squeeze", np.squeeze, (x, _axes(axis, "squeeze")), name=name, data=1)

    async def concat(self, arrays: Sequence[TensorLike], /, *, axis: int = 0, name: str | None = None) -> Tensor:
        """Tensors joined along an existing axis."""
        return await self._op("concat", _k_concat, (_tensors(arrays, "concat"), axis), name=name)

    async def stack(self, arrays: Sequence[TensorLike], /, *, axis: int = 0, name: str | None = None) -> Tensor:
        """Tensors of one shape joined along a new axis."""
        return await self._op("stack", _k_stack, (_tensors(arrays, "stack"), axis), name=name)

    async def split(
        self, x: TensorLike, /, indices_or_sections: int | Sequence[int], *, axis: int = 0, name: str | None = None
    ) -> list[Tensor]:
        """``x`` cut along ``axis`` into equal sections, or at the given indices."""
        sections = _ints(indices_or_sections, "indices_or_sections", "split")
        kernel = CheckedKernel(_k_split, 1)
        tensors, _ = await self._dispatch(
            "split",
            kernel,
            (x, sections if isinstance(sections, int) else list(sections), axis),
            None,
            name=name,
            nbytes=None,
            user_kernel=False,
        )
        return tensors

    async def broadcast_to(self, x: TensorLike, /, shape: ShapeLike, *, name: str | None = None) -> Tensor:
        """``x`` broadcast to ``shape`` (materialized: the result owns its memory)."""
        dims = _ints(shape, "shape", "broadcast_to")
        return await self._op("broadcast_to", np.broadcast_to, (x, dims), name=name, data=1)

    async def astype(self, x: TensorLike, dtype: DTypeLike, /, *, name: str | None = None) -> Tensor:
        """``x`` converted to ``dtype`` (numpy's casting rules, ``unsafe`` as numpy's ``astype``)."""
        dt = check_dtype(dtype, "astype")
        if dt is None:
            raise InvalidArgumentError("astype: dtype must not be None")
        return await self._op("astype", _k_astype, (x, dt), name=name, data=1)

    async def take(
        self, x: TensorLike, indices: TensorLike, /, *, axis: int | None = None, name: str | None = None
    ) -> Tensor:
        """Elements of ``x`` at ``indices`` along ``axis`` (of the flattened ``x`` if ``None``)."""
        return await self._op("take", np.take, (x, indices), {"axis": axis}, name=name, data=2)

    async def getitem(self, x: TensorLike, key: Any, /, *, name: str | None = None) -> Tensor:
        """``x[key]`` with numpy indexing (slices, ints, ``None``, ellipsis, int or bool arrays/tensors)."""
        return await self._op("getitem", _k_getitem, (x, key), name=name, data=1)
