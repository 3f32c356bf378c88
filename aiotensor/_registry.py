"""The resources a session owns: buffer ids, byte accounting and the drop queue.

Threading model: the registry is confined to the thread of the session's event loop,
with one exception, :meth:`Registry.notify_dropped`, which tensor finalizers call from
any thread (including from inside garbage collection). That method only appends to a
``collections.deque`` (atomic under the GIL) and calls a wake-up hook that takes no
lock, so a finalizer can never wait on a lock its own thread holds.
"""

from __future__ import annotations

import collections
import logging
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._backends._allocator import BufferCache
from ._errors import ResourceExhaustedError
from ._memory import MemoryGate

__all__ = ["Registry", "SessionStats"]

logger = logging.getLogger("aiotensor")


_nbytes_of = operator.itemgetter(1)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX, or not reported
        return None


#: Bytes of RAM on this machine: no single request may exceed it.
PHYSICAL_MEMORY: int | None = _physical_memory()


@dataclass(frozen=True, slots=True)
class SessionStats:
    """An immutable snapshot of what a session holds, from :meth:`AsyncEagerSession.stats`.

    Attributes:
        live_tensors: Buffers the registry holds, pending ones included.
        live_bytes: Their total size in bytes.
        peak_bytes: The highest ``live_bytes`` seen since the session opened.
        pending: Buffers whose handles were dropped but which are not freed yet.
        allocated: Buffers made since the session opened: the registered ones, and the
            intermediates of expressions, fused and batched functions, which are
            counted as allocated and freed when their run ends.
        freed: Buffers freed since the session opened, those intermediates included
            (``allocated - freed == live_tensors``).
        in_flight: Kernels submitted and not finished yet.
        cleanup_failures: Times the background cleanup task failed and was restarted.
        cached_bytes: Bytes of freed buffers kept by the buffer cache for reuse
            (``SessionConfig.buffer_cache_bytes``; shared with child sessions). Not
            part of ``live_bytes``; counted against ``memory_limit``.
        allocated_bytes: Bytes of the buffers registered since the session opened (the
            results of its ops; intermediates of expressions and fused functions are
            in ``allocated``'s count and ``peak_bytes`` but not here).
        kernel_seconds: Seconds the session's kernels ran, inline on the event loop
            and on aiotensor's worker pool (not timed: kernels on an ``executor=`` of
            your own or a remote backend).
    """

    live_tensors: int
    live_bytes: int
    peak_bytes: int
    pending: int
    allocated: int
    freed: int
    in_flight: int = 0
    cleanup_failures: int = 0
    cached_bytes: int = 0
    allocated_bytes: int = 0
    kernel_seconds: float = 0.0


