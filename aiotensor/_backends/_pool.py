"""aiotensor's own worker pool: the cheapest hop from the event loop to a thread and back.

``concurrent.futures`` + ``asyncio.wrap_future`` costs, per kernel, a concurrent future
with its condition variable, a done callback, an asyncio future chained to it and one
``call_soon_threadsafe`` (a write to the loop's self-pipe and a wake-up) per result.
:class:`WorkerPool` keeps what is needed: jobs wait on one ``queue.SimpleQueue`` (a C
queue, no Python-level lock), the backlog; a finished job goes into its loop's inbox,
and completions arriving together wake the loop once; the awaiter waits on a plain
asyncio future settled on the loop thread. The jobs and their semantics (context,
cancellation, adoption, errors) are in ``_jobs``.

**The worker that went idle last is woken for the next job.** Idle workers wait each on
a mailbox of its own (another ``SimpleQueue``), the mailboxes on a stack; a submission
queues the job and wakes the top one. With every idle worker waiting on the one queue,
the kernel's futex woke them in FIFO order, and a task awaiting its kernels one after
another alternated between the two workers of a 2-core pool: a worker woken while the
other worker's OpenBLAS helper still spun could share a core with it while the other
core idled (one task's 512x512 matmuls read 0.5-0.95x numpy's throughput, see
docs/performance.md). Now such a task keeps one worker, its caches warm. A worker goes
idle before it publishes a result, so the job its awaiter submits next wakes it. Any
worker takes jobs from the backlog (one that is running takes the next before it goes
idle), so bursts are shared as before. No lock: ``list.append``/``list.pop`` are atomic,
a submission queues the job before it looks for an idle worker, and a worker that goes
idle looks at the backlog once more before it sleeps.

The pool is also a ``concurrent.futures.Executor`` (``submit``/``shutdown``), so code
that was given the old pool keeps working. Workers start on demand up to
``max_workers`` and run at the pool's :data:`~aiotensor._backends._priority.Priority`. They are
daemon threads that hold what they share with the pool, not the pool: a pool nobody
references is collected and its workers stop, as ThreadPoolExecutor's do. After a
``fork`` the child's pools start over with no thread and an empty queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import _affinity, _jobs, _priority
from ._jobs import CallJob, Failed, Job, Pending, Spawned, inbox_for, inbox_wakeups
from ._priority import Priority

__all__ = ["Failed", "Pending", "WorkerPool", "default_pool", "inbox_wakeups"]


_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


_STOP = object()  # on the backlog, one per worker: stop
_WAKE = object()  # in a mailbox: look at the backlog

Mailbox = queue.SimpleQueue[Any]


class _Crew:
    """What a pool's workers share with it. Workers hold this, never the pool, so that a
    pool nobody references is collected, and its finalizer stops the workers."""

    __slots__ = (
        "blas_lowered",
        "growing",
        "idle",
        "lock",
        "priority",
        "queue",
        "steered",
        "stopped",
        "threads",
        "tids",
    )

    def __init__(self, priority: Priority) -> None:
        self.priority = priority
        self.queue: Mailbox = queue.SimpleQueue()  # the backlog: every job, and the stop marks
        self.idle: list[Mailbox] = []  # idle workers' mailboxes, the one that went idle last at the end
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.growing = True  # fewer threads than max_workers: submissions may start one
        self.stopped = False
        self.blas_lowered = False
        self.tids: dict[Mailbox, int] = {}  # each live worker's mailbox -> its thread's native id
        # Workers woken for a spawned part with their CPUs narrowed (``_affinity.steer``),
        # by thread id: the CPUs each had, given back after its next job (``_give_back``).
        self.steered: dict[int, set[int]] = {}


def _work(crew: _Crew, mailbox: Mailbox, cpus: set[int] | None = None) -> None:
    # ``cpus``: the CPUs of the worker that started this one, as they were before it was
    # steered (a new thread inherits its creator's narrowed ones).
    if cpus is not None:
        _affinity.restore(cpus)
    _priority.lower(crew.priority)
    me = threading.get_native_id()
    crew.tids[mailbox] = me
    try:
        _serve(crew, mailbox, me)
    finally:  # (its thread id may be another thread's later: not steered then)
        crew.tids.pop(mailbox, None)
        crew.steered.pop(me, None)


def _serve(crew: _Crew, mailbox: Mailbox, me: int) -> None:
    backlog, idle, steered = crew.queue, crew.idle, crew.steered
    empty, take, go_idle = backlog.empty, backlog.get_nowait, idle.append
    # Not idle before a first look at the backlog: the job that started this worker is
    # there, and a worker on the idle stack would be woken for the next one instead of
    # a second worker being started (two jobs submitted together would run in turn).
    job = _take(backlog)
    if job is None:
        go_idle(mailbox)
        job = _wait(crew, mailbox)
    while job is not _STOP:
        ran = job.run()
        if steered:
            _give_back(steered, me)
        # Idle (or holding the backlog's next job) before the awaiter hears of this result:
        # the job it submits next wakes this worker (see the module docstring).
        following = None
        if not empty():
            try:
                following = take()
            except queue.Empty:  # another worker took it
                pass
        if following is None:
            go_idle(mailbox)
        if ran:
            job.publish()
        del job  # not kept while waiting for the next one
        job = _wait(crew, mailbox) if following is None else following


def _give_back(steered: dict[int, set[int]], me: int) -> None:
    # The calling worker's CPUs as they were before it was steered, if it was.
    had = steered.pop(me, None)
    if had is not None:
        _affinity.restore(had)


def _take(backlog: Mailbox) -> Any:
    try:
        return backlog.get_nowait()
    except queue.Empty:  # another worker took it
        return None


def _wait(crew: _Crew, mailbox: Mailbox) -> Any:
    """The next job of a worker whose mailbox is on the idle stack (or was just taken off it)."""
    backlog, idle = crew.queue, crew.idle
    while True:
        if not backlog.empty():  # queued while this worker went idle: take it if not woken already
            try:
                idle.remove(mailbox)
            except ValueError:  # a submitter took this worker off the stack: its wake-up is in the mailbox
                pass
            else:
                job = _take(backlog)
                if job is not None:
                    return job
                idle.append(mailbox)
                continue
        mailbox.get()  # a wake-up: a job was queued (or the pool stops)
        job = _take(backlog)
        if job is not None:
            return job
        if crew.steered:  # woken for a spawned part another worker took: not kept narrowed
            _give_back(crew.steered, threading.get_native_id())
        idle.append(mailbox)  # another worker took it


def _wake_all(crew: _Crew) -> None:
    # Stop marks put on the backlog: every idle worker looks at it.
    idle = crew.idle
    while idle:
        try:
            mailbox = idle.pop()
        except IndexError:
            return
        mailbox.put(_WAKE)


def _stop(holder: list[_Crew]) -> list[threading.Thread]:
    # Shutdown, or the finalizer of a pool nobody references: one stop mark per worker,
    # after what is queued; the BLAS threads' priority back if this pool lowered it.
    crew = holder[0]
    with crew.lock:
        if crew.stopped:
            return list(crew.threads)
        crew.stopped = True
        threads = list(crew.threads)
        lowered, crew.blas_lowered = crew.blas_lowered, False
    for _ in threads:
        crew.queue.put(_STOP)
    _wake_all(crew)
    if lowered:
        _priority.restore_blas_threads()
    return threads


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
        self._holder: list[_Crew] = []
        self._reset()
        # Not at interpreter exit: atexit hooks may still run kernels (the workers are daemons).
        weakref.finalize(self, _stop, self._holder).atexit = False
        _pools.add(self)

    def _reset(self) -> None:
        # At creation, and in a forked child (which has the pool's fields but not its threads).
        self._crew = crew = _Crew(self._priority)
        self._queue = crew.queue
        self._idle = crew.idle
        self._holder[:] = [crew]

    @property
    def max_workers(self) -> int:
        """The most threads the pool runs."""
        return self._max_workers

    @property
    def priority(self) -> Priority:
        """The workers' scheduling priority."""
        return self._priority

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads started so far."""
        return list(self._crew.threads)

    def run(self, fn: Callable[..., Any], *args: Any) -> Pending:
        """Start ``fn(*args)`` on a worker, in a copy of the caller's context; await the result.

        Must be called on a running event loop's thread. Raises RuntimeError after
        :meth:`shutdown`.
        """
        loop = asyncio.get_running_loop()
        job = Job(fn, args, contextvars.copy_context(), loop.create_future(), inbox_for(loop))
        self._put(job)
        return Pending(job)

    def spawn(self, fn: Callable[[], object]) -> None:
        """Start ``fn()`` on a worker and return at once, in a copy of the caller's context.

        Any thread may spawn. Nothing reports back: ``fn`` signals its own completion
        (an exception it raises is logged). Raises RuntimeError after :meth:`shutdown`.
        """
        self._put(Spawned(fn, contextvars.copy_context()))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """``concurrent.futures.Executor.submit``: run ``fn(*args, **kwargs)`` on a worker."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._put(CallJob(future, fn, args, kwargs))
        return future

    def idle_workers(self) -> int:
        """How many jobs submitted now would start at once: idle workers, plus those the pool may still start.

        A snapshot read without a lock (any thread; a worker may go idle or be taken
        the next moment): for a kernel deciding whether handing part of its work to
        another worker can pay. A worker asking does not count itself. 0 after
        :meth:`shutdown`.
        """
        crew = self._crew
        if crew.stopped or self._shutdown:
            return 0
        return len(crew.idle) + max(0, self._max_workers - len(crew.threads))

    def _put(self, job: Any) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        self._queue.put(job)
        # Wake the worker that went idle last; none idle: start one if the pool may. A
        # worker that goes idle from now on looks at the backlog before it sleeps.
        idle = self._idle
        if idle:
            try:
                mailbox = idle.pop()
            except IndexError:  # taken meanwhile by another thread
                if self._crew.growing:
                    self._grow()
            else:
                try:
                    if type(job) is Spawned and _affinity.STEER:
                        self._steer(mailbox)
                finally:  # (whatever happens: a worker off the idle stack and never woken is lost)
                    mailbox.put(_WAKE)
        elif self._crew.growing:
            self._grow()
        # Shut down meanwhile by another thread, after its sweep of the queue: this job
        # would sit behind the workers' stop marks (mypy does not see the other thread).
        if self._shutdown:
            self._cancel_queued()  # type: ignore[unreachable]

    def _steer(self, mailbox: Mailbox) -> None:
        # A part spawned by a thread that goes on computing (see _affinity): the worker
        # about to be woken for it runs on another core than this thread's.
        crew = self._crew
        tid = crew.tids.get(mailbox)
        cpu = _affinity.current_cpu()
        if tid is not None and cpu is not None:
            had = _affinity.steer(tid, cpu)
            if had is not None:
                crew.steered[tid] = had

    def _grow(self) -> None:
        # No worker idle: start one, if the pool may.
        crew = self._crew
        with crew.lock:
            if crew.stopped or len(crew.threads) >= self._max_workers:
                return
            if not crew.blas_lowered and self._priority != "normal":
                crew.blas_lowered = True
                _priority.lower_blas_threads(self._priority)
            name = f"{self._name}_{len(crew.threads)}"
            # Started by a steered worker (a spawned part that submits), it would keep that
            # worker's narrowed CPUs for good: it starts on the ones that worker had.
            cpus = crew.steered.get(threading.get_native_id()) if crew.steered else None
            t = threading.Thread(target=_work, name=name, args=(crew, queue.SimpleQueue(), cpus), daemon=True)
            t.start()
            crew.threads.append(t)
            if len(crew.threads) >= self._max_workers:
                crew.growing = False

    def _cancel_queued(self) -> None:
        stops = 0
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                stops += 1
            else:
                job.cancel()
        for _ in range(stops):
            self._queue.put(_STOP)
        if stops:  # a worker that found the backlog empty meanwhile sleeps in its mailbox
            _wake_all(self._crew)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers once the queue is empty (``cancel_futures``: drop what has not started).

        A dropped awaited call raises CancelledError in its awaiter (the backend turns
        that into :class:`~aiotensor.BackendError`); later submissions raise RuntimeError.
        """
        self._shutdown = True
        if cancel_futures:
            self._cancel_queued()
        threads = _stop(self._holder)
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
    global _default_lock
    _jobs.reset_after_fork()
    _default_lock = threading.Lock()
    for pool in list(_pools):
        pool._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
