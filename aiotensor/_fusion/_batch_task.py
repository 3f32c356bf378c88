"""The task of a batch: a group of concurrent calls closed and run as one kernel call.

A batched function's calls (:mod:`aiotensor._fusion._batching`) join a :class:`_Group`
(the same params, the same kind of rows, ``max_batch_size`` rows at most). The first call
to join starts the group's task (``_spawn``), which runs in the next loop iteration as
the group's leader resumes, under the context variables of its first caller: it closes
the group, leaves out the callers cancelled meanwhile, and runs the batch's one kernel
call, so that no caller's cancellation can stop it (telling busy-loop placement,
``_loopload.note_callers``, how many callers this one task serves). Each caller's future
then gets its rows (tensors of the batch's session, or of its own: ``_merge``), or the
batch's error.

Lanes: with ``max_concurrent_batches``, a batch waits for one of the function's slots on
its event loop (an ``asyncio.Semaphore`` per loop) before its kernel call.

The kernel call: the params' buffers and the placement key read in one pass, then the
stacked rows run as a fused function runs (one kernel, on the pool or inline as
``_placement.Placement`` learnt; :mod:`aiotensor._fusion._batch_kernel` stacks, runs ``fn`` and
splits its outputs per caller). A caller alone whose earlier runs made no output worth
recycling runs ``fn`` with plain :class:`~aiotensor._fusion._fused_ops.FusedOps`, as a
fused call would. These are plain functions on the batched function, bound as its
methods in ``BatchedFunction``'s class body (``_spawn = _batch_task.spawn``), as the
engine's concerns are bound in ``Engine``'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import copy
import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._engine._lifecycle import State
from .._errors import BackendError, InvalidArgumentError
from .._loopload import note_callers
from .._programs._program import Budget
from .._tensor import Tensor, make_tensor
from ._arguments import _buffers, _shape_of
from ._batch_delivery import _discard
from ._batch_kernel import BatchKernel
from ._batch_split import REFRESH_EVERY
from ._fused_ops import FusedOps

if TYPE_CHECKING:
    from typing import TypeAlias

    from .._engine._core import Engine
    from .._kernels import BufferInfo
    from .._types import NDArray
    from ._batching import BatchedFunction

    # A waiting call: (its rows, the engine of its result's session, the future of its result).
    _Caller: TypeAlias = tuple[NDArray, Engine, asyncio.Future[Any]]

# (names of the package's other modules: private to it)
__all__ = ["_Group", "close", "count", "execute", "kernel_call", "run", "spawn"]

# A waiting caller's rows and future (C-level getters: the group's task maps them over its callers).
_rows_of = operator.itemgetter(0)
_future = operator.itemgetter(2)
_engine_of = operator.itemgetter(1)
_OPEN = State.OPEN
_done = operator.methodcaller("done")  # (any loop's future type)
_get_loop = asyncio.get_running_loop
_Future = asyncio.Future  # (what asyncio's and uvloop's create_future make)


class _Group:
    """Calls of one batch: the same params, the same kind of rows, ``max_batch_size`` rows at most."""

    __slots__ = (
        "callers",
        "ctx",
        "dtype",
        "engine",
        "foreign",
        "key",
        "loop",
        "params",
        "row_shape",
        "rows",
        "task",
        "threaded",
    )

    def __init__(
        self, engine: Engine, params: tuple[Any, ...], caller: _Caller, rows: int, key: tuple[Any, ...]
    ) -> None:
        self.engine = engine  # where the batch runs: the params' session
        self.params = params  # held: the group is keyed by their ids
        self.callers = [caller]
        self.rows = rows
        # (loop, engine, the params' ids, row shape, dtype): its key among the pending groups
        self.key = key
        self.loop: asyncio.AbstractEventLoop = key[0]
        self.row_shape: tuple[int, ...] = key[3]
        self.dtype: np.dtype[Any] = key[4]
        # Whether its loop says which thread runs it (``_thread_id``: asyncio's loops; see
        # ``_batching._on_loop``), else a joining call asks for the running loop.
        self.threaded = isinstance(self.loop, asyncio.BaseEventLoop)
        self.ctx = contextvars.copy_context()  # its first caller's: the batch runs under them
        self.task: asyncio.Task[None] | None = None  # started by the first call to join
        self.foreign = caller[1] is not engine  # whether a caller's session is another than the batch's


def close(self: BatchedFunction, group: _Group) -> None:
    """Take the group out of the pending ones (if it is still there): no call joins it now."""
    key = group.key
    if self._pending.get(key) is group:
        del self._pending[key]
    if self._open is group:
        self._open = None


def count(self: BatchedFunction, calls: int, rows: int) -> None:
    """Count a kernel call of ``calls`` calls and ``rows`` rows in the function's stats."""
    counts = self._counts
    counts["calls"] += calls
    counts["batches"] += 1
    counts["rows"] += rows
    if rows > counts["max_rows"]:
        counts["max_rows"] = rows


