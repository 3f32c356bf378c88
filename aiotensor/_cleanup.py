"""The three cleanup strategies, behind one small interface.

A policy decides *when* the registry's dropped buffers are freed; the registry decides
*how*. The session calls :attr:`CleanupPolicy.safe_point` around each await boundary of
its API (it is ``None`` when a strategy has nothing to do there, so the hot path pays
one attribute test) and :meth:`CleanupPolicy.stop` at close, after which it frees
everything itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from ._config import ResourceCleanupStrategy
from ._registry import Registry

__all__ = [
    "BackgroundCleanup",
    "CleanupPolicy",
    "CloseOnlyCleanup",
    "SafePointCleanup",
    "make_policy",
]

logger = logging.getLogger("aiotensor")
_get_ident = threading.get_ident


class CleanupPolicy(ABC):
    """When a session frees buffers whose handles were dropped."""

    #: The public strategy this policy implements.
    strategy: ResourceCleanupStrategy
    #: Whether pressure on ``memory_limit`` may free pending buffers early.
    reclaims: bool
    #: Called by the session before and after each op; ``None`` if there is nothing to do.
    #: Like ``inline_point``, it frees what the registry queued as dropped and nothing
    #: else: the engine's hottest paths skip the call while nothing is queued.
    safe_point: Callable[[], object] | None = None
    #: Called before an op that runs inline on the loop (and so gives no task a turn),
    #: and before a pool op or program takes a recycled ``out=`` buffer (a result dropped
    #: just before is the one to reuse); ``None`` if the strategy has nothing to do there.
    inline_point: Callable[[], object] | None = None
    #: Times the machinery failed and was restarted.
    failures: int = 0
    #: The loop's handle of a wake-up of the machinery scheduled from the loop's thread and
    #: not run yet, else ``None``: a batched call tells it apart from callbacks that could
    #: be callers (``_batching._others_ready``).
    wake_handle: asyncio.Handle | None = None

    @abstractmethod
    def start(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        """Start whatever machinery the strategy needs, on the session's loop."""

    def stop(self) -> asyncio.Task[None] | None:
        """Stop the machinery; return a task to await if one is winding down."""
        return None


