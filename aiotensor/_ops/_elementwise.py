"""Element-wise ops, with numpy broadcasting, type promotion and results.

Each op is one numpy ufunc (or a two-line kernel) run on the session's backend.
numpy's floating-point warnings follow the caller's ``np.errstate``: kernels run in a
copy of the caller's context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._base import OpsBase, as_numeric

if TYPE_CHECKING:
    from .._tensor import Tensor
    from .._types import TensorLike

__all__ = ["ElementwiseOps"]


def _k_sigmoid(x: Any) -> Any:
    # tanh form: no overflow for large |x|, and float32 stays float32.
    x = np.asarray(x)
    if x.dtype.kind not in "fc":
        x = x.astype(np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _k_relu(x: Any) -> Any:
    # A zero of x's own dtype: a python 0 would turn bool input into int64.
    x = np.asarray(x)
    return np.maximum(x, np.zeros((), x.dtype))


def _k_round(x: Any, decimals: int) -> Any:
    return np.round(x, decimals)


def _k_clip(x: Any, lo: Any, hi: Any) -> Any:
    # ``None`` is a valid bound here (no limit on that side), so only real bounds are checked.
    lo = None if lo is None else as_numeric(lo)
    hi = None if hi is None else as_numeric(hi)
    return np.clip(x, lo, hi)


class ElementwiseOps(OpsBase):
    """Element-wise arithmetic, comparisons, logic and math functions."""

    async def add(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 + x2``."""
        return await self._op("add", np.add, (x1, x2), name=name, data=2)

    async def subtract(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 - x2``."""
        return await self._op("subtract", np.subtract, (x1, x2), name=name, data=2)

    async def multiply(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 * x2``."""
        return await self._op("multiply", np.multiply, (x1, x2), name=name, data=2)

    async def divide(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 / x2`` (true division)."""
        return await self._op("divide", np.true_divide, (x1, x2), name=name, data=2)

    async def floor_divide(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 // x2``."""
        return await self._op("floor_divide", np.floor_divide, (x1, x2), name=name, data=2)

    async def remainder(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 % x2`` (sign of the divisor, as python)."""
        return await self._op("remainder", np.remainder, (x1, x2), name=name, data=2)

    async def pow(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 ** x2``."""
        return await self._op("pow", np.power, (x1, x2), name=name, data=2)

    async def maximum(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise maximum (NaN propagates)."""
        return await self._op("maximum", np.maximum, (x1, x2), name=name, data=2)

    async def minimum(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise minimum (NaN propagates)."""
        return await self._op("minimum", np.minimum, (x1, x2), name=name, data=2)

    async def equal(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 == x2`` (bool)."""
        return await self._op("equal", np.equal, (x1, x2), name=name, data=2)

    async def not_equal(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 != x2`` (bool)."""
        return await self._op("not_equal", np.not_equal, (x1, x2), name=name, data=2)

    async def less(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 < x2`` (bool)."""
        return await self._op("less", np.less, (x1, x2), name=name, data=2)

    async def less_equal(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 <= x2`` (bool)."""
        return await self._op("less_equal", np.less_equal, (x1, x2), name=name, data=2)

    async def greater(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 > x2`` (bool)."""
        return await self._op("greater", np.greater, (x1, x2), name=name, data=2)

    async def greater_equal(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x1 >= x2`` (bool)."""
        return await self._op("greater_equal", np.greater_equal, (x1, x2), name=name, data=2)

    async def logical_and(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise logical and (bool)."""
        return await self._op("logical_and", np.logical_and, (x1, x2), name=name, data=2)

    async def logical_or(self, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise logical or (bool)."""
        return await self._op("logical_or", np.logical_or, (x1, x2), name=name, data=2)

    async def negative(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``-x``."""
        return await self._op("negative", np.negative, (x,), name=name, data=1)

    async def abs(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise absolute value."""
        return await self._op("abs", np.absolute, (x,), name=name, data=1)

    async def sign(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise sign (-1, 0 or 1)."""
        return await self._op("sign", np.sign, (x,), name=name, data=1)

    async def exp(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``e ** x``."""
        return await self._op("exp", np.exp, (x,), name=name, data=1)

    async def log(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise natural logarithm."""
        return await self._op("log", np.log, (x,), name=name, data=1)

    async def log1p(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``log(1 + x)``, exact for small x."""
        return await self._op("log1p", np.log1p, (x,), name=name, data=1)

    async def sqrt(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise square root."""
        return await self._op("sqrt", np.sqrt, (x,), name=name, data=1)

    async def square(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``x * x``."""
        return await self._op("square", np.square, (x,), name=name, data=1)

    async def sin(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise sine."""
        return await self._op("sin", np.sin, (x,), name=name, data=1)

    async def cos(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise cosine."""
        return await self._op("cos", np.cos, (x,), name=name, data=1)

    async def tanh(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise hyperbolic tangent."""
        return await self._op("tanh", np.tanh, (x,), name=name, data=1)

    async def sigmoid(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise logistic sigmoid ``1 / (1 + e ** -x)``, without overflow."""
        return await self._op("sigmoid", _k_sigmoid, (x,), name=name, data=1)

    async def relu(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ``max(x, 0)``."""
        return await self._op("relu", _k_relu, (x,), name=name, data=1)

    async def floor(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise floor."""
        return await self._op("floor", np.floor, (x,), name=name, data=1)

    async def ceil(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise ceiling."""
        return await self._op("ceil", np.ceil, (x,), name=name, data=1)

    async def logical_not(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise logical not (bool)."""
        return await self._op("logical_not", np.logical_not, (x,), name=name, data=1)

    async def isnan(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise whether NaN (bool)."""
        return await self._op("isnan", np.isnan, (x,), name=name, data=1)

    async def isfinite(self, x: TensorLike, /, *, name: str | None = None) -> Tensor:
        """Element-wise whether finite (bool)."""
        return await self._op("isfinite", np.isfinite, (x,), name=name, data=1)

    async def round(self, x: TensorLike, /, decimals: int = 0, *, name: str | None = None) -> Tensor:
        """Element-wise rounding to ``decimals`` places (halves to even, as numpy)."""
        return await self._op("round", _k_round, (x, decimals), name=name, data=1)

    async def clip(
        self, x: TensorLike, /, min: TensorLike | None = None, max: TensorLike | None = None, *, name: str | None = None
    ) -> Tensor:
        """Element-wise ``x`` limited to ``[min, max]`` (either bound may be ``None``)."""
        return await self._op("clip", _k_clip, (x, min, max), name=name, data=1)

    async def where(
        self, condition: TensorLike, x1: TensorLike, x2: TensorLike, /, *, name: str | None = None
    ) -> Tensor:
        """Element-wise ``x1`` where ``condition`` is true, else ``x2``."""
        return await self._op("where", np.where, (condition, x1, x2), name=name, data=3)
