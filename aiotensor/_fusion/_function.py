"""Fused functions: a whole function of ops run as one kernel.

``@at.function`` (or ``s.function(fn)``) turns ``fn(ops, *args)`` into a coroutine
function. Awaiting it runs one kernel; inside, ``ops`` is the op table made synchronous
(``ops.add(x, y)`` returns at once, running the op's own spec and kernel, as a node of
an expression program does) and tensor arguments arrive as :class:`FusedValue` objects
with the usual operators. So ten small ops cost one dispatch instead of ten.

The function's Python runs eagerly (its control flow is Python's): ``ops`` is the
driver of the one step executor of multi-op kernels, ``_interpreter.Interpreter``,
which applies each op (checks, kernel, errors, the run's budget, recycled outputs for
batched kernels) as an expression's program applies its steps.

Where it runs (``_placement.Placement``): a fused function's cost is unknown until it
has run, so its first call for given argument shapes goes to the pool, where the cost
model of single ops (``_cost``) adds up the ops it runs; later calls with those shapes run inline on the
loop when that sum is within the session's ``inline_threshold_us``, as cheap single ops
do (the first call's wall time is no guide: the hop and cold caches inflate it). Two
consecutive inline calls that take more than four times that threshold (the function does work of
its own between ops) send those shapes back to the pool; one call in
``RETRY_INLINE_EVERY`` (64) then runs inline again, and those shapes stay inline if it
is fast (the slow runs were contention, not the function). JAX keys its compilation
cache on shapes the same way.

Ownership of intermediates: the registry belongs to the loop thread, so values made
inside the function are not registered one by one (that would need a hop back to the
loop per op). Each run counts them in a :class:`~aiotensor._programs._interpreter.Budget`: their
bytes are checked against what ``memory_limit`` leaves free when the kernel starts,
and the session's statistics record them as allocated and freed, with their peak in
``peak_bytes``. They are freed by reference counting as soon as the function drops
them. Only the values the function returns escape, as tensors owned by the session.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._engine._core import Engine
from .._engine._session_rule import engine_of, session_engine
from .._errors import InvalidArgumentError
from .._expr import Expr
from .._kernels import SEQUENCES, read_only_view, unshared
from .._opdef import ALIASES, BINARY_OPERATORS, COMPARISON_OPERATORS, INTERNAL_OPS, OPS, UNARY_OPERATORS, OpDef
from .._programs._interpreter import RECYCLER, Budget, Interpreter
from .._programs._placement import Placement
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._protocols import SessionLike
    from .._types import NDArray

__all__ = ["FusedFunction", "FusedOps", "FusedValue", "function", "unknown_op"]

_ndarray = np.ndarray
_new = object.__new__
_clock = time.perf_counter


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


class FusedOps(Interpreter):
    """The ``ops`` argument of a fused function: every op of the library, synchronous.

    ``ops.add(x, 1)``, ``ops.matmul(x, w)``, ``ops.split(x, 2)`` ... take and return
    :class:`FusedValue` objects (and numbers, arrays, and tensors of the session).
    """

    # The driver of the interpreter for a function's Python: arguments wrapped as values,
    # each op's spec applied, its arguments unwrapped, the step applied by the interpreter.
    __slots__ = ("_elapsed", "_engine", "_fn")

    def __init__(
        self,
        engine: Engine,
        budget: Budget,
        measure: bool = True,
        fn: Callable[..., Any] | None = None,
        recycle: bool = False,
    ) -> None:
        # Interpreter.__init__, written out: a fused call makes one of these, and the
        # call through super() doubled what making it costs (~150 ns more a call).
        xp = engine._xp
        self._budget = budget
        self._xp = xp
        self._estimate = 0.0 if measure else None
        self._recycle = RECYCLER if recycle else None
        self._fast = not measure and not recycle and xp is np
        self._keeps = not measure and recycle and xp is np
        self._blas = self._big = False
        self._engine = engine
        self._fn = fn  # the fused function whose call this is (see _kernel)
        self._elapsed = math.inf

    if TYPE_CHECKING:  # (for type checkers only: see unknown_op)

        def __getattr__(self, name: str) -> Callable[..., Any]: ...

    def _kernel(self, *args: Any, **kwargs: Any) -> Any:
        # The kernel of one call of ``_fn`` (the engine runs this bound method): wrap the
        # arguments, call the function, unwrap its results, time it all.
        start = _clock()
        wrapped = []
        for a in args:
            if type(a) is _ndarray:  # a tensor's buffer: FusedValue(a, self), without the call
                v = _new(FusedValue)
                v._arr = a
                v._ops = self
                wrapped.append(v)
            else:
                wrapped.append(_wrap_arg(a, self))
        try:
            if kwargs:
                out = self._fn(self, *wrapped, **{k: _wrap_arg(v, self) for k, v in kwargs.items()})  # type: ignore[misc]
            else:
                out = self._fn(self, *wrapped)  # type: ignore[misc]
        except AttributeError as exc:
            error = unknown_op(exc, self)
            if error is exc:
                raise
            raise error from None
        if type(out) is _MadeValue and not out._arr.flags.writeable:
            # The common result, one value made in this run: _result's first case, inline.
            arr = out._arr
            arr.setflags(True)  # type: ignore[call-arg]
            self._budget.escaped += 1
            out = arr
        elif isinstance(out, SEQUENCES):
            out = [_result(o, self._budget) for o in out]
        else:
            out = _result(out, self._budget)
        self._elapsed = (_clock() - start) * 1e6
        return out

    def _arg(self, x: Any, op: str) -> Any:
        tx = type(x)
        if tx is _MadeValue or tx is FusedValue:
            return x._arr
        if tx is Tensor:  # e.g. weights captured by the function: read in place
            return self._engine.buffer(x, op)
        if tx is list or tx is tuple:
            return tx(self._arg(e, op) for e in x)
        return x

    def _run(self, d: OpDef, /, *args: Any, **kwargs: Any) -> Any:
        # The same spec and kernel as the op outside, on this thread, at once.
        if kwargs and "name" in kwargs and d not in _TAKES_NAME:
            del kwargs["name"]
        if d.plain:
            kw: dict[str, Any] | None = kwargs or None
        else:
            args, kw, _ = d.spec(*args, **kwargs)
        label = d.name
        vals = tuple([a._arr if isinstance(a, FusedValue) else self._arg(a, label) for a in args])
        if kw:
            kw = {k: self._arg(v, label) for k, v in kw.items()}
        out = self._step(d, label, vals, kw, args)
        if type(out) is _ndarray:
            return self._made(out, label, args)
        if isinstance(out, SEQUENCES):
            outs = [self._made(np.asarray(o), label, args) for o in out]
            return outs if d.result is None else d.result(outs)
        return self._made(np.asarray(out), label)


FusedOps._made_type = _MadeValue
FusedOps._view_type = FusedValue


def _plain_numpy(d: OpDef) -> bool:
    # Ops the hot path (FusedOps._plain) may run: no spec to apply, a numpy kernel.
    return d.plain and d.kernel_for(np) is not None


def _fused_op(d: OpDef) -> Callable[..., Any]:
    if _plain_numpy(d):

        def run(self: FusedOps, *args: Any, **kwargs: Any) -> Any:
            if (self._fast or self._keeps) and not kwargs:
                vals = []
                for a in args:
                    ta = type(a)
                    if ta is _MadeValue or ta is FusedValue:
                        vals.append(a._arr)
                    elif ta is float or ta is int or ta is _ndarray:
                        vals.append(a)
                    else:
                        break
                else:
                    return self._plain(d, tuple(vals)) if self._fast else self._kept(d, tuple(vals), args)
            return self._run(d, *args, **kwargs)

    else:

        def run(self: FusedOps, *args: Any, **kwargs: Any) -> Any:
            return self._run(d, *args, **kwargs)

    run.__name__ = run.__qualname__ = d.name
    run.__doc__ = d.doc
    return run


for _d in OPS.values():
    setattr(FusedOps, _d.name, _fused_op(_d))
for _alias, _target in ALIASES.items():  # ops.asarray, as s.asarray and at.asarray
    setattr(FusedOps, _alias, getattr(FusedOps, _target))

# Ops whose spec takes ``name=`` (the others drop it: a fused value has no name).
_TAKES_NAME = frozenset(d for d in OPS.values() if not d.plain and "name" in d.spec.__code__.co_varnames)


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


def unknown_op(exc: AttributeError, ops: FusedOps) -> AttributeError:
    """``exc`` as it should read: "fused functions have no op 'name'" if it is ``ops.name`` that failed.

    FusedOps has no ``__getattr__`` to say so itself: CPython cannot specialize attribute
    reads on a class that has one (each costs ~3x), and the hot path of a fused function
    reads the ops object's attributes several times per op. Other errors come back as
    they are.
    """
    if exc.obj is not ops or exc.name is None:
        return exc
    error = AttributeError(f"fused functions have no op {exc.name!r}", name=exc.name, obj=ops)
    return error.with_traceback(exc.__traceback__)


def _wrap_arg(x: Any, ops: FusedOps) -> Any:
    if isinstance(x, np.ndarray):
        return FusedValue(x, ops)
    if type(x) in (list, tuple):
        return type(x)(_wrap_arg(e, ops) for e in x)
    return x


def _shape_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    # Flat, two entries per argument (a tensor's shape and dtype, or another value's type
    # and shape), as FusedFunction.__call__ builds it for tensors without this call.
    key: list[Any] = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if type(a) is Tensor:
            key += (a._shape, a._dtype)
        else:
            key += (type(a), getattr(a, "shape", None))
    return tuple(key)


class FusedFunction:
    """``fn(ops, *args, **kwargs)`` as a coroutine function that runs as one op.

    Made by :func:`function` or :meth:`AsyncEagerSession.function`. Awaiting a call
    returns a tensor, or a tuple of tensors if ``fn`` returned a tuple or list.
    """

    __name__: str

    def __init__(self, fn: Callable[..., Any], session: SessionLike | None = None) -> None:
        if not callable(fn):
            raise InvalidArgumentError(f"function: fn must be callable, got {type(fn).__name__}")
        self._fn = fn
        self._session = session
        # The bound session's engine, looked up once (its engine never changes).
        self._bound: Engine | None = None if session is None else session_engine(session)
        self._op = f"function({getattr(fn, '__name__', type(fn).__name__)})"
        self._placement = Placement()
        # Per argument shapes, the bytes the last run's values held at their peak: what a
        # session with a memory_limit reserves (or waits for) before the next run.
        self._needs: dict[tuple[Any, ...], int] = {}
        functools.update_wrapper(self, fn)

    async def _call_on_values(
        self, engine: Engine, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor | tuple[Tensor, ...]:
        # Expressions given: evaluated first in the call's session, freed after the call.
        args, kwargs, made = await engine.evaluate_arguments(args, kwargs)
        try:
            return await self(*args, **kwargs)
        finally:
            for t in made:
                engine.discard(t)

    async def _call_remote(
        self, engine: Engine, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor | tuple[Tensor, ...]:
        # A backend out of this process (Dask): the whole call is one task, the function
        # running where its inputs are, with ops of its own there.
        op = self._op
        try:
            bufs = tuple([_buffers(engine, a, op) for a in args])
            kw = {k: _buffers(engine, v, op) for k, v in kwargs.items()}
        except _ExprArgument:
            return await self._call_on_values(engine, args, kwargs)
        captured = _captured_tensor(self._fn)
        if captured is not None:
            _WorkerEngine().buffer(captured, op)  # raises: it cannot travel to the worker
        kernel = _OnWorker(self._fn)
        tensors, multi = await engine.call(op, kernel, bufs, kw, args, user=True, budget=Budget("a fused function"))
        return tuple(tensors) if multi else tensors[0]

    async def __call__(self, *args: Any, **kwargs: Any) -> Tensor | tuple[Tensor, ...]:
        engine = self._bound
        if engine is None:
            engine = engine_of(args, kwargs)
        op = self._op
        if not engine.backend.in_process:
            return await self._call_remote(engine, args, kwargs)
        bufs = None
        if not kwargs:
            # The common call, on live tensors of the engine's own session: their buffers and
            # the shape key in one pass, without a call per argument.
            found = []
            shapes: list[Any] = []
            for a in args:
                if type(a) is not Tensor or a._engine is not engine:
                    break
                entry = a._registry._buffers.get(a._rid)
                if entry is None:
                    break
                found.append(entry[0])
                shapes += (a._shape, a._dtype)
            else:
                bufs, key = tuple(found), tuple(shapes)
        try:
            if bufs is None:
                bufs = tuple([engine.buffer(a, op) if type(a) is Tensor else _buffers(engine, a, op) for a in args])
                key = _shape_key(args, kwargs)
            kw = {k: _buffers(engine, v, op) for k, v in kwargs.items()} if kwargs else {}
        except _ExprArgument:
            return await self._call_on_values(engine, args, kwargs)
        budget = Budget("a fused function")
        est = self._placement.estimate(key)
        ops = FusedOps(engine, budget, est is None, self._fn)
        if est is None:
            est = math.inf
        kernel = ops._kernel
        done = engine.call_inline(op, kernel, bufs, kw, args, user=True, est_us=est, budget=budget)
        if done is None:
            limited = engine.registry.memory_limit is not None
            need = self._needs.get(key) if limited else None  # what its last run for these shapes held
            try:
                done = await engine.call(op, kernel, bufs, kw, args, user=True, est_us=est, budget=budget, need=need)
            finally:
                if limited and budget.peak:
                    self._needs[key] = max(budget.peak, budget.live)
        tensors, multi = done
        estimate = math.inf if ops._estimate is None else ops._estimate
        self._placement.record(key, est, estimate, ops._elapsed, engine._inline_us)
        return tuple(tensors) if multi else tensors[0]


class _WorkerEngine:
    """What a fused function's ops see of the session on a remote worker: numpy, no tensors."""

    _xp = np

    def buffer(self, x: Tensor, op: str) -> Any:
        raise InvalidArgumentError(
            f"{op}: tensor {x.name!r} is not an argument of the call: on a remote backend a fused"
            " function reads only the tensors it is given (pass it as an argument)"
        )