class SafePointCleanup(CleanupPolicy):
    """``ON_SAFE_POINTS``: free synchronously at each safe point, with no extra task."""

    strategy = ResourceCleanupStrategy.ON_SAFE_POINTS
    reclaims = True

    def start(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        self.safe_point = registry.collect


class CloseOnlyCleanup(CleanupPolicy):
    """``ON_SESSION_CLOSE``: never free before close."""

    strategy = ResourceCleanupStrategy.ON_SESSION_CLOSE
    reclaims = False

    def start(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        pass


class BackgroundCleanup(CleanupPolicy):
    """``IN_BACKGROUND``: one supervised asyncio task frees buffers as they are dropped.

    A drop (from any thread) schedules one wake-up of the task unless one is already
    scheduled; the task clears that flag *before* draining the queue, so a drop that
    races with a drain is either drained now or wakes the task again. The task
    references this policy and the registry, never the session, so a session dropped
    without ``close()`` can still be finalized.

    The task waits on a bare future of its own (``_waiter``), not an ``asyncio.Event``:
    a wake-up that finds something to free costs one future, not an event's waiter list
    and ``wait()`` coroutine, on the path of every drop a run of inline ops did not free.
    """

    strategy = ResourceCleanupStrategy.IN_BACKGROUND
    reclaims = True

    # Class-level defaults, set on the instance when they change: a request session
    # makes one policy, and most never drop anything before close.
    _registry: Registry | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _loop_thread = 0
    _waiter: asyncio.Future[None] | None = None  # what the task awaits; None while it runs
    # True while a wake-up is scheduled, and for good once stopping: a drop then
    # schedules nothing (one test on the path of every drop).
    _armed = False
    _stopping = False
    _task: asyncio.Task[None] | None = None

    def start(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        self._registry = registry
        self._loop = loop
        self._loop_thread = _get_ident()
        registry.on_drop = self._on_drop
        # A run of inline ops gives the task no turn: such an op frees what was already
        # dropped itself (earlier than the task would, never later).
        self.inline_point = registry.collect  # (nothing dropped: one call that frees nothing)
        # The task is spawned by the first drop, not here: a short request session that
        # drops nothing before close never pays for a task.

    def _spawn(self) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._run(), name="aiotensor-cleanup")
        task.add_done_callback(self._supervise)
        self._task = task
        if self._registry is not None and self._registry.pending:
            self._wake()  # drops queued while no task was running

    def _on_drop(self) -> None:
        # Runs inside finalizers, on any thread: no locks, no allocation beyond a handle.
        if self._armed:  # (a wake-up is scheduled, or the policy stopped)
            return
        self._armed = True
        registry = self._registry
        if registry is not None and not self._stopping:
            # Until the wake-up runs, the registry queues drops without calling this hook:
            # a burst of drops (a batch's 32 callers) pays one call, not one each.
            registry.hook_armed = True
        loop = self._loop
        if loop is None:
            return
        try:
            if _get_ident() == self._loop_thread:
                self.wake_handle = loop.call_soon(self._wake)
            else:
                loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: close() or the session finalizer frees
            pass

    def _disarm(self) -> None:
        # The next drop schedules a wake-up again (and the registry calls the hook for it).
        self._armed = False
        registry = self._registry
        if registry is not None:
            registry.hook_armed = False

    def _wake(self) -> None:
        self.wake_handle = None
        if self._stopping:
            return
        # Disarm before looking at the queue (a racing drop then schedules another
        # wake-up): when inline ops have already freed what was dropped, the task is not
        # woken for nothing (that would cost a loop iteration at every yield of a run of
        # inline ops).
        self._disarm()
        registry = self._registry
        if registry is None or not registry._dropped:
            return
        if self._task is None:
            # First drop, or the task was cancelled from outside.
            self._spawn()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        # (no waiter: the task has not reached its first wait yet, and drains then)

    async def _run(self) -> None:
        registry, loop = self._registry, self._loop
        assert registry is not None
        assert loop is not None
        while True:
            if registry._dropped:
                self._disarm()
                registry.collect()
            waiter = self._waiter = loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def _supervise(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        if task.cancelled():
            # Cancelled by other code (e.g. a shutdown that cancels every task), not by
            # stop(): without a task nothing would be freed before close. Come back with
            # the next drop rather than now, so a loop that is shutting down is not
            # handed a new task it would destroy pending.
            self.failures += 1
            logger.warning("aiotensor: background cleanup task was cancelled; restarting it on the next drop")
            self._task = None
            self._disarm()
            return
        exc = task.exception()
        self.failures += 1
        logger.error(
            "aiotensor: background cleanup task failed; restarting it",
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
        )
        self._disarm()
        self._spawn()

    def stop(self) -> asyncio.Task[None] | None:
        self._stopping = True
        self._armed = True  # for good: a drop racing with close schedules nothing
        if self._registry is not None:
            self._registry.on_drop = None
            self._registry.hook_armed = False  # (no hook now: the flag is for it alone)
        task = self._task
        if task is None:
            return None
        self._task = None
        if not task.done():
            task.cancel()
            return task
        return None


_POLICIES: dict[ResourceCleanupStrategy, type[CleanupPolicy]] = {
    ResourceCleanupStrategy.IN_BACKGROUND: BackgroundCleanup,
    ResourceCleanupStrategy.ON_SAFE_POINTS: SafePointCleanup,
    ResourceCleanupStrategy.ON_SESSION_CLOSE: CloseOnlyCleanup,
}


_SAFE_POINTS = ResourceCleanupStrategy.ON_SAFE_POINTS


def make_policy(strategy: ResourceCleanupStrategy) -> CleanupPolicy:
    """The policy object implementing ``strategy``."""
    # The request sessions' strategy by identity first: an enum member's hash is a Python call.
    if strategy is _SAFE_POINTS:
        return SafePointCleanup()
    return _POLICIES[strategy]()