class Registry:
    """Maps resource ids to backend buffers and keeps the byte accounting.

    ``release`` is called with each buffer freed (not kept by ``cache``); ``None``
    when dropping the reference is the release, as for in-process arrays.
    """

    __slots__ = (
        "_buffers",
        "_dropped",
        "_next_id",
        "_owns_cache",
        "_release",
        "_unregistered",
        "allocated_bytes",
        "cache",
        "closed",
        "freed",
        "gate",
        "hook_armed",
        "kernel_seconds",
        "live_bytes",
        "memory_limit",
        "on_drop",
        "peak_bytes",
        "reserved",
    )

    def __init__(
        self,
        release: Callable[[Any], None] | None,
        memory_limit: int | None = None,
        memory_wait: float | None = None,
        cache: BufferCache | None = None,
        *,
        owns_cache: bool = False,
    ) -> None:
        #: Where freed buffers go for reuse (see ``_allocator``); the root session's, shared by its children.
        self.cache = cache
        self._owns_cache = owns_cache  # cleared when this registry closes
        # rid -> (backend buffer, nbytes)
        self._buffers: dict[int, tuple[Any, int]] = {}
        self._dropped: collections.deque[int] = collections.deque()
        self._next_id = 0
        self._release = release
        self.memory_limit = memory_limit
        self.on_drop: Callable[[], None] | None = None
        #: Set by ``on_drop``'s owner while what the hook schedules has not run yet: a
        #: drop then only queues its id (no call per drop of a burst).
        self.hook_armed = False
        self.closed = False
        self.live_bytes = 0
        self.peak_bytes = 0
        self.reserved = 0
        self._unregistered = 0  # buffers counted in ``allocated`` that never got an id (intermediates)
        self.allocated_bytes = 0
        self.kernel_seconds = 0.0
        self.freed = 0
        #: The queue of allocations waiting for room (``memory_wait``), or None to fail at once.
        self.gate = MemoryGate(self, memory_wait) if memory_wait is not None and memory_limit is not None else None

    # -- any thread ---------------------------------------------------------------
    def notify_dropped(self, rid: int) -> None:
        """Record that the last handle of ``rid`` is gone. Frees nothing by itself."""
        if self.closed:
            return
        self._dropped.append(rid)
        if not self.hook_armed:
            hook = self.on_drop
            if hook is not None:
                hook()

    # -- loop thread only ---------------------------------------------------------
    @property
    def live_tensors(self) -> int:
        """How many buffers the registry holds."""
        return len(self._buffers)

    @property
    def pending(self) -> int:
        """How many held buffers have no handle left."""
        return len(self._dropped)

    @property
    def allocated(self) -> int:
        """Buffers allocated since the session opened: registered ones (each got the next id), and intermediates."""
        return self._next_id + self._unregistered

    def count_unregistered(self, n: int) -> None:
        """Count ``n`` buffers allocated and freed without being registered (intermediates of one run)."""
        self._unregistered += n
        self.freed += n

    def add(self, buffer: Any, nbytes: int) -> int:
        """Take ownership of ``buffer`` and return its resource id."""
        rid = self._next_id
        self._next_id = rid + 1
        self._buffers[rid] = (buffer, nbytes)
        self.allocated_bytes += nbytes
        live = self.live_bytes + nbytes
        self.live_bytes = live
        if live > self.peak_bytes:
            self.peak_bytes = live
        return rid

    def add_all(self, entries: list[tuple[Any, int]]) -> int:
        """Take ownership of several buffers, ``(buffer, nbytes)`` each: the first one's id (the others' follow it).

        :meth:`add` for each in turn, in C loops: a batch's results are registered at once.
        """
        rid = self._next_id
        k = len(entries)
        self._next_id = rid + k
        self._buffers.update(zip(range(rid, rid + k), entries, strict=True))
        nbytes = sum(map(_nbytes_of, entries))
        self.allocated_bytes += nbytes
        live = self.live_bytes + nbytes
        self.live_bytes = live
        if live > self.peak_bytes:
            self.peak_bytes = live
        return rid

    def get(self, rid: int) -> Any:
        """The buffer of ``rid``; ``KeyError`` if it was freed."""
        return self._buffers[rid][0]

    def reserve(self, nbytes: int, what: str, *, reclaim: bool) -> None:
        """Check that ``nbytes`` more fit, and hold them for an allocation in flight.

        Over the limit, pending buffers are freed first when ``reclaim`` is true (the
        strategy allows it); if it still does not fit, raise ResourceExhaustedError.
        """
        self.check_physical(nbytes, what)
        limit = self.memory_limit
        if limit is not None and self.cache is not None:
            self.make_room(nbytes)
        if limit is not None and self.live_bytes + self.reserved + nbytes > limit:
            if reclaim:
                self.collect()
            if self.live_bytes + self.reserved + nbytes > limit:
                raise ResourceExhaustedError(
                    f"{what}: requested {nbytes} bytes with {self.live_bytes} bytes live"
                    f" and {self.reserved} reserved would exceed memory_limit={limit}"
                )
        self.reserved += nbytes

    def make_room(self, nbytes: int) -> None:
        """Trim the buffer cache so that it and ``nbytes`` more fit under ``memory_limit`` with what is live.

        The cache counts against the limit but gives way first: its bytes never make
        an allocation fail.
        """
        cache, limit = self.cache, self.memory_limit
        if cache is None or limit is None or not cache.cached_bytes:
            return
        excess = self.live_bytes + self.reserved + cache.cached_bytes + nbytes - limit
        if excess > 0:
            cache.trim(cache.cached_bytes - excess)

    def check_physical(self, nbytes: int, what: str) -> None:
        """Raise ResourceExhaustedError if ``nbytes`` is more than this machine's memory."""
        if PHYSICAL_MEMORY is not None and nbytes > PHYSICAL_MEMORY:
            raise ResourceExhaustedError(
                f"{what}: requested {nbytes} bytes, more than this machine's "
                f"{PHYSICAL_MEMORY} bytes of memory (live {self.live_bytes} bytes)"
            )

    def unreserve(self, nbytes: int) -> None:
        """Give back bytes held by :meth:`reserve`."""
        self.reserved -= nbytes
        if self.gate is not None:
            self.gate.poke()

    def check_result(self, nbytes: int, what: str, *, reclaim: bool) -> None:
        """Check that a result of ``nbytes`` (size unknown before its kernel) fits under the limit.

        Called before the result is registered, so a rejected result never gets a
        handle. Pending buffers are freed first when ``reclaim`` is true.
        """
        # Bytes reserved by other ops in flight count: they were promised first.
        limit = self.memory_limit
        if limit is None:
            return
        if self.cache is not None:
            self.make_room(nbytes)
        if self.live_bytes + self.reserved + nbytes <= limit:
            return
        if reclaim:
            self.collect()
        if self.live_bytes + self.reserved + nbytes > limit:
            raise ResourceExhaustedError(
                f"{what}: result of {nbytes} bytes with {self.live_bytes} bytes live and {self.reserved}"
                f" reserved would exceed memory_limit={limit}"
            )

    def free(self, rid: int) -> bool:
        """Let go of one buffer now; ``False`` if it was already freed."""
        entry = self._buffers.pop(rid, None)
        if entry is None:
            return False
        buffer, nbytes = entry
        del entry  # the cache counts references: only ``buffer`` may hold it here
        self.live_bytes -= nbytes
        self.freed += 1
        if self.gate is not None:
            self.gate.poke()
        cache = self.cache
        if cache is not None and nbytes >= cache.min_bytes and cache.give(buffer):
            return True  # kept for reuse: not released
        release = self._release
        if release is None:  # the backend needs no call (LocalBackend.releases)
            return True
        try:
            release(buffer)
        except Exception:  # the accounting is settled; a backend hiccup must not undo it
            logger.exception("aiotensor: releasing a buffer failed")
        return True

    def collect(self) -> int:
        """Free every buffer whose handle was dropped; return how many were freed."""
        dropped = self._dropped
        if not dropped:
            return 0
        # popleft one at a time: a finalizer may append concurrently, and a failure
        # half-way leaves the rest queued, never lost.
        if self.gate is not None or self._release is not None:
            n = 0
            while dropped:
                if self.free(dropped.popleft()):
                    n += 1
            return n
        # The common case (in-process buffers, no memory wait): free() written out, the
        # counts summed here and written once (a batch's 32 results come at once).
        buffers, cache = self._buffers, self.cache
        min_bytes = cache.min_bytes if cache is not None else 1 << 62
        n = freed_bytes = 0
        try:
            while dropped:
                entry = buffers.pop(dropped.popleft(), None)
                if entry is not None:
                    n += 1
                    nbytes = entry[1]
                    freed_bytes += nbytes
                    if nbytes >= min_bytes:
                        buffer = entry[0]
                        del entry  # the cache counts references: only ``buffer`` may hold it here
                        cache.give(buffer)  # type: ignore[union-attr]  # (min_bytes: a cache)
                        del buffer
        finally:
            self.live_bytes -= freed_bytes
            self.freed += n
        return n

    def close(self) -> int:
        """Free everything and refuse further drops; return how many were freed."""
        self.closed = True
        self._dropped.clear()
        if self.gate is not None:
            self.gate.close()
        # Everything, in the order it was made, through collect's loop (the common
        # case's is free() written out).
        self._dropped.extend(self._buffers)
        n = self.collect()
        # A finalizer on another thread may have read ``closed`` as False just before
        # it was set and appended since: nothing is left to free, so drop such ids.
        self._dropped.clear()
        if self._owns_cache and self.cache is not None:
            self.cache.clear()
        return n

    def stats(self, in_flight: int = 0, cleanup_failures: int = 0) -> SessionStats:
        """An immutable snapshot of the accounting."""
        return SessionStats(
            live_tensors=len(self._buffers),
            live_bytes=self.live_bytes,
            peak_bytes=self.peak_bytes,
            pending=len(self._dropped),
            allocated=self.allocated,
            freed=self.freed,
            in_flight=in_flight,
            cleanup_failures=cleanup_failures,
            cached_bytes=0 if self.cache is None else self.cache.cached_bytes,
            allocated_bytes=self.allocated_bytes,
            kernel_seconds=self.kernel_seconds,
        )
