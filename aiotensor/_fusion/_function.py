"""Fused functions: a whole function of ops run as one kernel.

``@at.function`` (or ``s.function(fn)``) turns ``fn(ops, *args)`` into a coroutine
function. Awaiting it runs one kernel; inside, ``ops`` is the op table made synchronous
(:class:`~aiotensor._fusion._fused_ops.FusedOps`: ``ops.add(x, y)`` returns at once) and
tensor arguments arrive as :class:`~aiotensor._fusion._fused_value.FusedValue` objects
with the usual operators. So ten small ops cost one dispatch instead of ten.

The function's Python runs eagerly (its control flow is Python's): ``ops`` is the
driver of the one step executor of multi-op kernels, ``_interpreter.Interpreter``,
which applies each op (checks, kernel, errors, the run's budget, recycled outputs for
batched kernels) as an expression's program applies its steps. Its intermediates are
counted in the run's budget and freed as the function drops them; only the values it
returns escape, as tensors owned by the session (see ``_fused_value``).

Where it runs (``_placement.Placement``): a fused function's cost is unknown until it
has run, so its first call for given argument shapes goes to the pool, where the cost
model of single ops (``_cost``) adds up the ops it runs; later calls with those shapes run inline on the
loop when that sum is within the session's ``inline_threshold_us``, as cheap single ops
do (the first call's wall time is no guide: the hop and cold caches inflate it). Two
consecutive inline calls that take more than four times that threshold (the function does work of
its own between ops) send those shapes back to the pool; one call in
``RETRY_INLINE_EVERY`` (64) then runs inline again, and those shapes stay inline if it
is fast (the slow runs were contention, not the function). JAX keys its compilation
cache on shapes the same way. The same measured run says how much of the sum runs
without the GIL, which busy-loop placement weighs (``_loopload``).

On a backend out of this process the whole call is one task (``_remote``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._engine._core import Engine
from .._engine._session_rule import engine_of, session_engine
from .._errors import InvalidArgumentError
from .._programs._interpreter import Budget
from .._programs._placement import Placement
from .._tensor import Tensor
from ._arguments import _buffers, _ExprArgument, _shape_key
from ._fused_ops import FusedOps
from ._remote import _captured_tensor, _OnWorker, _WorkerEngine

if TYPE_CHECKING:
    from .._protocols import SessionLike

__all__ = ["FusedFunction", "function"]


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
        free = self._placement.free_us(key)
        done = engine.call_inline(op, kernel, bufs, kw, args, user=True, est_us=est, budget=budget, free_us=free)
        if done is None:
            limited = engine.registry.memory_limit is not None
            need = self._needs.get(key) if limited else None  # what its last run for these shapes held
            try:
                done = await engine.call(
                    op, kernel, bufs, kw, args, user=True, est_us=est, budget=budget, need=need, free_us=free
                )
            finally:
                if limited and budget.peak:
                    self._needs[key] = max(budget.peak, budget.live)
        tensors, multi = done
        estimate = math.inf if ops._estimate is None else ops._estimate
        self._placement.record(key, est, estimate, ops._elapsed, engine._inline_us, ops.free_us)
        return tuple(tensors) if multi else tensors[0]


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
        RuntimeWarning: numpy's floating-point warning inside ``fn`` when the caller's
            warning filters make it an error (as numpy raises it), at the caller's line.
    """
    return FusedFunction(fn)
