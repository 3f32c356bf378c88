"""The registry's accounting, drop queue and limits, tested directly."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import aiotensor as at
from aiotensor import ResourceExhaustedError
from aiotensor._backends._allocator import BufferCache
from aiotensor._registry import PHYSICAL_MEMORY, Registry


def _registry(limit: int | None = None) -> tuple[Registry, list[object]]:
    released: list[object] = []
    return Registry(released.append, limit), released


def test_accounting_add_collect_close() -> None:
    reg, released = _registry()
    a = reg.add("buf-a", 100)
    b = reg.add("buf-b", 50)
    assert (reg.live_tensors, reg.live_bytes, reg.peak_bytes, reg.allocated) == (2, 150, 150, 2)
    assert reg.get(a) == "buf-a"
    reg.notify_dropped(a)
    assert reg.pending == 1
    assert reg.collect() == 1
    assert released == ["buf-a"]
    assert (reg.live_tensors, reg.live_bytes, reg.peak_bytes, reg.freed, reg.pending) == (1, 50, 150, 1, 0)
    with pytest.raises(KeyError):
        reg.get(a)
    assert reg.close() == 1
    assert released == ["buf-a", "buf-b"]
    assert reg.closed
    reg.notify_dropped(b)  # after close: ignored
    assert reg.pending == 0
    stats = reg.stats()
    assert stats.allocated - stats.freed == stats.live_tensors == 0


def test_nothing_is_freed_twice() -> None:
    reg, released = _registry()
    rid = reg.add("x", 8)
    reg.notify_dropped(rid)
    reg.notify_dropped(rid)
    assert reg.collect() == 1
    assert reg.free(rid) is False
    assert released == ["x"]
    assert reg.freed == 1


def test_a_failing_release_is_logged_and_the_accounting_stands(caplog: pytest.LogCaptureFixture) -> None:
    def broken(buffer: object) -> None:
        raise OSError("remote gone")

    reg = Registry(broken)
    rid = reg.add("x", 8)
    reg.notify_dropped(rid)
    with caplog.at_level(logging.ERROR, logger="aiotensor"):
        assert reg.collect() == 1
    assert reg.live_bytes == 0
    assert "releasing a buffer failed" in caplog.text


def test_drops_from_many_threads_are_all_queued() -> None:
    reg, _ = _registry()
    rids = [reg.add(i, 1) for i in range(2000)]

    def drop(part: list[int]) -> None:
        for r in part:
            reg.notify_dropped(r)

    threads = [threading.Thread(target=drop, args=(rids[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.pending == 2000
    assert reg.collect() == 2000
    assert reg.live_tensors == 0


def test_reserve_checks_the_limit_and_reclaims_when_allowed() -> None:
    reg, _ = _registry(limit=100)
    rid = reg.add("x", 80)
    reg.notify_dropped(rid)
    with pytest.raises(ResourceExhaustedError, match=r"requested 40 bytes with 80 bytes live .* memory_limit=100"):
        reg.reserve(40, "zeros", reclaim=False)
    assert reg.live_bytes == 80  # nothing reclaimed
    reg.reserve(40, "zeros", reclaim=True)  # frees the pending 80 first
    assert (reg.live_bytes, reg.reserved) == (0, 40)
    with pytest.raises(ResourceExhaustedError):
        reg.reserve(70, "zeros", reclaim=True)  # 40 reserved + 70 > 100
    reg.unreserve(40)
    assert reg.reserved == 0


@pytest.mark.skipif(PHYSICAL_MEMORY is None, reason="this platform does not report its memory")
def test_a_request_larger_than_the_machine_fails_without_a_limit() -> None:
    reg, _ = _registry()
    assert PHYSICAL_MEMORY is not None
    with pytest.raises(ResourceExhaustedError, match="more than this machine"):
        reg.reserve(PHYSICAL_MEMORY + 1, "zeros", reclaim=True)
    assert reg.reserved == 0


async def test_stats_count_the_bytes_allocated() -> None:
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS) as s:
        a = await s.ones((10, 10))  # 800 bytes
        b = await s.add(a, 1.0)  # 800 more
        del b
        await s.run([])
        stats = s.stats()
        assert stats.allocated_bytes == 1600  # freed buffers still count: it is a total
        assert stats.live_bytes == 800


@pytest.mark.parametrize("inline_us", [50.0, 0.0])  # inline on the loop, and on the pool
async def test_stats_add_up_the_time_kernels_ran(inline_us: float) -> None:
    def slow(x: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return x + 1.0

    config = at.SessionConfig(inline_threshold_us=inline_us)
    async with at.AsyncEagerSession(config=config) as s:
        a = await s.ones(4)
        before = s.stats().kernel_seconds
        await s.apply(slow, a)  # apply always runs on the pool: 20 ms timed on the worker
        after_pool = s.stats().kernel_seconds
        assert 0.02 <= after_pool - before < 5.0
        b = await s.add(a, a)  # inline when inline_us allows, else on the pool
        assert s.stats().kernel_seconds > after_pool
        del b
    async with at.AsyncEagerSession(config=config) as s, at.AsyncEagerSession(parent=s) as child:
        await child.apply(slow, await child.ones(2))
        assert child.stats().kernel_seconds >= 0.02
        assert s.stats().kernel_seconds == 0.0  # a request session's time is its own


def test_no_release_call_when_dropping_the_reference_is_the_release() -> None:
    # LocalBackend says so (Backend.releases); a backend of buffers elsewhere keeps the call.
    assert at.LocalBackend.releases is False
    assert at.Backend.releases is True
    reg = Registry(None)
    buf = np.zeros(4)
    a = reg.add(buf, buf.nbytes)
    reg.count_unregistered(2)  # intermediates of a run: allocated and freed, never registered
    reg.notify_dropped(a)
    assert reg.collect() == 1
    assert (reg.live_tensors, reg.live_bytes, reg.allocated, reg.freed) == (0, 0, 3, 3)
    assert reg.close() == 0


async def test_sessions_skip_the_release_call_only_for_backends_that_need_none() -> None:
    released: list[object] = []

    class Counting(at.LocalBackend):
        releases = True

        def release(self, handle: object) -> None:
            released.append(handle)

    async with at.AsyncEagerSession() as s:
        assert s._engine.registry._release is None
    async with at.AsyncEagerSession(backend=Counting()) as c:
        x = await c.constant([1.0, 2.0])
        del x
    assert len(released) == 1


@pytest.mark.parametrize("how", ["collect", "close"])
def test_freeing_without_a_release_call_offers_large_buffers_to_the_cache(how: str) -> None:
    # The path of in-process arrays (no release call, no memory wait): small buffers
    # are let go, large ones kept for reuse unless something else still sees them.
    cache = BufferCache(1 << 24, min_bytes=1024)
    reg = Registry(None, cache=cache)
    small, large, seen = np.zeros(8), np.zeros(1024), np.zeros(512)
    view = seen[1:]  # a view of a freed buffer: the cache must refuse it
    rids = [reg.add(a, a.nbytes) for a in (small, large, seen)]
    del small, large, seen
    if how == "collect":
        for rid in [*rids, rids[0]]:  # one dropped twice: freed once
            reg.notify_dropped(rid)
        assert reg.collect() == 3
    else:
        assert reg.close() == 3
    assert (reg.live_tensors, reg.live_bytes, reg.freed, reg.pending) == (0, 0, 3, 0)
    assert (cache.kept, cache.refused, cache.cached_bytes) == (1, 1, 8192)  # (the small one is not offered)
    assert view.base is not None
    assert cache.take((1024,), np.float64) is not None