def _captured_tensor(fn: Callable[..., Any]) -> Tensor | None:
    # A tensor the function reads from its closure or module (weights, typically).
    try:
        found = inspect.getclosurevars(fn)
    except TypeError:  # not a Python function (a callable object): the worker tells
        return None
    for value in (*found.nonlocals.values(), *found.globals.values()):
        if type(value) is Tensor:
            return value
    return None


class _OnWorker:
    """A fused function's call as one kernel a remote backend runs (picklable: the function by value)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn  # (backends name the task after ``fn``)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ops = FusedOps(cast("Engine", _WorkerEngine()), Budget("a fused function"), False, self.fn)
        return ops._kernel(*args, **kwargs)


class _ExprArgument(Exception):
    """An argument of a fused call is an expression: it is evaluated first."""


def _buffers(engine: Engine, x: Any, op: str) -> Any:
    tx = type(x)
    if tx is Tensor:
        return engine.buffer(x, op)
    if tx is list or tx is tuple:
        if Expr in map(type, x):
            raise _ExprArgument
        return tx(engine.buffer(e, op) if type(e) is Tensor else e for e in x)
    if tx is Expr:
        raise _ExprArgument
    return x


def function(fn: Callable[..., Any], /) -> FusedFunction:
    """Make ``fn(ops, *args)`` one op: all its ops run synchronously in one kernel.

    The session is found as for module-level ops (from the tensor arguments, else
    the default session). Use :meth:`AsyncEagerSession.function` to bind one.

    Example::

        @at.function
        def layer(ops, x, w, b):
            return ops.relu(x @ w + b)

        y = await layer(x, w, b)  # one dispatch

    Raises:
        InvalidArgumentError: ``fn`` is not callable (here), or an op inside got
            bad arguments (when called).
        KernelError: ``fn`` raised something else; the original is the ``__cause__``.
    """
    return FusedFunction(fn)
