"""What every op family needs from the session, and argument checks shared by the families."""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import InvalidArgumentError
from .._kernels import NUMERIC_KINDS
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._types import DTypeLike

__all__ = ["CheckedKernel", "OpsBase", "as_numeric", "check_dtype", "check_shape", "count_bytes"]

_PY_NUMBERS = (bool, int, float, complex)


class OpsBase(ABC):
    """The one method op families call: run a kernel, own what it returns."""

    @abstractmethod
    async def _dispatch(
        self,
        op: str,
        kernel: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        *,
        name: str | None,
        nbytes: int | None,
        user_kernel: bool,
    ) -> tuple[list[Tensor], bool]:
        """Run ``kernel(*args, **kwargs)`` (tensors replaced by buffers); wrap the outputs."""

    async def _op(
        self,
        op: str,
        kernel: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        nbytes: int | None = None,
        data: int = 0,
    ) -> Tensor:
        # ``data``: how many leading positional args are tensor values (checked numeric
        # in the kernel); the rest are parameters such as shapes, axes or keys.
        if data and not all(type(a) is Tensor for a in args[:data]):
            # Only non-tensor data needs the check: a tensor's buffer is numeric already.
            kernel = CheckedKernel(kernel, data)
        tensors, _ = await self._dispatch(op, kernel, args, kwargs, name=name, nbytes=nbytes, user_kernel=False)
        return tensors[0]


def as_numeric(x: Any) -> Any:
    """``x`` as a kernel input: numbers and numeric arrays as they are, array-likes as arrays.

    Runs inside kernels (off the event loop). Python and numpy scalars pass unchanged
    so that numpy's promotion rules (NEP 50: python scalars are "weak") still apply.
    ``None``, strings, objects and ragged lists raise, so that no op turns them into
    a result silently (numpy compares ``None`` element-wise, or takes ``argmax(None)``).
    """
    if isinstance(x, np.ndarray | np.generic):
        if x.dtype.kind not in NUMERIC_KINDS:
            raise TypeError(
                f"input of dtype {x.dtype} is not numeric; tensors hold bool, integer, float or complex data"
            )
        return x
    if isinstance(x, _PY_NUMBERS):
        return x
    if x is None or isinstance(x, str | bytes):
        raise TypeError(f"{x!r:.40} is not a tensor value; expected a Tensor, a number or a numeric array")
    arr = np.asarray(x)  # a nested list; raises ValueError when ragged
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(
            f"input of type {type(x).__name__} gives dtype {arr.dtype}, not numeric;"
            " tensors hold bool, integer, float or complex data"
        )
    return arr


class CheckedKernel:
    """A kernel whose first ``n`` positional arguments go through :func:`as_numeric`.

    A class rather than a closure so that it pickles (for backends that ship kernels).
    """

    __slots__ = ("fn", "n")

    def __init__(self, fn: Callable[..., Any], n: int) -> None:
        self.fn = fn
        self.n = n

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        n = self.n
        checked = [as_numeric(a) for a in args[:n]]
        return self.fn(*checked, *args[n:], **kwargs)

    def __repr__(self) -> str:
        return f"CheckedKernel({getattr(self.fn, '__name__', self.fn)!r}, {self.n})"


def check_dtype(dtype: DTypeLike | None, op: str) -> np.dtype[Any] | None:
    """``np.dtype(dtype)`` if it is numeric, ``None`` for ``None``; else InvalidArgumentError."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as exc:  # a malformed string like "i4,," parses as code
        raise InvalidArgumentError(f"{op}: {dtype!r} is not a dtype ({exc})") from None
    if dt.kind not in NUMERIC_KINDS:
        raise InvalidArgumentError(
            f"{op}: dtype {dt} is not numeric; tensors hold bool, integer, float or complex data"
        )
    return dt


def check_shape(shape: int | Sequence[int], op: str) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints; else InvalidArgumentError."""
    dims = (shape,) if isinstance(shape, int | np.integer) else shape
    try:
        out = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise InvalidArgumentError(f"{op}: shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in out):
        raise InvalidArgumentError(f"{op}: shape {out} has a negative dimension")
    return out


def count_bytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes of an array of this shape and dtype, in exact integer arithmetic."""
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n
