"""Micro-batching: concurrent calls of a fused function coalesced into one kernel call.

``@at.batched`` turns ``fn(ops, x, *params)`` (the signature of a fused function, with
``x`` holding rows along axis 0) into a coroutine function. Calls made concurrently with
the *same* param objects and rows of the same trailing shape and dtype join one group,
of up to ``max_batch_size`` rows: a call that would take it over starts the next group.
The group's first call leads it: it lets the event loop run one more iteration (never a
timer), so every call that was ready joins. The first call to join starts the group's
task (:mod:`aiotensor._fusion._batch_task`), which runs in the next loop iteration (as the
leader resumes; the batch's kernel is submitted there, as a hand-written batcher's
``call_soon`` flush would), closes the group and runs its one kernel call, so that no
caller's cancellation can stop it. A group nobody joined runs its kernel in the leader's
own task, exactly as a fused call would; on asyncio's own loop, a call that finds no
other callback ready to run (nothing could join it) skips the iteration (``_others_ready``).
A call joining the group the last call led (the same param objects, the same kind of
rows, as an ndarray or a tensor: the common case under load) skips the params' sessions
and the key. A batch runs ``fn`` once on the stacked rows,
as a fused function runs (:mod:`aiotensor._fusion._function`: one kernel, on the pool or
inline as its cost says), and its kernel (:mod:`aiotensor._fusion._batch_kernel`) splits
every output into each caller's rows.

Sessions: the batch runs in the session that owns the params; a caller of another
session gets its rows registered in its own (:mod:`aiotensor._fusion._batch_delivery`).
The kernel runs under the context variables of the batch's first caller.

This module is the batched function's face: :func:`batched`, its options and
:class:`BatchStats`, and the call itself (its rows checked, its group joined or led).
The group's task and the delivery are plain functions of those two modules, bound as
``BatchedFunction``'s methods in its class body (no base class), as ``Engine`` binds its
concerns.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import operator
import threading
import types
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from .. import _defaults
from .._engine._lifecycle import State
from .._engine._session_rule import engine_of, session_engine
from .._errors import InvalidArgumentError
from .._expr import Expr, Operand
from .._kernels import NUMERIC_KINDS, numeric_array
from .._loopload import Sensor
from .._programs._placement import Placement
from .._tensor import Tensor
from . import _batch_delivery, _batch_task
from ._arguments import _nested_expr
from ._batch_delivery import _drop_result
from ._batch_task import _Group

if TYPE_CHECKING:
    from .._engine._core import Engine
    from .._types import NDArray

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MAX_CONCURRENT_BATCHES", "BatchStats", "BatchedFunction", "batched"]

#: Rows per kernel call unless ``max_batch_size`` says otherwise.
DEFAULT_MAX_BATCH_SIZE = 512
#: Kernel calls of one batched function running at once (per event loop) unless
#: ``max_concurrent_batches`` says otherwise: no limit (the pool's workers are the limit).
DEFAULT_MAX_CONCURRENT_BATCHES: int | None = None
_OPEN = State.OPEN
_get_loop = asyncio.get_running_loop
_get_ident = threading.get_ident
_ndarray = np.ndarray
# asyncio's own loop classes (not subclasses: their queue of ready callbacks may differ)
_ASYNCIO_LOOPS = frozenset(
    c for c in (getattr(asyncio, "SelectorEventLoop", None), getattr(asyncio, "ProactorEventLoop", None)) if c
)
_is = operator.is_
# The busy-loop sensor's end of a turn (a callback that calls nobody: see _others_ready).
_END_TURN: object = getattr(Sensor, "_end_turn", object())
_NOT_A_METHOD = object()
# The default session's two sources, read by a joining call without a call (see _defaults).
_current_default = _defaults.current.get
_interactive = _defaults._interactive


def _others_ready(loop: asyncio.AbstractEventLoop, engine: Engine) -> bool:
    """On asyncio's own ``loop``: whether a call could join the group this call leads if it let the loop run once.

    Not when tasks are lazy and no callback is ready to run but bookkeeping that calls
    nobody (the wake-up of the session's cleanup, the end of the busy-loop sensor's
    turn): then nothing else runs before this call would resume (what the next iteration
    polls, timers and other threads' callbacks included, is queued behind it), so its
    batch would be of one, and the iteration is skipped (~5 µs of the loop's time on
    asyncio). Read from asyncio's queue of ready callbacks and their ``_callback``
    (private to asyncio; the same since 3.4). uvloop has none to read (its callers always
    wait the iteration), and an eager task factory runs a new task before anything is
    queued.
    """
    if loop.get_task_factory() is not None:
        return True
    ready = getattr(loop, "_ready", None)
    if type(ready) is not collections.deque:
        return True
    n = len(ready)
    if n > 2:  # (bookkeeping is two callbacks at most)
        return True
    wake = engine.policy.wake_handle
    # By index, not iterating: another thread's call_soon_threadsafe may append meanwhile.
    for i in range(n):
        handle = ready[i]
        if (
            handle is not wake
            and getattr(getattr(handle, "_callback", None), "__func__", _NOT_A_METHOD) is not _END_TURN
        ):
            return True
    return False


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
        split: Kernel calls whose callers ran in two parts on two pool workers at once
            (a batch whose one-part kernel took ``SPLIT_MIN_US`` or more, while a core was free).
        not_split: Kernel calls long enough to split that ran in one part: no worker or
            core was free, or no caller boundary fell where the rows may be cut.
    """

    calls: int = 0
    batches: int = 0
    rows: int = 0
    max_rows: int = 0
    cancelled: int = 0
    failed: int = 0
    split: int = 0
    not_split: int = 0

    @property
    def rows_per_batch(self) -> float:
        """Mean rows per kernel call (0 before the first)."""
        return self.rows / self.batches if self.batches else 0.0

    @property
    def calls_per_batch(self) -> float:
        """Mean calls coalesced per kernel call (0 before the first)."""
        return self.calls / self.batches if self.batches else 0.0


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
        self._open: _Group | None = None  # the group the last call led, while calls may join it
        self._running: set[asyncio.Task[None]] = set()
        # Per shape key, from the last run on recycling ops: (did fn call BLAS, did it make
        # outputs worth recycling). Before the first run: assume both.
        self._learned: dict[tuple[Any, ...], tuple[bool, bool]] = {}
        self._counts = dict.fromkeys(BatchStats.__slots__, 0)
        self._needs: dict[tuple[Any, ...], int] = {}  # per shape key: bytes the last batch held at its peak
        # Per shape key, of its kernels of several callers: (the lesser µs of the last two
        # run in one part, 0 before two; eligible runs since; µs of the last one-part run).
        self._whole: dict[tuple[Any, ...], tuple[float, int, float]] = {}
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
        tx = type(x)
        group = self._open
        runner: Any = None
        engine: Any = None
        if group is not None and (
            (tx is _ndarray and x.dtype is group.dtype) or (tx is Tensor and x._dtype is group.dtype)
        ):
            # Joining the group the last call led, the common case under load: the same
            # param objects and the same kind of rows give the same key, so neither the
            # params' sessions nor the key are looked at again. The checks cheapest first,
            # the loop's last but one (uvloop's costs a system call on Python 3.11). Rows
            # as a tensor (a request's, in its own session) are that session's buffer,
            # read once the call is known to run on the loop.
            runner = group.engine
            loop = group.loop
            if tx is _ndarray:
                shape = x.shape
                # _defaults.get_default_session() written out (one call less per joining call)
                default = _current_default()
                if default is None and _interactive:
                    default = _interactive[0]
                engine = runner if default is None else session_engine(default)
            else:
                shape = x._shape
                engine = x._engine
            if (
                shape
                and shape[1:] == group.row_shape
                and shape[0]
                and len(params) == len(group.params)
                and all(map(_is, params, group.params))
                and engine.state is _OPEN
                # On the group's loop. asyncio's loops say which thread runs them now
                # (``_thread_id``, None while stopped; a thread runs one loop at a time):
                # cheaper than asking for the running loop (Python 3.11 asks the OS for
                # the process id each time). Not the thread the group was led from: its
                # loop may run in another thread since, and that thread a loop of its own.
                # A loop that does not say (uvloop) is asked for.
                and ((loop._thread_id == _get_ident()) if group.threaded else (_get_loop() is loop))  # type: ignore[attr-defined]
                and (
                    engine is runner
                    or (engine._loop is loop and runner in engine.ancestors and engine.backend.in_process)
                )
            ):
                rows = group.rows + shape[0]
                if tx is _ndarray:
                    arr = x
                else:  # (None if freed as its session closed: the general path says so)
                    entry = engine.registry._buffers.get(x._rid)
                    arr = None if entry is None else entry[0]
                if rows <= self._max and arr is not None:
                    future = loop.create_future()
                    group.callers.append((arr, engine, future))
                    group.rows = rows
                    if engine is not runner:
                        group.foreign = True
                    if group.task is None:
                        # The first call to join starts the group's task: it runs in the next
                        # loop iteration, with the leader's resumption, and submits the kernel.
                        self._spawn(group, loop)
                    if rows >= self._max:
                        self._close(group)  # full: the next call starts a group of its own
                    try:
                        out: Tensor | tuple[Tensor, ...] = await future  # its tensor(s), in runner
                    except asyncio.CancelledError:
                        _drop_result(future, runner)
                        raise
                    if engine is runner:  # its tensors are its session's already
                        return out
                    moved = self._moved(engine, runner, out)
                    if moved is not None:  # (no coroutine: the common case of a child session's caller)
                        return moved
                    return await self._deliver(engine, runner, out)
            # else the general path below: it opens, raises or finds another group
        loop = _get_loop()
        # The common case first, without the general checks' calls: params all tensors of
        # one session, x an ndarray or a tensor.
        runner = None
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
        group = self._pending.get(key)
        future = loop.create_future()
        caller = (arr, engine, future)
        if group is not None:
            rows = group.rows + n
            if rows <= self._max:
                group.callers.append(caller)
                if engine is not runner:
                    group.foreign = True
                group.rows = rows
                if group.task is None:
                    # The first call to join starts the group's task: it runs in the next
                    # loop iteration, with the leader's resumption, and submits the kernel.
                    self._spawn(group, loop)
                if rows >= self._max:
                    self._close(group)  # full: the next call starts a group of its own
                try:
                    out = await future  # its tensor (a tuple: several outputs), in runner
                except asyncio.CancelledError:
                    _drop_result(future, runner)
                    raise
                if engine is runner:  # its tensors are its session's already
                    return out
                moved = self._moved(engine, runner, out)
                if moved is not None:  # (no coroutine: the common case of a child session's caller)
                    return moved
                return await self._deliver(engine, runner, out)
            self._close(group)  # this call would take it over the limit: it leads the next one
        # The first call leads the group: one loop iteration (not a timer) lets the calls
        # that are ready now join it (the first to join starts its batch's task).
        group = _Group(runner, params, caller, n, key)
        # What this session dropped is freed now, as an inline op would: otherwise the
        # loop iteration below would wake the cleanup task just for it.
        inline_point = engine.policy.inline_point
        if inline_point is not None:
            inline_point()
        if type(loop) not in _ASYNCIO_LOOPS or _others_ready(loop, engine):
            if n < self._max:
                self._pending[key] = group
                self._open = group
            try:
                await _one_iteration()
            except asyncio.CancelledError:
                if group.task is None:
                    self._close(group)
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
        self._close(group)
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

    # The group's task and its kernel call (_batch_task), the sessions and each caller's
    # rows (_batch_delivery): plain functions bound as methods (no extra call).
    _close = _batch_task.close
    _count = _batch_task.count
    _spawn = _batch_task.spawn
    _run = _batch_task.run
    _execute = _batch_task.execute
    _kernel_call = _batch_task.kernel_call
    _moved = _batch_delivery.moved
    _deliver = _batch_delivery.deliver
    _engines = _batch_delivery.engines


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
    next loop iteration, so a caller alone waits one loop iteration (on asyncio's own
    loop, none when no other callback is ready to run: no call could join it).

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
        RuntimeWarning: numpy's floating-point warning inside ``fn`` when the caller's
            warning filters make it an error (as numpy raises it), at the caller's line.
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
