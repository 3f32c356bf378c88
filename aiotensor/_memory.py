"""Backpressure on ``memory_limit``: an allocation that does not fit waits its turn.

With ``SessionConfig(memory_limit=..., memory_wait=seconds)`` an op whose output does
not fit under the limit queues for up to ``memory_wait`` seconds, until frees by
other tasks make room, instead of failing at once. A wait that times out raises
:class:`ResourceExhaustedError`; a session that closes fails every waiter with
:class:`SessionClosedError`.

Fairness: requests are served strictly in the order of their *task's* arrival (the
task's first allocation in this session). A request waits behind every request of an
older task even if it would fit, so a large request is never starved by a stream of
small ones. Ordering by task rather than by request keeps the queue from
deadlocking: a task that already holds memory and asks for more is served before
newcomers that wait for that very memory (with plain per-request FIFO, 300 tasks
doing ``a = full(...); b = add(a, 1)`` deadlocked until their timeout in tests).

Every granted request is counted in the registry's ``reserved`` bytes until its
buffers are registered, so ``live_bytes + reserved`` never exceeds the limit because
of a granted request. Ops whose output size is known beforehand (creation ops) wait
*before* their kernel runs. Other ops are admitted through the same queue (they wait
while an older task is queued or the session is full), run, and if their result
then does not fit, wait with the result in hand (its memory exists in the process
meanwhile, but is not the session's, and not counted, until it fits).

Everything here runs on the session's loop thread, except :meth:`MemoryGate._on_drop`
(a finalizer hook, any thread). Wake-ups are deferred to a loop callback so that a
free in the middle of an op never hands its room to a waiter before the op has
registered its own result.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import weakref
from typing import Any

from ._errors import InvalidArgumentError, ResourceExhaustedError, SessionClosedError

__all__ = ["MemoryGate", "check_wait"]


def check_wait(memory_wait: object, memory_limit: int | None) -> None:
    """Validate ``SessionConfig.memory_wait``; raise InvalidArgumentError if it is unusable."""
    if memory_wait is None:
        return
    if isinstance(memory_wait, bool) or not isinstance(memory_wait, int | float) or not (0 < memory_wait < math.inf):
        raise InvalidArgumentError(
            f"SessionConfig.memory_wait must be a positive finite number of seconds or None, got {memory_wait!r}"
        )
    if memory_limit is None:
        raise InvalidArgumentError("SessionConfig.memory_wait needs memory_limit: there is no limit to wait under")


class _Waiter:
    __slots__ = ("future", "need", "reclaim", "reserve", "ticket", "what")

    def __init__(
        self, future: asyncio.Future[None], need: int, reserve: bool, ticket: int, reclaim: bool, what: str
    ) -> None:
        self.future = future
        self.reclaim = reclaim  # the strategy frees dropped buffers before close
        self.what = what
        self.need = need  # bytes that must fit: live + reserved + need <= limit
        self.reserve = reserve  # hold ``need`` bytes in ``reserved`` once granted
        self.ticket = ticket  # the age of the requesting task: lower is served first


class MemoryGate:
    """The queue of allocations waiting for room under a registry's ``memory_limit``."""

    __slots__ = (
        "_armed",
        "_counter",
        "_loop",
        "_registry",
        "_scheduled",
        "_tickets",
        "_waiters",
        "granted",
        "timed_out",
        "timeout",
        "waited",
    )

    def __init__(self, registry: Any, timeout: float) -> None:  # the Registry (a layer above)
        self._registry = registry
        self.timeout = timeout
        self._waiters: list[_Waiter] = []  # sorted by ticket
        self._tickets: weakref.WeakKeyDictionary[asyncio.Task[object], int] = weakref.WeakKeyDictionary()
        self._counter = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._armed = False
        # Counters for tests and docs: requests that queued, were served, timed out.
        self.waited = 0
        self.granted = 0
        self.timed_out = 0

    @property
    def queued(self) -> int:
        """How many requests are waiting now."""
        return len(self._waiters)

    def _room(self, need: int) -> bool:
        registry = self._registry
        limit = registry.memory_limit
        assert limit is not None
        registry.make_room(need)
        fits: bool = registry.live_bytes + registry.reserved + need <= limit
        return fits

    def _ticket(self) -> int:
        task = asyncio.current_task()
        if task is None:  # not in a task (a bare callback): as young as can be
            return next(self._counter)
        ticket = self._tickets.get(task)
        if ticket is None:
            ticket = self._tickets[task] = next(self._counter)
        return ticket

    def _first(self, ticket: int) -> bool:
        # Nobody older is queued: this request may take room that is free now.
        return not self._waiters or self._waiters[0].ticket > ticket

    # -- the two ways in ----------------------------------------------------------
    async def acquire(self, nbytes: int | None, what: str, *, reclaim: bool) -> None:
        """Before a kernel: reserve ``nbytes`` (or, if unknown, wait for admission).

        Returns at once when no older task is queued and the request fits; otherwise
        queues. A known ``nbytes`` stays reserved on return (the caller unreserves
        it); admission reserves nothing.
        """
        ticket = self._ticket()
        if nbytes is None:
            if self._first(ticket) and self._room(1):
                return
            await self._wait(1, False, ticket, what, reclaim)
            return
        self._registry.check_physical(nbytes, what)
        if self._first(ticket) and self._room(nbytes):
            self._registry.reserved += nbytes
            return
        await self._wait(nbytes, True, ticket, what, reclaim)

    async def fit_result(self, nbytes: int, what: str, *, reclaim: bool) -> None:
        """After a kernel whose output size was unknown: wait until ``nbytes`` fit.

        The op was admitted through the queue (:meth:`acquire`), so it may take room
        that is free now whoever is queued. On return the room is free (nothing is
        left reserved): the caller registers the buffers before it next yields.
        """
        if self._room(nbytes):
            return
        await self._wait(nbytes, True, self._ticket(), what, reclaim)
        self._registry.reserved -= nbytes  # the caller registers the bytes now

    # -- waiting ------------------------------------------------------------------
    async def _wait(self, need: int, reserve: bool, ticket: int, what: str, reclaim: bool) -> None:
        registry = self._registry
        limit = registry.memory_limit
        assert limit is not None
        if need > limit:
            raise ResourceExhaustedError(f"{what}: requested {need} bytes, more than memory_limit={limit}")
        if not reclaim and registry.live_bytes + need > limit:
            # ON_SESSION_CLOSE frees nothing before close: only reservations of ops in
            # flight can come back, and they would not make room for this request.
            raise ResourceExhaustedError(
                f"{what}: requested {need} bytes with {registry.live_bytes} bytes live would exceed"
                f" memory_limit={limit}, and this session's cleanup strategy frees nothing before close"
            )
        loop = asyncio.get_running_loop()
        self._loop = loop
        waiter = _Waiter(loop.create_future(), need, reserve, ticket, reclaim, what)
        bisect.insort(self._waiters, waiter, key=lambda w: w.ticket)
        self.waited += 1
        if reclaim:
            self._install_reclaimer()
            registry.collect()  # pending buffers first: their room is the cheapest
        self._poke()
        try:
            async with asyncio.timeout(self.timeout):
                await waiter.future
        except BaseException as exc:
            fut = waiter.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # Granted in the same loop turn as the timeout or cancellation: give it back.
                if reserve:
                    registry.reserved -= need
            else:
                fut.cancel()
                if waiter in self._waiters:  # close() may have emptied the queue
                    self._waiters.remove(waiter)
            self._poke()  # this request may have been blocking the ones behind it
            self._uninstall_if_idle()
            if isinstance(exc, TimeoutError):
                self.timed_out += 1
                raise ResourceExhaustedError(
                    f"{what}: waited {self.timeout} s for {need} bytes under memory_limit={limit}"
                    f" ({registry.live_bytes} bytes live, {registry.reserved} reserved,"
                    f" {len(self._waiters)} requests still queued); free tensors sooner, raise"
                    " memory_limit or memory_wait"
                ) from None
            raise
        self.granted += 1

    # -- wake-ups -----------------------------------------------------------------
    def poke(self) -> None:
        """Bytes were freed or given back: serve the queue on the next loop turn."""
        if self._waiters:
            self._poke()

    def _poke(self) -> None:
        if self._scheduled or self._loop is None:
            return
        self._scheduled = True
        self._loop.call_soon(self._serve)

    def _serve(self) -> None:
        self._scheduled = False
        waiters = self._waiters
        while waiters:
            head = waiters[0]
            if head.future.done():  # cancelled, or failed by close
                del waiters[0]
                continue
            limit = self._registry.memory_limit
            if not head.reclaim and self._registry.live_bytes + head.need > limit:
                # ON_SESSION_CLOSE frees nothing before close: what reservations held has
                # become live bytes, and this request can never be served. Fail it now
                # rather than at the end of its timeout (as at request time).
                del waiters[0]
                head.future.set_exception(
                    ResourceExhaustedError(
                        f"{head.what}: requested {head.need} bytes with {self._registry.live_bytes} bytes live"
                        f" would exceed memory_limit={limit}, and this session's cleanup strategy frees"
                        " nothing before close"
                    )
                )
                continue
            if not self._room(head.need):
                break  # nobody overtakes the head
            del waiters[0]
            if head.reserve:
                self._registry.reserved += head.need
            head.future.set_result(None)
        self._uninstall_if_idle()

    # -- ON_SAFE_POINTS: drops must reach a waiter even when no op runs -------------
    def _install_reclaimer(self) -> None:
        registry = self._registry
        if registry.on_drop is None:
            registry.on_drop = self._on_drop

    def _uninstall_if_idle(self) -> None:
        registry = self._registry
        if not self._waiters and registry.on_drop == self._on_drop:
            registry.on_drop = None

    def _on_drop(self) -> None:
        # A finalizer hook, on any thread: no locks, one callback per burst of drops.
        if self._armed:
            return
        self._armed = True
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._reclaim)
        except RuntimeError:  # loop closed: close() frees everything anyway
            pass

    def _reclaim(self) -> None:
        self._armed = False
        if not self._registry.closed:
            self._registry.collect()
        self._poke()

    def close(self) -> None:
        """Fail every waiter with SessionClosedError (the session is closing)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(SessionClosedError("the session closed while the op waited for memory"))
        self._uninstall_if_idle()
