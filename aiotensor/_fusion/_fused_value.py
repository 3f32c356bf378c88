"""The values of a fused function: read-only arrays with the operators of tensors, synchronous.

Inside a fused function (:mod:`aiotensor._fusion._function`) tensor arguments arrive as
:class:`FusedValue` objects, and every op of its ``ops``
(:class:`~aiotensor._fusion._fused_ops.FusedOps`) returns one. Their operators
(``x @ w + b``) run the op at once on the function's thread; plain numpy ops on values
and Python numbers take the interpreter's hot path (``_plain``, or ``_kept`` in a batch's
kernel, whose outputs come from the recycler) without applying a spec.

Ownership of intermediates: the registry belongs to the loop thread, so values made
inside the function are not registered one by one (that would need a hop back to the
loop per op). Each run counts them in a :class:`~aiotensor._programs._interpreter.Budget`: their
bytes are checked against what ``memory_limit`` leaves free when the kernel starts,
and the session's statistics record them as allocated and freed, with their peak in
``peak_bytes``. They are freed by reference counting as soon as the function drops
them (:class:`_MadeValue`). Only the values the function returns escape
(:func:`_result`), as tensors owned by the session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._kernels import read_only_view, unshared
from .._opdef import BINARY_OPERATORS, COMPARISON_OPERATORS, INTERNAL_OPS, OPS, UNARY_OPERATORS, OpDef

if TYPE_CHECKING:
    from .._programs._interpreter import Budget
    from .._types import NDArray
    from ._fused_ops import FusedOps

__all__ = ["FusedValue"]


class FusedValue:
    """A tensor inside a fused function: a read-only array with synchronous operators.

    Made by the ``ops`` of a fused function (and for its tensor arguments); it is
    valid only while the function runs. ``np.asarray(v)`` gives a read-only view.
    """

    # _keep: for a view, the value whose memory it views (set only then): holding it
    # keeps that value's bytes counted in the budget for as long as the view lives.
    __slots__ = ("_arr", "_keep", "_ops")
    _keep: FusedValue
    #: Made inside this run (accounted in its budget), not an argument: a :class:`_MadeValue`.
    _made = False

    def __init__(self, arr: NDArray, ops: FusedOps) -> None:
        self._arr = arr
        self._ops = ops

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape."""
        shape: tuple[int, ...] = self._arr.shape
        return shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype."""
        return self._arr.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._arr.ndim

    @property
    def nbytes(self) -> int:
        """The size in bytes."""
        return self._arr.nbytes

    @property
    def T(self) -> FusedValue:
        """The transpose (dimensions reversed)."""
        out: FusedValue = self._ops._run(OPS["permute_dims"], self, None)
        return out

    @property
    def mT(self) -> FusedValue:
        """The transpose of the last two dimensions."""
        out: FusedValue = self._ops._run(OPS.get("matrix_transpose") or INTERNAL_OPS["swap_matrix_axes"], self)
        return out

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(self._arr.size)

    def __pos__(self) -> FusedValue:  # replaced by the ``positive`` op's operator where the table has it
        out: FusedValue = self._ops._run(OPS["getitem"], self, Ellipsis)
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> NDArray:
        arr = read_only_view(self._arr)
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __repr__(self) -> str:
        return f"FusedValue(shape={self.shape}, dtype={self.dtype})"


class _MadeValue(FusedValue):
    # A value made inside the run: its bytes count in the run's budget until it is
    # dropped. A subclass, so that arguments (most values of a short function) have no
    # __del__ to run.
    __slots__ = ()
    _made = True

    def __del__(self) -> None:  # (_interpreter._alone measures this path: keep the two alike)
        ops = self._ops
        if ops._fast:
            ops._budget.live -= self._arr.nbytes
        else:
            ops._dead(self._arr)


def _plain_numpy(d: OpDef) -> bool:
    # Ops the hot path (FusedOps._plain) may run: no spec to apply, a numpy kernel.
    return d.plain and d.kernel_for(np) is not None


def _operator(name: str, reflected: bool = False) -> Callable[..., Any]:
    d = OPS[name]
    fast = _plain_numpy(d)

    def method(self: FusedValue, other: Any) -> Any:
        ops = self._ops
        if fast and ops._fast:
            # A value and another value or a Python number: the hot path, unwrapped here.
            to = type(other)
            if to is _MadeValue or to is FusedValue:
                o = other._arr
                return ops._plain(d, (o, self._arr) if reflected else (self._arr, o))
            if to is float or to is int:
                return ops._plain(d, (other, self._arr) if reflected else (self._arr, other))
        elif fast and ops._keeps:
            # The same in a batch's kernel: outputs from the recycler.
            to = type(other)
            if to is _MadeValue or to is FusedValue or to is float or to is int:
                o = other._arr if to is _MadeValue or to is FusedValue else other
                if reflected:
                    return ops._kept(d, (o, self._arr), (other, self))
                return ops._kept(d, (self._arr, o), (self, other))
        return ops._run(d, other, self) if reflected else ops._run(d, self, other)

    return method


def _unary_operator(name: str) -> Callable[..., Any]:
    d = OPS[name]
    fast = _plain_numpy(d)

    def method(self: FusedValue) -> Any:
        ops = self._ops
        if fast and ops._fast:
            return ops._plain(d, (self._arr,))
        if fast and ops._keeps:
            return ops._kept(d, (self._arr,), (self,))
        return ops._run(d, self)

    return method


# The operators of tensors and expressions (those whose op exists), synchronous here.
for _stem, _name in BINARY_OPERATORS:
    if _name in OPS:
        setattr(FusedValue, f"__{_stem}__", _operator(_name))
        setattr(FusedValue, f"__r{_stem}__", _operator(_name, reflected=True))
for _stem, _name in COMPARISON_OPERATORS:
    if _name in OPS:
        setattr(FusedValue, f"__{_stem}__", _operator(_name))
for _stem, _name in UNARY_OPERATORS:
    if _name in OPS:
        setattr(FusedValue, f"__{_stem}__", _unary_operator(_name))
setattr(FusedValue, "__getitem__", _operator("getitem"))  # noqa: B010 -- set like the loops above
FusedValue.__hash__ = object.__hash__  # type: ignore[method-assign]  # == is element-wise


def _result(x: Any, budget: Budget) -> Any:
    if isinstance(x, FusedValue):
        arr = x._arr
        if x._made:
            if not arr.flags.writeable:
                # Made in this run and about to be dropped: hand it over without a copy
                # (finalize makes it read-only again, so one returned twice is copied).
                arr.setflags(True)  # type: ignore[call-arg]
                budget.escaped += 1
            return arr
        # The caller's own numpy argument returned as it is: copied (unshared); a tensor's
        # buffer (read-only): finalize copies it.
        return unshared(arr)
    # An array of fn's own (a closure's, a global) returned as is: never taken over.
    return unshared(x)


def _wrap_arg(x: Any, ops: FusedOps) -> Any:
    if isinstance(x, np.ndarray):
        return FusedValue(x, ops)
    if type(x) in (list, tuple):
        return type(x)(_wrap_arg(e, ops) for e in x)
    return x
