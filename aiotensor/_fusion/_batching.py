"""Micro-batching: concurrent calls of a fused function coalesced into one kernel call.

``@at.batched`` turns ``fn(ops, x, *params)`` (the signature of a fused function, with
``x`` holding rows along axis 0) into a coroutine function. Calls made concurrently with
the *same* param objects and rows of the same trailing shape and dtype join one group,
of up to ``max_batch_size`` rows: a call that would take it over starts the next group.
The group's first call leads it: it lets the event loop run one more iteration (never a
timer), so every call that was ready joins. The first call to join starts the group's
task, which runs in the next loop iteration (as the leader resumes; the batch's kernel is
submitted there, as a hand-written batcher's ``call_soon`` flush would), closes the group
and runs its one kernel call, so that no caller's cancellation can stop it. A group
nobody joined runs its kernel in the leader's own task, exactly as a fused call would.
A batch runs ``fn`` once on the stacked rows, as a fused function runs
(:mod:`aiotensor._fusion._function`: one kernel, on the pool or inline as its cost says),
and its kernel (:mod:`aiotensor._fusion._batch_kernel`) splits every output into each
caller's rows.

Sessions: the batch runs in the session that owns the params (the most derived session
among their tensors; if they hold no tensor, the callers' session, and only callers of
one session then share a batch). Its stacked rows and intermediates are counted there,
in a :class:`~aiotensor._programs._program.Budget`, as a fused function's are, and so are the
outputs, which ``engine.call`` registers there: a caller whose session is that one
takes its tensors as they are; any other caller's rows leave that session at once and
are registered in the caller's session (that of ``x`` if ``x`` is a tensor, else the
default session, else the params' session), counting against its ``memory_limit``.
The kernel runs under the context variables of the batch's first caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import math
import operator
import types
import weakref
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast, overload

import numpy as np

from .. import _defaults
from .._engine._core import Engine
from .._engine._lifecycle import State
from .._engine._session_rule import engine_of, session_engine
from .._errors import BackendError, InvalidArgumentError, NoSessionError, SessionClosedError
from .._expr import Expr, Operand
from .._kernels import NUMERIC_KINDS, KernelResult, info, numeric_array
from .._programs._placement import Placement
from .._programs._program import Budget
from .._tensor import Tensor
from ._batch_kernel import BatchKernel
from ._function import FusedOps, _buffers

if TYPE_CHECKING:
    from typing import TypeAlias

    from .._protocols import EngineLike
    from .._types import NDArray

    # A waiting call: (its rows, the engine of its result's session, the future of its result).
    _Caller: TypeAlias = tuple[NDArray, Engine, asyncio.Future[Any]]

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MAX_CONCURRENT_BATCHES", "BatchStats", "BatchedFunction", "batched"]

#: Rows per kernel call unless ``max_batch_size`` says otherwise.
DEFAULT_MAX_BATCH_SIZE = 512
#: Kernel calls of one batched function running at once (per event loop) unless
#: ``max_concurrent_batches`` says otherwise: no limit (the pool's workers are the limit).
DEFAULT_MAX_CONCURRENT_BATCHES: int | None = None
_OPEN = State.OPEN
# A waiting caller's rows and future (C-level getters: the group's task maps them over its callers).
_rows_of = operator.itemgetter(0)
_future = operator.itemgetter(2)
_done = operator.methodcaller("done")  # (any loop's future type)
_get_loop = asyncio.get_running_loop
_ndarray = np.ndarray


@types.coroutine
def _one_iteration() -> Generator[None, None, None]:
    # asyncio.sleep(0) without its two coroutine layers: a bare yield lets the loop run
    # the callbacks that are ready (the other callers) before this task goes on.
    yield


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What a batched function has done since it was made (:meth:`BatchedFunction.stats`).

    Attributes:
        calls: Calls whose rows went into a kernel call.
        batches: Kernel calls made.
        rows: Rows over all kernel calls.
        max_rows: Rows of the largest kernel call.
        cancelled: Calls cancelled while they waited: removed from their batch before it
            ran, or their rows dropped after it ran.
        failed: Kernel calls that raised (each of their callers got the error).
    """

    calls: int = 0
    batches: int = 0
    rows: int = 0
    max_rows: int = 0
    cancelled: int = 0
    failed: int = 0

    @property
    def rows_per_batch(self) -> float:
        """Mean rows per kernel call (0 before the first)."""
        return self.rows / self.batches if self.batches else 0.0

    @property
    def calls_per_batch(self) -> float:
        """Mean calls coalesced per kernel call (0 before the first)."""
        return self.calls / self.batches if self.batches else 0.0


