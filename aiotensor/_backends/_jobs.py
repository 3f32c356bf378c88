"""The jobs of :class:`~aiotensor._backends._pool.WorkerPool`, and how their results get back to the loop.

- :class:`Pending` / ``Job``: an awaited call. It runs ``fn(*args)`` in the copy of
  the submitter's context taken at submission. A one-element list is its token:
  whoever pops it first, the worker or :meth:`Pending.abandon`, decides whether it
  runs, so a job abandoned before a worker took it never runs. A job that ran for a
  caller who left hands its result to ``adopt`` on the loop thread. Exceptions travel
  as :class:`Failed` results: asyncio futures refuse ``StopIteration``, and a
  ``concurrent.futures.CancelledError`` set on a future would cancel the awaiter.
- ``_Inbox``: a finished job goes into its loop's inbox (a deque); only the first
  completion of a batch calls ``call_soon_threadsafe``, and the one callback it
  schedules settles every job that arrived meanwhile.
- ``_CallJob``: a ``concurrent.futures`` call (the pool is an Executor too).
- ``_Spawned``: a fire-and-forget call (chunked kernels hand blocks to other workers).

A worker calls a job's ``run()`` and, when it returns True, ``publish()``: in between it
goes idle (see ``_pool``), so that the result reaches its awaiter after the worker is
ready for the next job. A job drops its function, arguments, result and future as soon
as it has handed them on, and the awaited future carries the result in a box the
awaiter empties: a buffer cache that checks reference counts must not see the pool hold
a buffer.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["CallJob", "Failed", "Job", "Pending", "Spawned", "inbox_for", "inbox_wakeups"]

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
        self.done: collections.deque[Job] = collections.deque()
        self.scheduled = False
        self.wakeups = 0  # call_soon_threadsafe calls made (for tests and benchmarks)

    def post(self, job: Job) -> None:
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
        try:
            while done:
                done.popleft().settle()
        finally:
            if done and not self.scheduled:  # an adopt() raised: the rest in a callback of their own
                self.scheduled = True
                self.loop.call_soon(self.drain)


_local = threading.local()


def reset_after_fork() -> None:
    """Forget the inboxes of the parent's loops (in a forked child)."""
    global _local
    _local = threading.local()


def inbox_for(loop: asyncio.AbstractEventLoop) -> _Inbox:
    # One inbox per (thread, loop): the submitting thread runs the loop, and a thread
    # runs one loop at a time, so a thread-local beats a dict keyed by loop.
    inbox: _Inbox | None = getattr(_local, "inbox", None)
    if inbox is None or inbox.loop is not loop:
        inbox = _local.inbox = _Inbox(loop)
    return inbox


def inbox_wakeups(loop: asyncio.AbstractEventLoop) -> int:
    """How many times workers woke ``loop`` (called ``call_soon_threadsafe``) for this thread's jobs."""
    return inbox_for(loop).wakeups


_clock = time.perf_counter


class Job:
    """One awaited call: run on a worker, settled on its loop."""

    __slots__ = ("adopt", "args", "ctx", "fn", "future", "inbox", "outcome", "seconds", "settled", "token")

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
        self.seconds = 0.0  # how long the call ran on its worker

    def run(self) -> bool:
        """Run the call if nobody abandoned it; True if it ran (its outcome awaits :meth:`publish`)."""
        try:
            self.token.pop()
        except IndexError:  # abandoned before a worker took it
            return False
        fn, args, ctx = self.fn, self.args, self.ctx
        self.fn = self.args = self.ctx = None
        start = _clock()
        try:
            outcome = ctx.run(fn, *args)
        except BaseException as exc:  # delivered to the awaiter, which re-raises it
            outcome = Failed(exc)
        self.seconds = _clock() - start
        del fn, args, ctx
        self.outcome = outcome
        del outcome
        return True

    def publish(self) -> None:
        # The worker, after run() returned True (and after it went idle, see _pool).
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
        # In a box the awaiter empties: the future outlives the await (the loop's
        # handle that wakes the awaiter holds it until its batch of callbacks ends),
        # and must not keep the result's buffers referenced meanwhile.
        future.set_result([outcome])


class Pending:
    """A call on the pool: ``await`` it for its result (see :class:`~aiotensor._backends._base.PendingKernel`)."""

    __slots__ = ("_future", "_job")

    def __init__(self, job: Job) -> None:
        self._job = job
        self._future: asyncio.Future[Any] = job.future

    @property
    def seconds(self) -> float:
        """How long the call ran on its worker (0 until it has run)."""
        return self._job.seconds

    def __await__(self) -> Generator[Any, None, Any]:
        box = yield from self._future.__await__()
        outcome = box.pop()
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
            box = future.result()
            outcome = box.pop() if box else None
        if outcome is not None and outcome is not _CANCELLED and type(outcome) is not Failed:
            job.inbox.loop.call_soon(adopt, outcome)


class CallJob:
    """A ``concurrent.futures`` call (:meth:`WorkerPool.submit`), as a ThreadPoolExecutor runs it."""

    __slots__ = ("args", "fn", "future", "kwargs", "result")

    def __init__(
        self, future: concurrent.futures.Future[Any], fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]
    ) -> None:
        self.future = future
        self.fn: Callable[..., Any] | None = fn
        self.args = args
        self.kwargs = kwargs
        self.result: Any = None

    def run(self) -> bool:
        """Run the call unless its future was cancelled; True if it ran (the outcome awaits :meth:`publish`)."""
        fn, args, kwargs = self.fn, self.args, self.kwargs
        self.fn = self.args = self.kwargs = None  # type: ignore[assignment]
        if fn is None or not self.future.set_running_or_notify_cancel():
            return False
        try:
            self.result = fn(*args, **kwargs)
        except BaseException as exc:  # the future's to deliver
            self.result = Failed(exc)
        return True

    def publish(self) -> None:
        result, self.result = self.result, None
        if type(result) is Failed:
            self.future.set_exception(result.exc)
        else:
            self.future.set_result(result)

    def cancel(self) -> None:
        self.fn = self.args = self.kwargs = None  # type: ignore[assignment]
        self.future.cancel()


class Spawned:
    """A fire-and-forget call (:meth:`WorkerPool.spawn`) in a copy of the spawner's context."""

    __slots__ = ("ctx", "fn")

    def __init__(self, fn: Callable[[], object], ctx: contextvars.Context) -> None:
        self.fn: Callable[[], object] | None = fn
        self.ctx: contextvars.Context | None = ctx

    def run(self) -> bool:
        """Run the call; False: nothing to publish (it signals its own completion)."""
        fn, ctx = self.fn, self.ctx
        self.fn = self.ctx = None
        if fn is None or ctx is None:
            return False
        try:
            ctx.run(fn)
        except BaseException:  # nobody awaits it: log rather than kill the worker
            logger.exception("a callable spawned on aiotensor's pool raised")
        return False

    def publish(self) -> None:  # never called: run() returns False
        pass

    def cancel(self) -> None:
        self.fn = self.ctx = None
