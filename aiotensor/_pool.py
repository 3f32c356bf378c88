"""aiotensor's own worker pool: the cheapest hop from the event loop to a thread and back.

``concurrent.futures`` + ``asyncio.wrap_future`` costs, per kernel, a concurrent future
with its condition variable, a done callback, an asyncio future chained to it and one
``call_soon_threadsafe`` (a write to the loop's self-pipe and a wake-up) per result.
:class:`WorkerPool` keeps what is needed:

- workers take jobs from one ``queue.SimpleQueue`` (a C queue, no Python-level lock);
- a finished job goes into its loop's *inbox* (a deque); only the first completion of
  a batch calls ``call_soon_threadsafe``, and the one callback it schedules settles
  every job that arrived meanwhile (32 kernels finishing together wake the loop once);
- the awaiter waits on a plain asyncio future, settled on the loop thread.

Semantics, as with the executor it replaces: a job runs ``fn(*args)`` in the copy of
the submitter's context taken at submission (context variables, numpy's errstate); a
job abandoned before a worker took it never runs (a one-element list is its token:
whoever pops it first, the worker or :meth:`Pending.abandon`, decides); a job that ran
for a caller who left hands its result to ``adopt`` on the loop thread. Exceptions
travel as :class:`Failed` results (asyncio futures refuse ``StopIteration``, and a
``concurrent.futures.CancelledError`` set on a future would cancel the awaiter). A job
drops its function, arguments and result as soon as it has handed them on: a buffer
cache that checks reference counts must not see the pool hold a buffer.

The pool is also a ``concurrent.futures.Executor`` (``submit``/``shutdown``), so code
that was given the old pool keeps working. Workers start on demand up to
``max_workers`` and run at the pool's :data:`~aiotensor._priority.Priority`. After a
``fork`` the child's pools start over with no thread and an empty queue.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Generator
from typing import Any

from . import _priority
from ._priority import Priority

__all__ = ["Failed", "Pending", "WorkerPool", "default_pool", "inbox_wakeups"]

logger = logging.getLogger("aiotensor")


class Failed:
    """An exception carried as a result (see the module docstring for why)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_CANCELLED = object()  # the outcome of a job that a shutdown took off the queue


class _Inbox:
    """Completions for one event loop, settled in one loop callback per batch."""

    __slots__ = ("done", "loop", "scheduled", "wakeups")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done: collections.deque[_Job] = collections.deque()
        self.scheduled = False
        self.wakeups = 0  # call_soon_threadsafe calls made (for tests and benchmarks)

    def post(self, job: _Job) -> None:
        # Any thread. Append first, then look at the flag: drain() clears the flag
        # before it pops, so a job is either seen by a drain already scheduled or
        # schedules one itself. Two workers racing here only schedule a spare drain.
        self.done.append(job)
        if not self.scheduled:
            self.scheduled = True
            self.wakeups += 1
            try:
                self.loop.call_soon_threadsafe(self.drain)
            except RuntimeError:  # the loop closed: nobody is left to take the result
                pass

    def drain(self) -> None:
        # The loop thread, the only one that pops.
        self.scheduled = False
        done = self.done
        while done:
            done.popleft().settle()


_local = threading.local()


def _inbox(loop: asyncio.AbstractEventLoop) -> _Inbox:
    # One inbox per (thread, loop): the submitting thread runs the loop, and a thread
    # runs one loop at a time, so a thread-local beats a dict keyed by loop.
    inbox: _Inbox | None = getattr(_local, "inbox", None)
    if inbox is None or inbox.loop is not loop:
        inbox = _local.inbox = _Inbox(loop)
    return inbox


def inbox_wakeups(loop: asyncio.AbstractEventLoop) -> int:
    """How many times workers woke ``loop`` (called ``call_soon_threadsafe``) for this thread's jobs."""
    return _inbox(loop).wakeups