def spawn(self: BatchedFunction, group: _Group, loop: asyncio.AbstractEventLoop) -> None:
    """Start the group's task (``run``) under its first caller's context variables."""
    task = loop.create_task(self._run(group), context=group.ctx)
    group.task = task
    self._running.add(task)  # the loop keeps only a weak reference to tasks
    task.add_done_callback(self._running.discard)


async def run(self: BatchedFunction, group: _Group) -> None:
    """The task of a group that several calls joined: close it and run its batch.

    Each caller gets its rows, or the batch's error.
    """
    self._close(group)
    callers = group.callers
    futures = list(map(_future, callers))
    # (a cancelled call's future is done; asyncio's and uvloop's futures: their method
    # mapped in C, a methodcaller's call costs ~3x)
    done = _Future.done if type(futures[0]) is _Future else _done
    if any(map(done, futures)):
        callers = [c for c in callers if not c[2].done()]
        futures = list(map(_future, callers))
        self._counts["cancelled"] += len(group.callers) - len(callers)
    if not callers:
        return
    rows = group.rows if len(callers) == len(group.callers) else sum([c[0].shape[0] for c in callers])
    self._count(len(callers), rows)
    note_callers(len(callers))  # (busy-loop placement counts them: this one task serves them all)
    # What the batch's session had dropped (its callers' last results, typically) is freed
    # now, before the kernel starts: freed by the cleanup task instead, it would take the
    # loop thread's turn while the kernel's first ops wait for the GIL.
    inline_point = group.engine.policy.inline_point
    if inline_point is not None:
        inline_point()
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
        if done is not _done and len(tensors) == len(futures) and not any(map(done, futures)):
            # No caller left while the batch ran: each future gets its tensor in C loops.
            collections.deque(map(_Future.set_result, futures, tensors), 0)
            return
        for (_, _, future), t in zip(callers, tensors, strict=True):
            if future.done():
                cancelled += 1
                runner.discard(t)
            else:
                future.set_result(t)
    if cancelled:
        self._counts["cancelled"] += cancelled


async def execute(self: BatchedFunction, group: _Group, callers: list[_Caller], rows: int) -> tuple[list[Tensor], bool]:
    """One kernel call on the callers' rows, when a lane is free: per caller, its tensors (batch's session)."""
    if self._concurrent is None:
        return await self._kernel_call(group, callers, rows)
    loop = _get_loop()
    lane = self._lanes.get(loop)
    if lane is None:
        lane = self._lanes[loop] = asyncio.Semaphore(self._concurrent)
    async with lane:  # acquired without suspending when a lane is free
        return await self._kernel_call(group, callers, rows)


