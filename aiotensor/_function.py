"""Fused functions: a whole function of ops run as one dispatch, on one pool worker.

``@at.function`` (or ``s.function(fn)``) turns ``fn(ops, *args)`` into a coroutine
function. Awaiting it submits one kernel; inside, ``ops`` is the session's op library
made synchronous (``ops.add(x, y)`` returns at once) and tensor arguments arrive as
:class:`FusedValue` objects with the usual operators. So ten small ops cost one
thread hop instead of ten, and the loop stays free while they run.

Ownership of intermediates, and why it is done this way: the registry belongs to the
loop thread, so values made inside the function are *not* registered one by one (that
would need a hop back to the loop per op, the cost fusion removes). Instead each run
counts them: their bytes are checked against the session's ``memory_limit`` as they
are made (the budget is what was free when the call was submitted), and when the run
ends, on the loop thread, the session's statistics record them as allocated and
freed, and ``peak_bytes`` includes their peak. They are freed by reference counting
as soon as the function drops them, before the call returns. Only the values the
function returns escape: they become tensors owned by the session, like any op's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

from ._backend import LocalBackend
from ._errors import AioTensorError, InvalidArgumentError, ResourceExhaustedError
from ._kernels import run_kernel
from ._ops import AllOps
from ._tensor import Tensor

if TYPE_CHECKING:
    from ._session import AsyncEagerSession
    from ._types import NDArray

__all__ = ["FusedFunction", "FusedOps", "FusedValue", "function"]


class _Run:
    """The bookkeeping of one call: bytes made inside, and the budget they must fit."""

    __slots__ = ("budget", "count", "escaped", "live", "peak", "session")

    def __init__(self, session: AsyncEagerSession, budget: int | None) -> None:
        self.session = session
        self.budget = budget
        self.count = 0
        self.escaped = 0
        self.live = 0
        self.peak = 0

    def made(self, nbytes: int, op: str) -> None:
        live = self.live + nbytes
        if self.budget is not None and live > self.budget:
            raise ResourceExhaustedError(
                f"{op} inside a fused function: {live} bytes of intermediates would exceed"
                f" the {self.budget} bytes the session's memory_limit left free"
            )
        self.count += 1
        self.live = live
        if live > self.peak:
            self.peak = live


class FusedValue:
    """A tensor inside a fused function: a read-only array with synchronous operators.

    Made by the ``ops`` of a fused function (and for its tensor arguments); it is
    valid only while the function runs. ``np.asarray(v)`` gives a read-only view.
    """

    __slots__ = ("_arr", "_made", "_ops")

    def __init__(self, arr: NDArray, ops: FusedOps, made: bool) -> None:
        self._arr = arr
        self._ops = ops
        self._made = made  # made inside this run (accounted), not an argument

    def __del__(self) -> None:
        if self._made:
            self._ops._run.live -= self._arr.nbytes

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

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> NDArray:
        arr = self._arr.view()
        arr.flags.writeable = False
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __repr__(self) -> str:
        return f"FusedValue(shape={self.shape}, dtype={self.dtype})"

    def __add__(self, other: Any) -> Any:
        return self._ops.add(self, other)

    def __radd__(self, other: Any) -> Any:
        return self._ops.add(other, self)

    def __sub__(self, other: Any) -> Any:
        return self._ops.subtract(self, other)

    def __rsub__(self, other: Any) -> Any:
        return self._ops.subtract(other, self)

    def __mul__(self, other: Any) -> Any:
        return self._ops.multiply(self, other)

    def __rmul__(self, other: Any) -> Any:
        return self._ops.multiply(other, self)

    def __truediv__(self, other: Any) -> Any:
        return self._ops.divide(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return self._ops.divide(other, self)

    def __pow__(self, other: Any) -> Any:
        return self._ops.pow(self, other)

    def __rpow__(self, other: Any) -> Any:
        return self._ops.pow(other, self)

    def __floordiv__(self, other: Any) -> Any:
        return self._ops.floor_divide(self, other)

    def __rfloordiv__(self, other: Any) -> Any:
        return self._ops.floor_divide(other, self)

    def __mod__(self, other: Any) -> Any:
        return self._ops.remainder(self, other)

    def __rmod__(self, other: Any) -> Any:
        return self._ops.remainder(other, self)

    def __matmul__(self, other: Any) -> Any:
        return self._ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return self._ops.matmul(other, self)

    def __neg__(self) -> Any:
        return self._ops.negative(self)

    def __abs__(self) -> Any:
        return self._ops.abs(self)

    def __getitem__(self, key: Any) -> Any:
        return self._ops.getitem(self, key)


class _SyncImpl(AllOps):
    """The op library with a ``_dispatch`` that runs kernels at once on the calling thread."""

    def __init__(self, ops: FusedOps) -> None:
        self._fused = ops

    def _unwrap(self, x: Any, op: str) -> Any:
        if isinstance(x, FusedValue):
            return x._arr
        if isinstance(x, Tensor):  # e.g. weights captured by the function: read in place
            return self._fused._run.session._buffer(x, op)
        if type(x) in (list, tuple):
            return type(x)(self._unwrap(e, op) for e in x)
        return x

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
    ) -> tuple[list[Any], bool]:
        run = self._fused._run
        buffers = tuple([self._unwrap(a, op) for a in args])
        kw = {k: self._unwrap(v, op) for k, v in kwargs.items()} if kwargs else {}
        try:
            result = run_kernel(kernel, buffers, kw)
        except AioTensorError:
            raise
        except Exception as exc:  # the same errors as the op would raise outside
            raise run.session._kernel_error(op, args, exc, user_kernel) from exc
        values = []
        for buf in result.buffers:
            run.made(buf.nbytes, op)
            values.append(FusedValue(buf.handle, self._fused, True))
        return values, result.multi


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    # The ops' coroutines never suspend here (_SyncImpl._dispatch awaits nothing).
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("an op suspended inside a fused function")  # pragma: no cover


class FusedOps:
    """The ``ops`` argument of a fused function: every op of the session, synchronous.

    ``ops.add(x, 1)``, ``ops.matmul(x, w)``, ``ops.split(x, 2)`` ... take and return
    :class:`FusedValue` objects (and numbers, arrays, and tensors of the session).
    """

    __slots__ = ("_impl", "_run")

    def __init__(self, run: _Run) -> None:
        self._run = run
        self._impl = _SyncImpl(self)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        raise AttributeError(f"fused functions have no op {name!r}")


def _sync_op(name: str) -> Callable[..., Any]:
    method = getattr(AllOps, name)

    @functools.wraps(method)
    def call(self: FusedOps, *args: Any, **kwargs: Any) -> Any:
        return _drive(method(self._impl, *args, **kwargs))

    return call


for _name in dir(AllOps):
    if not _name.startswith("_") and callable(getattr(AllOps, _name)):
        setattr(FusedOps, _name, _sync_op(_name))


def _wrap_arg(x: Any, ops: FusedOps) -> Any:
    if isinstance(x, np.ndarray):
        return FusedValue(x, ops, False)
    if type(x) in (list, tuple):
        return type(x)(_wrap_arg(e, ops) for e in x)
    return x


def _result(x: Any, run: _Run) -> Any:
    if isinstance(x, FusedValue):
        arr = x._arr
        if x._made and not arr.flags.writeable:
            # Made in this run and about to be dropped: hand it over without a copy
            # (finalize makes it read-only again, so one returned twice is copied).
            arr.flags.writeable = True
            run.escaped += 1
        return arr
    return x


class _Kernel:
    """The kernel of one call: wraps the arguments, calls ``fn``, unwraps its results."""

    __slots__ = ("fn", "run")

    def __init__(self, fn: Callable[..., Any], run: _Run) -> None:
        self.fn = fn
        self.run = run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ops = FusedOps(self.run)
        out = self.fn(ops, *[_wrap_arg(a, ops) for a in args], **{k: _wrap_arg(v, ops) for k, v in kwargs.items()})
        if isinstance(out, tuple | list):
            return [_result(o, self.run) for o in out]
        return _result(out, self.run)


class FusedFunction:
    """``fn(ops, *args, **kwargs)`` as a coroutine function that runs as one op.

    Made by :func:`function` or :meth:`AsyncEagerSession.function`. Awaiting a call
    returns a tensor, or a tuple of tensors if ``fn`` returned a tuple or list.
    """

    __name__: str

    def __init__(self, fn: Callable[..., Any], session: AsyncEagerSession | None = None) -> None:
        if not callable(fn):
            raise InvalidArgumentError(f"function: fn must be callable, got {type(fn).__name__}")
        self._fn = fn
        self._session = session
        self._op = f"function({getattr(fn, '__name__', type(fn).__name__)})"
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: Any, **kwargs: Any) -> Tensor | tuple[Tensor, ...]:
        session = self._session
        if session is None:
            from ._functional import _session_of  # the module-level ops' rule

            session = _session_of(args, kwargs)
        if not isinstance(session.backend, LocalBackend):
            # The run's bookkeeping (and captured tensors) live in this process.
            raise InvalidArgumentError(f"{self._op}: fused functions run on local backends only")
        registry = session._registry
        limit = registry.memory_limit
        budget = None if limit is None else max(0, limit - registry.live_bytes - registry.reserved)
        run = _Run(session, budget)
        live_before = registry.live_bytes
        try:
            tensors, multi = await session._dispatch(
                self._op, _Kernel(self._fn, run), args, kwargs, name=None, nbytes=None, user_kernel=True
            )
        finally:
            # Values made and dropped inside the run never reached the registry:
            # record them as allocated and freed (the escaped ones were registered).
            transient = run.count - run.escaped
            if transient and not registry.closed:
                registry.allocated += transient
                registry.freed += transient
                registry.peak_bytes = max(registry.peak_bytes, live_before + run.peak)
        return tuple(tensors) if multi else tensors[0]


def function(fn: Callable[..., Any], /) -> FusedFunction:
    """Make ``fn(ops, *args)`` one op: all its ops run synchronously on one pool worker.

    The session is found as for module-level ops (from the tensor arguments, else
    the default session). Use :meth:`AsyncEagerSession.function` to bind one.

    Example::

        @at.function
        def layer(ops, x, w, b):
            return ops.relu(x @ w + b)

        y = await layer(x, w, b)  # one dispatch, one thread hop

    Raises:
        InvalidArgumentError: ``fn`` is not callable (here), or an op inside got
            bad arguments (when called).
        KernelError: ``fn`` raised something else; the original is the ``__cause__``.
    """
    return FusedFunction(fn)