class _Job:
    """One awaited call: run on a worker, settled on its loop."""

    __slots__ = ("adopt", "args", "ctx", "fn", "future", "inbox", "outcome", "settled", "token")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        ctx: contextvars.Context,
        future: asyncio.Future[Any],
        inbox: _Inbox,
    ) -> None:
        # Any: set to None once handed on (see the module docstring).
        self.fn: Any = fn
        self.args: Any = args
        self.ctx: Any = ctx
        self.future: Any = future
        self.inbox = inbox
        self.token = [None]
        self.outcome: Any = None
        self.adopt: Callable[[Any], object] | None = None
        self.settled = False

    def run(self) -> None:
        try:
            self.token.pop()
        except IndexError:  # abandoned before a worker took it
            return
        fn, args, ctx = self.fn, self.args, self.ctx
        self.fn = self.args = self.ctx = None
        try:
            outcome = ctx.run(fn, *args)
        except BaseException as exc:  # delivered to the awaiter, which re-raises it
            outcome = Failed(exc)
        del fn, args, ctx
        self.outcome = outcome
        del outcome
        self.inbox.post(self)

    def drop(self) -> bool:
        """Make sure the job never runs; False if a worker took it first."""
        try:
            self.token.pop()
        except IndexError:
            return False
        self.fn = self.args = self.ctx = None
        return True

    def cancel(self) -> None:
        # A shutdown took it off the queue: its awaiter sees a cancelled future.
        if self.drop():
            self.outcome = _CANCELLED
            self.inbox.post(self)

    def settle(self) -> None:
        # The loop thread. The job lets go of the future: a worker that has not yet
        # dropped the job must not keep the result alive through it.
        self.settled = True
        future, outcome = self.future, self.outcome
        self.future = None
        if outcome is _CANCELLED:
            self.outcome = None
            future.cancel()
            return
        if self.adopt is not None or future.cancelled():
            adopt = self.adopt
            if adopt is not None:  # the caller left: the session owns (and frees) the result
                self.outcome = self.adopt = None
                if type(outcome) is not Failed:
                    adopt(outcome)
            return  # else kept for abandon(), which comes next
        self.outcome = None
        future.set_result(outcome)


class Pending:
    """A call on the pool: ``await`` it for its result (see :class:`~aiotensor._backend.PendingKernel`)."""

    __slots__ = ("_future", "_job")

    def __init__(self, job: _Job) -> None:
        self._job = job
        self._future: asyncio.Future[Any] = job.future

    def __await__(self) -> Generator[Any, None, Any]:
        outcome = yield from self._future.__await__()
        if type(outcome) is Failed:
            raise outcome.exc
        return outcome

    def abandon(self, adopt: Callable[[Any], object]) -> None:
        """The caller was cancelled: drop the call if it has not started, else hand its result to ``adopt``.

        ``adopt`` runs on the loop thread, never for a call that raised.
        """
        job = self._job
        if job.drop():  # never started: nothing was allocated
            return
        if not job.settled:
            job.adopt = adopt  # settle() hands the result over when it arrives
            return
        future = self._future
        outcome = job.outcome
        job.outcome = None
        if not future.cancelled():  # the result arrived before the cancellation reached the caller
            outcome = future.result()
        if outcome is not None and outcome is not _CANCELLED and type(outcome) is not Failed:
            job.inbox.loop.call_soon(adopt, outcome)


class _CallJob:
    """A ``concurrent.futures`` call (:meth:`WorkerPool.submit`), as a ThreadPoolExecutor runs it."""

    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(
        self, future: concurrent.futures.Future[Any], fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]
    ) -> None:
        self.future = future
        self.fn: Callable[..., Any] | None = fn
        self.args = args
        self.kwargs = kwargs

    def run(self) -> None:
        fn, args, kwargs = self.fn, self.args, self.kwargs
        self.fn = self.args = self.kwargs = None  # type: ignore[assignment]
        if fn is None or not self.future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # the future's to deliver
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def cancel(self) -> None:
        self.fn = self.args = self.kwargs = None  # type: ignore[assignment]
        self.future.cancel()


class _Spawned:
    """A fire-and-forget call (:meth:`WorkerPool.spawn`) in a copy of the spawner's context."""

    __slots__ = ("ctx", "fn")

    def __init__(self, fn: Callable[[], object], ctx: contextvars.Context) -> None:
        self.fn: Callable[[], object] | None = fn
        self.ctx: contextvars.Context | None = ctx

    def run(self) -> None:
        fn, ctx = self.fn, self.ctx
        self.fn = self.ctx = None
        if fn is None or ctx is None:
            return
        try:
            ctx.run(fn)
        except BaseException:  # nobody awaits it: log rather than kill the worker
            logger.exception("a callable spawned on aiotensor's pool raised")

    def cancel(self) -> None:
        self.fn = self.ctx = None


_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


