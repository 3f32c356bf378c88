"""Reductions over axes (``axis=None`` reduces everything) and softmax."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._base import OpsBase, check_dtype

if TYPE_CHECKING:
    from .._tensor import Tensor
    from .._types import AxisLike, DTypeLike, TensorLike

__all__ = ["ReductionOps"]


def _axes(axis: AxisLike) -> Any:
    return tuple(axis) if isinstance(axis, list) else axis


def _k_softmax(x: Any, axis: int) -> Any:
    shifted = np.asarray(x) - np.max(x, axis=axis, keepdims=True)  # no overflow in exp
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _k_log_softmax(x: Any, axis: int) -> Any:
    shifted = np.asarray(x) - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


class ReductionOps(OpsBase):
    """Sums, means, extrema, spreads, arg-extrema and softmax."""

    async def _reduce(self, op: str, kernel: Any, x: TensorLike, kwargs: dict[str, Any], name: str | None) -> Tensor:
        return await self._op(op, kernel, (x,), kwargs, name=name, data=1)

    async def sum(
        self,
        x: TensorLike,
        /,
        *,
        axis: AxisLike = None,
        keepdims: bool = False,
        dtype: DTypeLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Sum over ``axis``."""
        return await self._reduce(
            "sum", np.sum, x, {"axis": _axes(axis), "keepdims": keepdims, "dtype": check_dtype(dtype, "sum")}, name
        )

    async def prod(
        self,
        x: TensorLike,
        /,
        *,
        axis: AxisLike = None,
        keepdims: bool = False,
        dtype: DTypeLike | None = None,
        name: str | None = None,
    ) -> Tensor:
        """Product over ``axis``."""
        return await self._reduce(
            "prod", np.prod, x, {"axis": _axes(axis), "keepdims": keepdims, "dtype": check_dtype(dtype, "prod")}, name
        )

    async def mean(
        self, x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False, name: str | None = None
    ) -> Tensor:
        """Arithmetic mean over ``axis``."""
        return await self._reduce("mean", np.mean, x, {"axis": _axes(axis), "keepdims": keepdims}, name)

    async def max(
        self, x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False, name: str | None = None
    ) -> Tensor:
        """Maximum over ``axis`` (an empty reduction raises InvalidArgumentError)."""
        return await self._reduce("max", np.max, x, {"axis": _axes(axis), "keepdims": keepdims}, name)

    async def min(
        self, x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False, name: str | None = None
    ) -> Tensor:
        """Minimum over ``axis`` (an empty reduction raises InvalidArgumentError)."""
        return await self._reduce("min", np.min, x, {"axis": _axes(axis), "keepdims": keepdims}, name)

    async def std(
        self,
        x: TensorLike,
        /,
        *,
        axis: AxisLike = None,
        correction: float = 0.0,
        keepdims: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Standard deviation over ``axis`` (``correction=1`` for the sample estimate)."""
        return await self._reduce(
            "std", np.std, x, {"axis": _axes(axis), "correction": correction, "keepdims": keepdims}, name
        )

    async def var(
        self,
        x: TensorLike,
        /,
        *,
        axis: AxisLike = None,
        correction: float = 0.0,
        keepdims: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Variance over ``axis`` (``correction=1`` for the sample estimate)."""
        return await self._reduce(
            "var", np.var, x, {"axis": _axes(axis), "correction": correction, "keepdims": keepdims}, name
        )

    async def argmax(
        self, x: TensorLike, /, *, axis: int | None = None, keepdims: bool = False, name: str | None = None
    ) -> Tensor:
        """Index of the maximum along ``axis`` (of the flattened tensor if ``None``)."""
        return await self._reduce("argmax", np.argmax, x, {"axis": axis, "keepdims": keepdims}, name)

    async def argmin(
        self, x: TensorLike, /, *, axis: int | None = None, keepdims: bool = False, name: str | None = None
    ) -> Tensor:
        """Index of the minimum along ``axis`` (of the flattened tensor if ``None``)."""
        return await self._reduce("argmin", np.argmin, x, {"axis": axis, "keepdims": keepdims}, name)

    async def softmax(self, x: TensorLike, /, *, axis: int = -1, name: str | None = None) -> Tensor:
        """``exp(x) / sum(exp(x))`` along ``axis``, computed without overflow."""
        return await self._reduce("softmax", _k_softmax, x, {"axis": axis}, name)

    async def log_softmax(self, x: TensorLike, /, *, axis: int = -1, name: str | None = None) -> Tensor:
        """``log(softmax(x))`` along ``axis``, computed stably."""
        return await self._reduce("log_softmax", _k_log_softmax, x, {"axis": axis}, name)