class _Group:
    """Calls of one batch: the same params, the same kind of rows, ``max_batch_size`` rows at most."""

    __slots__ = ("callers", "ctx", "engine", "params", "rows", "task")

    def __init__(self, engine: Engine, params: tuple[Any, ...], caller: _Caller, rows: int) -> None:
        self.engine = engine  # where the batch runs: the params' session
        self.params = params  # held: the group is keyed by their ids
        self.callers = [caller]
        self.rows = rows
        self.ctx = contextvars.copy_context()  # its first caller's: the batch runs under them
        self.task: asyncio.Task[None] | None = None  # started by the first call to join


class BatchedFunction:
    """``fn(ops, x, *params)`` as a coroutine function whose concurrent calls share kernel calls.

    Made by :func:`batched`. ``await f(x, *params)`` returns the rows of ``x`` through
    ``fn`` as a tensor (a tuple of tensors if ``fn`` returns a tuple or list), owned by
    the session of ``x`` if it is a tensor, else the default session, else the session
    of the first tensor among ``params``.
    """

    __name__: str

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        row_shape: tuple[int, ...] | None = None,
        dtype: Any = None,
        max_concurrent_batches: int | None = DEFAULT_MAX_CONCURRENT_BATCHES,
    ) -> None:
        if not callable(fn):
            raise InvalidArgumentError(f"batched: fn must be callable, got {type(fn).__name__}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise InvalidArgumentError(f"batched: max_batch_size must be an int >= 1, got {max_batch_size!r}")
        m = max_concurrent_batches
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InvalidArgumentError(f"batched: max_concurrent_batches must be None or an int >= 1, got {m!r}")
        if row_shape is not None:
            try:
                row_shape = tuple(int(n) for n in row_shape)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"batched: row_shape must be a tuple of ints, got {row_shape!r}") from None
        try:
            self._dtype = None if dtype is None else np.dtype(dtype)
        except TypeError as exc:
            raise InvalidArgumentError(f"batched: dtype {dtype!r} is not a dtype ({exc})") from None
        self._fn = fn
        self._max = max_batch_size
        self._concurrent = m
        # Per event loop: the slots of kernel calls running at once (a loop's own primitives).
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._row_shape = row_shape
        self._any_rows = row_shape is None and self._dtype is None  # (no option to check rows against)
        self._label = f"batched({getattr(fn, '__name__', type(fn).__name__)})"
        self._placement = Placement()
        self._pending: dict[tuple[Any, ...], _Group] = {}
        self._running: set[asyncio.Task[None]] = set()
        # Per shape key, from the last run on recycling ops: (did fn call BLAS, did it make
        # outputs worth recycling). Before the first run: assume both.
        self._learned: dict[tuple[Any, ...], tuple[bool, bool]] = {}
        self._counts = dict.fromkeys(BatchStats.__slots__, 0)
        self._needs: dict[tuple[Any, ...], int] = {}  # per shape key: bytes the last batch held at its peak
        functools.update_wrapper(self, fn)

    @property
    def max_batch_size(self) -> int:
        """Rows per kernel call at most (a single call with more rows runs alone, unsplit)."""
        return self._max

    @property
    def max_concurrent_batches(self) -> int | None:
        """Kernel calls of this function running at once, per event loop, at most (``None``: no limit)."""
        return self._concurrent

    def stats(self) -> BatchStats:
        """Counts of calls, kernel calls and rows so far (a snapshot)."""
        return BatchStats(**self._counts)

    async def __call__(self, x: Any, *params: Any) -> Tensor | tuple[Tensor, ...]:
        loop = _get_loop()
        tx = type(x)
        # The common case first, without the general checks' calls: params all tensors of
        # one session, x an ndarray or a tensor.
        runner: Any = None
        for p in params:
            if type(p) is not Tensor:
                runner = None
                break
            e = p._engine
            if runner is None:
                runner = e
            elif e is not runner:
                runner = None
                break
        if runner is not None and (tx is _ndarray or tx is Tensor):
            if tx is Tensor:
                engine = x._engine
            else:
                default = _defaults.get_default_session()
                engine = runner if default is None else session_engine(default)
            if engine is not runner and runner not in engine.ancestors:
                engine, runner = self._engines(x, params)  # (it raises the error)
        else:
            types = {tx, *map(type, params)}
            if Expr in types or ((list in types or tuple in types) and _nested_expr(params)):
                return await self._call_on_values(x, params)
            engine, runner = self._engines(x, params)
        if engine.state is not _OPEN:
            await engine.open()
        if engine._loop is not loop:
            raise engine._wrong_loop()
        if not engine.backend.in_process:
            # Before reading x's rows: a remote tensor's buffer is a handle, not rows.
            raise InvalidArgumentError(f"{self._label}: batched functions run on local backends only")
        if tx is _ndarray and self._any_rows and x.ndim and x.shape[0] and x.dtype.kind in NUMERIC_KINDS:
            arr = x  # rows as they are: no option to check them against
        else:
            arr = self._rows(x, engine)
        shape = arr.shape
        n = shape[0]
        key = (loop, runner, tuple(map(id, params)), shape[1:], arr.dtype)
        future = loop.create_future()
        caller = (arr, engine, future)
        pending = self._pending
        group = pending.get(key)
        if group is not None:
            if group.rows + n <= self._max:
                group.callers.append(caller)
                group.rows += n
                if group.task is None:
                    # The first call to join starts the group's task: it runs in the next
                    # loop iteration, with the leader's resumption, and submits the kernel.
                    self._spawn(key, group, loop)
                if group.rows >= self._max:
                    del pending[key]  # full: the next call starts a group of its own
                try:
                    out: Tensor | tuple[Tensor, ...] = await future  # its tensor (a tuple: several outputs), in runner
                except asyncio.CancelledError:
                    _drop_result(future, runner)
                    raise
                if engine is runner:  # its tensors are its session's already
                    return out
                moved = self._moved(engine, runner, out)
                if moved is not None:  # (no coroutine: the common case of a child session's caller)
                    return moved
                return await self._deliver(engine, runner, out)
            del pending[key]  # this call would take it over the limit: it leads the next one
        # The first call leads the group: one loop iteration (not a timer) lets the calls
        # that are ready now join it (the first to join starts its batch's task).
        group = _Group(runner, params, caller, n)
        if n < self._max:
            pending[key] = group
        # What this session dropped is freed now, as an inline op would: otherwise the
        # loop iteration below would wake the cleanup task just for it.
        inline_point = engine.policy.inline_point
        if inline_point is not None:
            inline_point()
        try:
            await _one_iteration()
        except asyncio.CancelledError:
            if group.task is None:
                self._close(key, group)
            else:
                future.cancel()  # its batch leaves it out
            raise
        if group.task is not None:
            try:
                out = await future
            except asyncio.CancelledError:
                _drop_result(future, runner)
                raise
            if engine is runner:
                return out
            moved = self._moved(engine, runner, out)
            if moved is not None:  # (no coroutine: the common case of a child session's caller)
                return moved
            return await self._deliver(engine, runner, out)
        # Alone: its batch of one runs in this task, as a fused function call would.
        if pending.get(key) is group:
            del pending[key]
        self._count(1, n)
        try:
            if self._concurrent is None:  # (no lane to take: one coroutine frame less)
                tensors, multi = await self._kernel_call(group, [caller], n)
            else:
                tensors, multi = await self._execute(group, [caller], n)
        except asyncio.CancelledError:
            self._counts["cancelled"] += 1
            raise
        except Exception:
            self._counts["failed"] += 1
            raise
        out = tuple(tensors) if multi else tensors[0]
        if engine is runner:  # its tensors are its session's already
            return out
        moved = self._moved(engine, runner, out)
        if moved is not None:  # (no coroutine: the common case of a child session's caller)
            return moved
        return await self._deliver(engine, runner, out)

    async def _call_on_values(self, x: Any, params: tuple[Any, ...]) -> Tensor | tuple[Tensor, ...]:
        # Expressions given: evaluated first where the rule of evaluation says (the
        # session of the call's tensors, theirs included), freed after the call.
        engine = engine_of((x, *params), None)
        (x, *rest), _, made = await engine.evaluate_arguments((x, *params), {})
        try:
            return await self(x, *rest)
        finally:
            for t in made:
                engine.discard(t)

    def _moved(self, engine: Engine, runner: Engine, out: Tensor | tuple[Tensor, ...]) -> Tensor | None:
        """One output's rows moved into the caller's session when nothing is to await (no memory limit), else None."""
        if type(out) is not Tensor or engine.registry.memory_limit is not None or engine.state is not _OPEN:
            return None  # (then _deliver: it fits them under the limit, or says the session closed)
        label = self._label
        arr = runner.buffer(out, label)
        runner.discard(out)
        return engine._register(arr, label, None, engine.place(label))

    async def _deliver(
        self, engine: Engine, runner: Engine, out: Tensor | tuple[Tensor, ...]
    ) -> Tensor | tuple[Tensor, ...]:
        """The caller's rows as tensors of its own session, ``engine`` (registered in the batch's until now)."""
        label = self._label
        mine: tuple[Tensor, ...] = out if type(out) is tuple else (cast(Tensor, out),)
        arrays = [runner.buffer(t, label) for t in mine]
        _discard(mine, runner)
        if engine.state is not _OPEN:
            raise SessionClosedError(f"{label}: the session was closed while the call waited for its batch")
        device = engine.place(label)
        multi = type(out) is tuple
        result = KernelResult([info(a) for a in arrays], multi)
        tensors = await engine._own(result, label, None, None, device)
        return tuple(tensors) if multi else tensors[0]

    def _engines(self, x: Any, params: tuple[Any, ...]) -> tuple[Engine, Engine]:
        """The engine that owns the caller's result, and the one its batch runs in."""
        first: EngineLike | None = None  # the first tensor's among the params
        owner: EngineLike | None = None  # the most derived of theirs: it may read them all
        for p in params:
            tp = type(p)
            if tp is Tensor and p._engine is owner:  # the common case: params of one session
                continue
            for t in p if tp is list or tp is tuple else (p,):
                if type(t) is not Tensor:
                    continue
                e = t._engine
                if owner is None:
                    first = owner = e
                elif e is not owner and e not in owner.ancestors:
                    if owner not in e.ancestors:
                        raise InvalidArgumentError(
                            f"{self._label}: params mix tensors of unrelated sessions"
                            f" ({owner.session!r} and {e.session!r})"
                        )
                    owner = e
        engine: EngineLike
        if type(x) is Tensor:
            engine = x._engine
        else:
            default = _defaults.get_default_session()
            if default is not None:
                engine = session_engine(default)
            elif first is not None:
                engine = first
            else:
                raise NoSessionError(
                    f"{self._label}: no session for the result: pass x as a tensor, put a tensor among the"
                    " params, or use `with session.as_default():`"
                )
        if owner is None:
            return cast("tuple[Engine, Engine]", (engine, engine))
        if owner is not engine and owner not in engine.ancestors:
            raise InvalidArgumentError(
                f"{self._label}: the params belong to {owner.session!r}, which the result's session"
                f" {engine.session!r} cannot read; call it from that session or a child of it (parent=)"
            )
        return cast("tuple[Engine, Engine]", (engine, owner))  # (tensors see their engine as EngineLike)

    def _rows(self, x: Any, engine: Engine) -> NDArray:
        """``x`` as an array of rows, checked before it may join a batch."""
        label = self._label
        tx = type(x)
        if tx is np.ndarray:
            arr: NDArray = x
        elif tx is Tensor:
            arr = engine.buffer(x, label)
        elif isinstance(x, Operand):
            raise InvalidArgumentError(f"{label}: x is an expression; await it first")
        else:
            try:
                arr = numeric_array(x, None)
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(f"{label}: x: {exc}") from None
        if arr.dtype.kind not in NUMERIC_KINDS:
            raise InvalidArgumentError(
                f"{label}: x has dtype {arr.dtype}; tensors hold bool, integer, float or complex"
            )
        if not arr.ndim or not arr.shape[0]:
            raise InvalidArgumentError(f"{label}: x must hold at least one row along axis 0, got shape {arr.shape}")
        if self._row_shape is not None and arr.shape[1:] != self._row_shape:
            raise InvalidArgumentError(f"{label}: x has rows of shape {arr.shape[1:]}, expected {self._row_shape}")
        if self._dtype is not None and arr.dtype != self._dtype:
            raise InvalidArgumentError(f"{label}: x has dtype {arr.dtype}, expected {self._dtype}")
        return arr

    def _close(self, key: tuple[Any, ...], group: _Group) -> None:
        """Take the group out of the pending ones (if it is still there): no call joins it now."""
        if self._pending.get(key) is group:
            del self._pending[key]

    def _count(self, calls: int, rows: int) -> None:
        counts = self._counts
        counts["calls"] += calls
        counts["batches"] += 1
        counts["rows"] += rows
        if rows > counts["max_rows"]:
            counts["max_rows"] = rows

    def _spawn(self, key: tuple[Any, ...], group: _Group, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._run(key, group), context=group.ctx)
        group.task = task
        self._running.add(task)  # the loop keeps only a weak reference to tasks
        task.add_done_callback(self._running.discard)

    async def _run(self, key: tuple[Any, ...], group: _Group) -> None:
        """The task of a group that several calls joined: close it and run its batch.

        Each caller gets its rows, or the batch's error.
        """
        self._close(key, group)
        callers = group.callers
        if any(map(_done, map(_future, callers))):  # (a cancelled call's future is done)
            callers = [c for c in callers if not c[2].done()]
            self._counts["cancelled"] += len(group.callers) - len(callers)
        if not callers:
            return
        rows = group.rows if len(callers) == len(group.callers) else sum([c[0].shape[0] for c in callers])
        self._count(len(callers), rows)
        try:
            if self._concurrent is None:  # (no lane to take: one coroutine frame less)
                tensors, multi = await self._kernel_call(group, callers, rows)
            else:
                tensors, multi = await self._execute(group, callers, rows)
        except BaseException as exc:
            self._counts["failed"] += 1
            error: BaseException = exc
            if isinstance(exc, asyncio.CancelledError):  # the loop is closing: the callers must not hang
                error = BackendError(f"{self._label}: the batch was cancelled before it finished")
            for i, c in enumerate(callers):
                if not c[2].done():
                    c[2].set_exception(error if i == 0 else _copy_error(error))
            if not isinstance(exc, Exception):
                raise
            return
        # Each caller's future gets what its call returns: its tensor, or a tuple of them.
        runner = group.engine
        cancelled = 0
        if multi:
            k = len(tensors) // len(callers)
            for i, (_, _, future) in enumerate(callers):
                mine = tuple(tensors[i * k : i * k + k])
                if future.done():  # cancelled while the batch ran: its rows are dropped now
                    cancelled += 1
                    _discard(mine, runner)
                else:
                    future.set_result(mine)
        else:
            for (_, _, future), t in zip(callers, tensors, strict=True):
                if future.done():
                    cancelled += 1
                    runner.discard(t)
                else:
                    future.set_result(t)
        if cancelled:
            self._counts["cancelled"] += cancelled

    async def _execute(self, group: _Group, callers: list[_Caller], rows: int) -> tuple[list[Tensor], bool]:
        """One kernel call on the callers' rows, when a lane is free: per caller, its tensors (batch's session)."""
        if self._concurrent is None:
            return await self._kernel_call(group, callers, rows)
        loop = _get_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = asyncio.Semaphore(self._concurrent)
        async with lane:  # acquired without suspending when a lane is free
            return await self._kernel_call(group, callers, rows)

    async def _kernel_call(self, group: _Group, callers: list[_Caller], rows: int) -> tuple[list[Tensor], bool]:
        engine, label = group.engine, self._label
        if not engine.backend.in_process:
            # The batch's bookkeeping (and the callers' rows) live in this process.
            raise InvalidArgumentError(f"{label}: batched functions run on local backends only")
        params = group.params
        x0 = callers[0][0]
        xs = tuple(map(_rows_of, callers))
        found: list[Any] = [xs]
        shapes: list[Any] = [rows, x0.shape[1:], x0.dtype]
        for p in params:
            # The common param, a live tensor of this session: its buffer and its part of
            # the key in one step, as a fused function call takes them.
            entry = p._registry._buffers.get(p._rid) if type(p) is Tensor and p._engine is engine else None
            if entry is None:
                found.append(_buffers(engine, p, label))
                shapes.append(_shape_of(p))
            else:
                found.append(entry[0])
                shapes.append((p._shape, p._dtype))
        bufs, key = tuple(found), tuple(shapes)
        budget = Budget("a batched function")
        est = self._placement.estimate(key)
        measure = est is None  # the first run for these shapes: on the pool, measured
        if est is None:
            est = math.inf
        blas, recycle = self._learned.get(key, (True, True))
        # For error messages: the stacked rows as they would read (a caller alone: its own rows).
        described = (x0 if len(callers) == 1 else _Rows((rows, *x0.shape[1:]), x0.dtype), *params)
        kernel: Callable[..., Any]
        ops: FusedOps | None = None
        if len(callers) == 1 and not recycle:
            # A caller alone whose earlier runs made no output worth recycling: nothing to
            # stack, split or recycle, so fn runs as a fused function call runs it.
            ops = FusedOps(engine, budget, measure, self._fn)
            kernel = ops._kernel
            bufs = (x0, *bufs[1:])
        else:
            counts = list(map(len, xs))  # (an array's len: its rows)
            kernel = BatchKernel(self._fn, engine, budget, counts, label, measure=measure, recycle=recycle)
        done = engine.call_inline(label, kernel, bufs, {}, described, user=True, est_us=est, budget=budget)
        if done is None:
            # Under a memory_limit: what the last batch of these shapes held is reserved for this one.
            limited = engine.registry.memory_limit is not None
            need = self._needs.get(key) if limited else None
            try:
                done = await engine.call(
                    label, kernel, bufs, {}, described, user=True, est_us=est, budget=budget, need=need, blas=blas
                )
            finally:
                if limited and budget.peak:
                    self._needs[key] = max(budget.peak, budget.live)
        tensors, multi = done
        if ops is not None:
            _check_rows(tensors, rows, label, engine)
            estimate = math.inf if ops._estimate is None else ops._estimate
            self._placement.record(key, est, estimate, ops._elapsed, engine.inline_us)
            return tensors, multi
        assert type(kernel) is BatchKernel
        self._placement.record(key, est, kernel.estimate, kernel.elapsed, engine.inline_us)
        if kernel.blas is not None and kernel.big is not None:  # (learned only from recycling runs)
            self._learned[key] = (kernel.blas, kernel.big)
        return tensors, kernel.multi