async def kernel_call(
    self: BatchedFunction, group: _Group, callers: list[_Caller], rows: int
) -> tuple[list[Tensor], bool]:
    """The batch's one kernel call: per caller, its tensors (batch's session), and whether fn returned several."""
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
        direct = _direct(callers, engine) if group.foreign and len(callers) > 1 else None
        whole = 0.0
        if not measure and len(callers) > 1:
            # Two parts (_batch_split) from the one-part time of the last such batch; one
            # part in REFRESH_EVERY measures that again.
            timed = self._whole.get(key)
            if timed is not None and engine.registry.memory_limit is None:
                runs = timed[1] + 1
                self._whole[key] = (timed[0], runs, timed[2])
                whole = 0.0 if runs % REFRESH_EVERY == 0 else timed[0]
        kernel = BatchKernel(
            self._fn, engine, budget, counts, label, measure=measure, recycle=recycle, direct=direct, whole_us=whole
        )
    free = self._placement.free_us(key)
    done = engine.call_inline(label, kernel, bufs, {}, described, user=True, est_us=est, budget=budget, free_us=free)
    if done is None:
        # Under a memory_limit: what the last batch of these shapes held is reserved for this one.
        limited = engine.registry.memory_limit is not None
        need = self._needs.get(key) if limited else None
        try:
            done = await engine.call(
                label,
                kernel,
                bufs,
                {},
                described,
                user=True,
                est_us=est,
                budget=budget,
                need=need,
                blas=blas,
                free_us=free,
            )
        finally:
            if limited and budget.peak:
                self._needs[key] = max(budget.peak, budget.live)
    tensors, multi = done
    if ops is not None:
        _check_rows(tensors, rows, label, engine)
        estimate = math.inf if ops._estimate is None else ops._estimate
        self._placement.record(key, est, estimate, ops._elapsed, engine.inline_us, ops.free_us)
        return tensors, multi
    assert type(kernel) is BatchKernel
    if kernel.parts == 2:
        self._counts["split"] += 1
    else:
        if kernel.busy:
            self._counts["not_split"] += 1
        if not measure and len(callers) > 1:
            # The lesser of the last two one-part times (the first run to reuse no kept
            # buffers pays page faults: one slow run alone does not split the next 63).
            timed = self._whole.get(key)
            took = kernel.elapsed
            if timed is None:
                self._whole[key] = (0.0, 0, took)
            else:
                self._whole[key] = (min(took, timed[2]), timed[1], took)
    self._placement.record(key, est, kernel.estimate, kernel.elapsed, engine.inline_us, kernel.free)
    if kernel.blas is not None and kernel.big is not None:  # (learned only from recycling runs)
        self._learned[key] = (kernel.blas, kernel.big)
    if kernel.aside:
        tensors = _merge(callers, tensors, kernel.aside, engine, label)
    return tensors, kernel.multi


def _direct(callers: list[_Caller], runner: Engine) -> list[bool] | None:
    """Per caller, whether its rows go straight into its own session, not through the batch's; None: none do.

    A caller of another session whose results nothing more would be done to on the way
    (no ``memory_limit`` to fit them under, no device scope, no placement log) takes them
    in its session directly (:func:`_merge`); the others' go through the batch's session
    (``_batch_delivery``).
    """
    engines = list(map(_engine_of, callers))
    direct = [
        e is not runner and e.registry.memory_limit is None and not e.placed and not e._log and e.state is _OPEN
        for e in engines
    ]
    return direct if any(direct) else None


def _merge(
    callers: list[_Caller], tensors: list[Tensor], aside: dict[int, list[BufferInfo]], runner: Engine, label: str
) -> list[Tensor]:
    """The callers' tensors in order: the batch session's ``tensors``, and those ``aside`` registered in their sessions.

    One registry call per caller set aside (``Registry.add``, or ``add_all`` for several
    outputs). A session closed meanwhile gets nothing: its caller's rows are registered in
    the batch's session instead, and its call says the session closed, as any call whose
    session closed while it waited for its batch.
    """
    out: list[Tensor] = []
    k = len(next(iter(aside.values())))  # (outputs per caller)
    lo = 0
    i = 0
    for _, e, _ in callers:
        mine = aside.get(i)
        i += 1
        if mine is None:  # its rows in the batch's session (its own)
            out += tensors[lo : lo + k]
            lo += k
            continue
        if e.state is not _OPEN:  # (closed since the batch started)
            out += [runner._register(b[0], label, None, runner.backend.default_device) for b in mine]
            continue
        registry = e.registry
        if k == 1:
            b = mine[0]
            rid = registry.add(b[0], b[3])
        else:
            rid = registry.add_all([(b[0], b[3]) for b in mine])
        device = e.backend.default_device
        for b in mine:
            out.append(make_tensor(e, registry, rid, b[1], b[2], b[3], (label, -1), device))
            rid += 1
        safe_point = e.policy.safe_point
        if safe_point is not None and registry._dropped:  # (after an op's results are registered, as _take does)
            safe_point()
    return out


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


def _copy_error(error: BaseException) -> BaseException:
    """The batch's error for one more caller: its own object (tracebacks of one object raised in many tasks pile up)."""
    try:
        other = copy.copy(error)
    except Exception:  # an exception type that does not copy: share the object
        return error
    other.__cause__ = error.__cause__
    other.__suppress_context__ = error.__suppress_context__
    return other