class WorkerPool(concurrent.futures.Executor):
    """Worker threads behind the local backend (see the module docstring).

    Args:
        max_workers: Threads at most, started on demand; ``None``: one per core.
        priority: The workers' scheduling priority (see ``_priority``); a lowered
            pool also lowers the BLAS library's helper threads while it runs.
        name: The workers' thread name prefix.
    """

    def __init__(
        self, max_workers: int | None = None, *, priority: Priority = "normal", name: str = "aiotensor"
    ) -> None:
        if max_workers is not None and max_workers <= 0:
            raise ValueError(f"max_workers must be positive, got {max_workers}")
        problem = _priority.validate(priority)
        if problem is not None:
            raise ValueError(f"priority {problem}")
        #: The most threads the pool runs (``_max_workers`` as ThreadPoolExecutor names it).
        self._max_workers = max_workers or os.cpu_count() or 1
        self._priority = priority
        self._name = name
        self._shutdown = False
        self._reset()
        _pools.add(self)

    def _reset(self) -> None:
        # At creation, and in a forked child (which has the pool's fields but not its threads).
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # workers done with a job and not yet handed another, while growing
        self._growing = True  # fewer threads than max_workers: submissions may start one
        self._blas_lowered = False

    @property
    def max_workers(self) -> int:
        """The most threads the pool runs."""
        return self._max_workers

    @property
    def priority(self) -> Priority:
        """The workers' scheduling priority."""
        return self._priority

    def run(self, fn: Callable[..., Any], *args: Any) -> Pending:
        """Start ``fn(*args)`` on a worker, in a copy of the caller's context; await the result.

        Must be called on a running event loop's thread. Raises RuntimeError after
        :meth:`shutdown`.
        """
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, contextvars.copy_context(), loop.create_future(), _inbox(loop))
        self._put(job)
        return Pending(job)

    def spawn(self, fn: Callable[[], object]) -> None:
        """Start ``fn()`` on a worker and return at once, in a copy of the caller's context.

        Any thread may spawn. Nothing reports back: ``fn`` signals its own completion
        (an exception it raises is logged). Raises RuntimeError after :meth:`shutdown`.
        """
        self._put(_Spawned(fn, contextvars.copy_context()))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """``concurrent.futures.Executor.submit``: run ``fn(*args, **kwargs)`` on a worker."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._put(_CallJob(future, fn, args, kwargs))
        return future

    def _put(self, job: Any) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        self._queue.put(job)
        if self._growing:
            self._grow()
        # Shut down meanwhile by another thread, after its sweep of the queue: this job
        # would sit behind the workers' stop marks (mypy does not see the other thread).
        if self._shutdown:
            self._cancel_queued()  # type: ignore[unreachable]

    def _grow(self) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # an idle worker takes the job
                return
            if self._shutdown or len(self._threads) >= self._max_workers:
                return
            if not self._blas_lowered and self._priority != "normal":
                self._blas_lowered = True
                _priority.lower_blas_threads(self._priority)
            t = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", args=(self._queue,), daemon=True
            )
            t.start()
            self._threads.append(t)
            if len(self._threads) >= self._max_workers:
                self._growing = False

    def _work(self, jobs: queue.SimpleQueue[Any]) -> None:
        _priority.lower(self._priority)
        get = jobs.get
        while True:
            job = get()
            if job is None:
                return
            job.run()
            del job  # not kept while waiting for the next one
            if self._growing:
                with self._lock:
                    self._idle += 1

    def _cancel_queued(self) -> None:
        stops = 0
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stops += 1
            else:
                job.cancel()
        for _ in range(stops):
            self._queue.put(None)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers once the queue is empty (``cancel_futures``: drop what has not started).

        A dropped awaited call raises CancelledError in its awaiter (the backend turns
        that into :class:`~aiotensor.BackendError`); later submissions raise RuntimeError.
        """
        with self._lock:
            first = not self._shutdown
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            self._cancel_queued()
        if first:
            for _ in threads:
                self._queue.put(None)
            if self._blas_lowered:
                _priority.restore_blas_threads()
        if wait:
            me = threading.current_thread()
            for t in threads:
                if t is not me:
                    t.join()


_default_pools: dict[object, WorkerPool] = {}
_default_lock = threading.Lock()


def default_pool(priority: Priority) -> WorkerPool:
    """The process-wide pool of ``priority``, one worker per core, shared by sessions without a pool of their own.

    Created on first use; its threads start with the first kernels. Sharing it is
    what lets a request-scoped session start without starting a thread.
    """
    pool = _default_pools.get(priority)
    if pool is None:
        with _default_lock:
            pool = _default_pools.get(priority)
            if pool is None:
                pool = _default_pools[priority] = WorkerPool(priority=priority)
    return pool


def _after_fork_in_child() -> None:
    # The child inherits the pools but none of their threads; a queue or lock held by
    # a thread that did not survive the fork must not be used again.
    global _local, _default_lock
    _local = threading.local()
    _default_lock = threading.Lock()
    for pool in list(_pools):
        pool._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