def _nested_expr(params: tuple[Any, ...]) -> bool:
    return any((type(p) is list or type(p) is tuple) and Expr in map(type, p) for p in params)


class _Rows:
    """The stacked rows of a batch as error messages describe them (``float32[512, 64]``), without stacking."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape = shape
        self.dtype = dtype


def _check_rows(tensors: list[Tensor], rows: int, label: str, engine: Engine) -> None:
    # A lone caller's outputs, as BatchKernel checks a batch's (then freed: none is returned).
    for i, t in enumerate(tensors):
        if not t._shape or t._shape[0] != rows:
            _discard(tensors, engine)
            raise InvalidArgumentError(
                f"{label}: fn must return arrays with one row per input row ({rows} rows along axis 0);"
                f" output {i} is {t._shape}"
            )


def _drop_result(future: asyncio.Future[Any], runner: Engine) -> None:
    """A cancelled caller's rows, if its batch had handed them over already: dropped now, not taken."""
    if future.done() and not future.cancelled() and future.exception() is None:
        out = future.result()
        _discard((out,) if type(out) is Tensor else out, runner)


def _discard(tensors: Sequence[Tensor], runner: Engine) -> None:
    """Free tensors of the batch's session at once, whatever its strategy (their rows left it or are dropped)."""
    for t in tensors:
        runner.discard(t)


def _shape_of(x: Any) -> Any:
    # A param's part of the placement key (from a tensor's metadata: no buffer lookup).
    tx = type(x)
    if tx is Tensor:
        return (x._shape, x._dtype)
    if tx is np.ndarray:
        return (x.shape, x.dtype)
    if tx is list or tx is tuple:
        return tuple([_shape_of(e) for e in x])
    return tx


def _copy_error(error: BaseException) -> BaseException:
    """The batch's error for one more caller: its own object (tracebacks of one object raised in many tasks pile up)."""
    try:
        other = copy.copy(error)
    except Exception:  # an exception type that does not copy: share the object
        return error
    other.__cause__ = error.__cause__
    other.__suppress_context__ = error.__suppress_context__
    return other


@overload
def batched(fn: Callable[..., Any], /) -> BatchedFunction: ...


@overload
def batched(
    *,
    max_batch_size: int = ...,
    row_shape: tuple[int, ...] | None = ...,
    dtype: Any = ...,
    max_concurrent_batches: int | None = ...,
) -> Callable[[Callable[..., Any]], BatchedFunction]: ...


def batched(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    row_shape: tuple[int, ...] | None = None,
    dtype: Any = None,
    max_concurrent_batches: int | None = DEFAULT_MAX_CONCURRENT_BATCHES,
) -> BatchedFunction | Callable[[Callable[..., Any]], BatchedFunction]:
    """Make ``fn(ops, x, *params)`` a fused function whose concurrent calls share kernel calls.

    ``x`` holds rows along axis 0; ``fn`` must treat rows independently and return
    arrays with one row per input row (a tuple of them for several outputs). Calls made
    while the event loop runs one iteration, with the same ``params`` objects
    (identity, not equality) and rows of the same shape and dtype, are stacked into
    one ``x`` of up to ``max_batch_size`` rows, run as one fused function, and split:
    each caller gets its own rows back. Nothing waits on a timer: a batch starts at the
    next loop iteration, so a caller alone waits one loop iteration.

    Used bare or with options::

        @at.batched(max_batch_size=256)
        def mlp(ops, x, w1, b1, w2, b2):
            return ops.softmax(ops.relu(x @ w1 + b1) @ w2 + b2, axis=-1)

        probs = await mlp(rows, w1, b1, w2, b2)  # rows: this request's (n, 64) array

    Args:
        fn: ``fn(ops, x, *params)``, as for :func:`function`.
        max_batch_size: Rows per kernel call at most. A call with more rows than
            this runs alone, unsplit.
        row_shape: The shape every row must have (``x.shape[1:]``); a call with
            another fails alone with ``InvalidArgumentError`` before it joins a batch.
            ``None``: rows of different shapes never share a batch, and a wrong shape
            fails in its own batch with the error ``fn`` raises for it.
        dtype: The dtype ``x`` must have, checked likewise; ``None``: any numeric
            dtype, rows of different dtypes never share a batch (nothing is cast).
        max_concurrent_batches: Kernel calls of this function running at once on one
            event loop; further batches wait, in order, for one to finish (each batch
            holds its stacked rows and intermediates while it runs, so this bounds
            them under a flood of callers). ``None`` (the default): no limit but the
            pool's workers.

    Raises:
        InvalidArgumentError: a bad option or ``fn`` not callable (here); when called,
            an ``x`` with no rows, of the wrong row shape or dtype, or params the
            result's session cannot read (for that call alone), or ``fn`` returning
            something without one row per input row.
        KernelError: ``fn`` raised; every caller of that batch gets it.
    """
    options = {
        "max_batch_size": max_batch_size,
        "row_shape": row_shape,
        "dtype": dtype,
        "max_concurrent_batches": max_concurrent_batches,
    }
    if fn is None:
        return functools.partial(BatchedFunction, **options)
    return BatchedFunction(fn, **options)
