"""memory_limit with backpressure (``memory_wait``) and without it (fail at once)."""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import threading

import numpy as np
import pytest

import aiotensor as at
from aiotensor._memory import MemoryGate

from ._results import one

F8 = 8  # bytes per float64


def gate_of(s: at.AsyncEagerSession) -> MemoryGate:
    gate = s._engine.registry.gate
    assert gate is not None
    return gate


async def until(predicate: object, timeout: float = 5.0) -> None:
    """Yield to the loop until ``predicate()`` holds (no timing assumptions)."""
    assert callable(predicate)
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0)


def waiting(limit: int, wait: float = 5.0) -> at.SessionConfig:
    return at.SessionConfig(memory_limit=limit, memory_wait=wait)


# -- configuration -----------------------------------------------------------------------
def test_config_defaults_keep_the_first_four_fields() -> None:
    config = at.SessionConfig()
    assert config.memory_wait is None
    assert list(config.__dataclass_fields__)[:4] == [
        "allow_soft_placement",
        "log_device_placement",
        "max_workers",
        "memory_limit",
    ]
    assert at.SessionConfig(memory_limit=10, memory_wait=0.5).memory_wait == 0.5


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "1", [1]])
def test_config_rejects_bad_memory_wait(bad: object) -> None:
    with pytest.raises(at.InvalidArgumentError, match="memory_wait must be a positive finite number"):
        at.SessionConfig(memory_limit=10, memory_wait=bad)  # type: ignore[arg-type]


def test_config_memory_wait_needs_a_limit() -> None:
    with pytest.raises(at.InvalidArgumentError, match="needs memory_limit"):
        at.SessionConfig(memory_wait=1.0)


# -- fail at once (memory_wait=None) ---------------------------------------------------------
async def test_without_wait_an_allocation_over_the_limit_fails_at_once(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(memory_limit=100 * F8)) as s:
        assert s._engine.registry.gate is None
        a = await s.zeros(80)
        with pytest.raises(at.ResourceExhaustedError, match="memory_limit=800"):
            await s.zeros(30)
        with pytest.raises(at.ResourceExhaustedError, match=r"result of 640 bytes .* memory_limit=800"):
            await s.add(a, 1.0)  # size unknown before the kernel: checked after it
        st = s.stats()
        assert (st.live_tensors, st.live_bytes, st.pending) == (1, 640, 0)
        assert s._engine.registry.reserved == 0


async def test_rejected_result_leaves_no_stale_drop(strategy: at.ResourceCleanupStrategy) -> None:
    # Regression: an unknown-size result over the limit was wrapped in handles, freed by
    # force, and the handles' later drop queued ids already freed: stats().pending
    # counted buffers that did not exist (for good under ON_SESSION_CLOSE).
    async with at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(memory_limit=10 * F8)) as s:
        a = await s.zeros(6)
        for _ in range(3):
            with pytest.raises(at.ResourceExhaustedError):
                await s.add(a, 1.0)
        gc.collect()
        st = s.stats()
        assert st.pending == 0
        assert st.allocated - st.freed == st.live_tensors == 1


# -- waiting ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy", [at.ResourceCleanupStrategy.IN_BACKGROUND, at.ResourceCleanupStrategy.ON_SAFE_POINTS], ids=str
)
async def test_known_size_waits_for_a_free_by_another_task(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(cleanup=strategy, config=waiting(100 * F8)) as s:
        holder = [await s.ones(100)]
        waiter = asyncio.create_task(s.full(50, 2.0))
        await until(lambda: gate_of(s).queued == 1)
        assert not waiter.done()
        holder.clear()  # the only handle: the strategy frees it, with no further op
        t = await waiter
        np.testing.assert_array_equal(await t.numpy(), np.full(50, 2.0))
        assert s.stats().peak_bytes <= 100 * F8
        assert s._engine.registry.reserved == 0


async def test_on_safe_points_a_drop_on_another_thread_reaches_the_waiter() -> None:
    strategy = at.ResourceCleanupStrategy.ON_SAFE_POINTS
    async with at.AsyncEagerSession(cleanup=strategy, config=waiting(100 * F8)) as s:
        box = [await s.ones(100)]
        waiter = asyncio.create_task(s.zeros(100))
        await until(lambda: gate_of(s).queued == 1)
        assert s._engine.registry.on_drop is not None  # the waiter's reclaimer, only while queued
        dropper = threading.Thread(target=box.clear)
        dropper.start()
        dropper.join()
        t = await waiter
        assert t.shape == (100,)
        assert s._engine.registry.on_drop is None


async def test_on_session_close_fails_at_once_when_nothing_can_be_freed() -> None:
    strategy = at.ResourceCleanupStrategy.ON_SESSION_CLOSE
    async with at.AsyncEagerSession(cleanup=strategy, config=waiting(100 * F8, wait=30.0)) as s:
        a = await s.ones(100)
        del a
        with pytest.raises(at.ResourceExhaustedError, match="frees nothing before close"):
            await s.zeros(1)
        assert gate_of(s).queued == 0


async def test_request_larger_than_the_limit_fails_at_once(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(cleanup=strategy, config=waiting(100 * F8, wait=30.0)) as s:
        await s.ones(100)  # dropped at once: the session is full of pending bytes
        with pytest.raises(at.ResourceExhaustedError, match="more than memory_limit"):
            await s.zeros(101)
        with pytest.raises(at.ResourceExhaustedError, match="more than this machine"):
            await s.zeros(10**15)


async def test_timeout_raises_and_leaves_nothing_behind(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(cleanup=strategy, config=waiting(100 * F8, wait=0.05)) as s:
        held = await s.ones(100)
        if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
            expected = "frees nothing before close"
        else:
            expected = r"waited 0.05 s for 80 bytes under memory_limit=800"
        with pytest.raises(at.ResourceExhaustedError, match=expected):
            await s.zeros(10)
        with pytest.raises(at.ResourceExhaustedError):
            await s.add(held, 1.0)  # unknown size: admitted, then waits with its result
        st = s.stats()
        assert (st.live_tensors, st.live_bytes) == (1, 100 * F8)
        assert s._engine.registry.reserved == 0
        assert gate_of(s).queued == 0
        np.testing.assert_array_equal(await held.numpy(), np.ones(100))


async def test_waiters_are_served_first_come_first_served() -> None:
    async with at.AsyncEagerSession(config=waiting(10 * 10 * F8)) as s:
        chunks = [await s.ones(10) for _ in range(10)]  # the session is full
        order: list[str] = []

        async def request(label: str, n: int) -> at.Tensor:
            t = await s.zeros(n)
            order.append(label)
            return t

        big = asyncio.create_task(request("big", 80))
        await until(lambda: gate_of(s).queued == 1)
        smalls = []
        for i in range(3):
            smalls.append(asyncio.create_task(request(f"small{i}", 10)))
            await until(lambda i=i: gate_of(s).queued == 2 + i)
        del chunks[:1]  # room for a small one, not for big: nobody overtakes big
        await until(lambda: s.stats().live_tensors == 9)
        for _ in range(20):
            await asyncio.sleep(0)
        assert order == []
        del chunks[:7]  # room for big
        big_t = await big
        assert order == ["big"]
        assert big_t.shape == (80,)
        del big, big_t, chunks[:]  # room for every small one (the task held its result too)
        await asyncio.gather(*smalls)
        assert order == ["big", "small0", "small1", "small2"]
        assert s.stats().peak_bytes <= 100 * F8


async def test_unknown_size_result_waits_with_its_result_in_hand() -> None:
    async with at.AsyncEagerSession(config=waiting(100 * F8)) as s:
        x = await s.ones(40)
        filler = [await s.ones(40)]
        task = asyncio.create_task(s.multiply(x, 3.0))  # 320 more bytes: 1120 > 800
        await until(lambda: gate_of(s).queued == 1)
        assert s.stats().live_bytes == 80 * F8  # the waiting result is not the session's yet
        filler.clear()
        y = await task
        np.testing.assert_array_equal(await y.numpy(), np.full(40, 3.0))
        assert s.stats().peak_bytes <= 100 * F8


async def test_cancelled_waiter_leaves_the_queue_and_unblocks_the_next() -> None:
    async with at.AsyncEagerSession(config=waiting(100 * F8)) as s:
        hold = [await s.ones(50), await s.ones(50)]
        big = asyncio.create_task(s.zeros(100))
        await until(lambda: gate_of(s).queued == 1)
        small = asyncio.create_task(s.zeros(50))
        await until(lambda: gate_of(s).queued == 2)
        del hold[0]  # room for small, but it waits behind big
        await until(lambda: s.stats().live_tensors == 1)
        assert not small.done()
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        t = await small
        assert t.shape == (50,)
        assert gate_of(s).queued == 0
        assert s._engine.registry.reserved == 0


async def test_close_fails_every_waiter(strategy: at.ResourceCleanupStrategy) -> None:
    s = at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.IN_BACKGROUND, config=waiting(100 * F8, wait=30.0))
    async with s:
        held = await s.ones(100)
        waiters = [asyncio.create_task(s.zeros(10)) for _ in range(5)]
        await until(lambda: gate_of(s).queued == 5)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, at.SessionClosedError) for r in results), results
    assert "waited for memory" in str(results[0])
    st = s.stats()
    assert (st.live_tensors, st.live_bytes) == (0, 0)
    assert s._engine.registry.reserved == 0
    del held


@pytest.mark.parametrize(
    "strategy", [at.ResourceCleanupStrategy.IN_BACKGROUND, at.ResourceCleanupStrategy.ON_SAFE_POINTS], ids=str
)
async def test_many_tasks_under_a_tight_limit_all_finish_and_never_exceed_it(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    # Each task holds nothing of its own while it waits (allocate, read, drop), the
    # pattern backpressure is for: then every request is served, whatever the order.
    limit = 4 * 100 * F8
    rng = random.Random(7)
    async with at.AsyncEagerSession(cleanup=strategy, config=waiting(limit, wait=20.0)) as s:
        shared = await s.arange(100.0)

        async def worker(i: int) -> None:
            n = rng.randint(1, 100)
            a = await s.full(n, float(i))  # known size: waits before its kernel
            await asyncio.sleep(0)  # hold it a while: small ops may run inline, never suspending
            np.testing.assert_array_equal(await a.numpy(), np.full(n, float(i)))
            del a
            b = await s.add(shared, float(i))  # unknown size: admitted, then fits or waits
            await asyncio.sleep(0)
            np.testing.assert_array_equal(await b.numpy(), np.arange(100.0) + i)

        await asyncio.gather(*(worker(i) for i in range(300)))
        gate = gate_of(s)
        assert s.stats().peak_bytes <= limit
        assert s._engine.registry.reserved == 0
        assert (gate.queued, gate.timed_out) == (0, 0)
        assert gate.waited > 0  # the limit was tight enough to make tasks queue
        assert gate.granted == gate.waited


async def test_tasks_that_hold_memory_while_waiting_time_out_rather_than_hang() -> None:
    # The limit of any allocator without preemption: two tasks each holding half the
    # memory and each asking for more wait for each other. memory_wait bounds it: both
    # get ResourceExhaustedError, nothing leaks, and the session stays usable.
    async with at.AsyncEagerSession(config=waiting(100 * F8, wait=0.1)) as s:
        both_hold = asyncio.Barrier(2)

        async def greedy() -> None:
            held = await s.ones(50)
            await both_hold.wait()
            try:
                await s.zeros(10)
            finally:
                del held

        results = await asyncio.gather(greedy(), greedy(), return_exceptions=True)
        # Neither can proceed until one gives up: at least one times out. Once it frees
        # what it held, the other's wait may end in success before its own deadline.
        kinds = sorted(type(r).__name__ for r in results)
        assert kinds in (["ResourceExhaustedError", "ResourceExhaustedError"], ["NoneType", "ResourceExhaustedError"])
        assert s.stats().live_bytes in (0, 50 * F8)  # the second task's wait may end after the first freed
        await settle_gate(s)
        t = await s.zeros(100)
        assert t.nbytes == 100 * F8


async def settle_gate(s: at.AsyncEagerSession) -> None:
    await until(lambda: s.stats().pending == 0 and gate_of(s).queued == 0)


# -- the memory of multi-op kernels (issue 27: 8, 9 and concurrent computations) ----------
MB8 = 1 << 20  # float64 items in 8 MiB


async def _cache_24_mib(s: at.AsyncEagerSession) -> None:
    await s.run([])
    s.trim()
    kept = [await s.ones(MB8) for _ in range(3)]
    del kept
    await s.run([])  # a safe point: the three go to the cache
    assert s.stats().cached_bytes == 3 * MB8 * F8


async def test_intermediates_make_the_buffer_cache_give_way_first() -> None:
    # Issue 27 (8): 40 MiB limit, 8 MiB live, 24 MiB cached: intermediates ignored the cache.
    limit = 40 * MB8 * F8 // 8
    config = at.SessionConfig(memory_limit=limit, buffer_cache_bytes=32 << 20)
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS, config=config) as s:
        x = await s.ones(MB8)
        nb = x.nbytes
        await _cache_24_mib(s)
        y = await ((x * 2.0) + (x * 3.0))  # two 8 MiB intermediates at once
        assert s.stats().cached_bytes <= limit - nb - 2 * nb
        del y
        await _cache_24_mib(s)
        seen: list[int] = []

        def probe(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            seen.append(s.stats().cached_bytes)  # while both intermediates are alive
            total: np.ndarray = a + b
            return total

        z = await s.apply(probe, x * 2.0, x * 3.0)  # an expression: apply is one of its steps
        assert seen[-1] + nb + 2 * nb <= limit

        def fused(ops: object, a: object) -> object:
            y2, y3 = a * 2.0, a * 3.0  # type: ignore[operator]
            seen.append(s.stats().cached_bytes)
            return y2 + y3

        del z
        await _cache_24_mib(s)
        f = s.function(fused)
        w = one(await f(x))
        assert seen[-1] + nb + 2 * nb <= limit
        np.testing.assert_array_equal(await w.numpy(), np.full(MB8, 5.0))
        del w, x


def _queued_or_done(s: at.AsyncEagerSession, task: asyncio.Future[at.Tensor]) -> bool:
    return bool(gate_of(s).queued) or task.done()  # (done: it failed instead of waiting)


async def test_memory_wait_waits_for_what_an_expression_needs() -> None:
    # Issue 27 (9): admission waited for 1 byte, then the budget was fixed at that moment.
    n = 1000
    nb = n * F8
    async with at.AsyncEagerSession(config=waiting(5 * nb)) as s:
        x = await s.ones(n)
        f = s.function(lambda ops, a: (a * 2.0) + (a * 3.0))
        await f(x)  # learns what a run holds
        for run in (lambda: (x * 2.0) + (x * 3.0), lambda: f(x)):
            blocker = await s.ones((3, n))  # 1 nb free: not enough for two intermediates
            task = asyncio.ensure_future(run())
            await until(functools.partial(_queued_or_done, s, task))
            del blocker  # freed by the background task: room for the waiting computation
            got = await task
            np.testing.assert_array_equal(await got.numpy(), np.full(n, 5.0))
            del got, task  # (the task holds its result too)
            gc.collect()
            await until(lambda: s.stats().live_tensors == 1)


async def test_concurrent_computations_cannot_together_exceed_the_limit() -> None:
    n = 1000
    nb = n * F8
    config = at.SessionConfig(memory_limit=5 * nb, inline_threshold_us=0)  # the fused run on the pool
    async with at.AsyncEagerSession(config=config) as s:
        x = await s.constant(np.ones(n))
        started, release = threading.Event(), threading.Event()

        def hold(ops: object, a: object) -> object:
            y = a * 2.0  # type: ignore[operator]
            started.set()
            release.wait(5)
            return y + 1.0

        f = s.function(hold)
        release.set()
        await f(x)  # its first run for these shapes: learns what a run holds (2 values)
        release.clear()
        started.clear()
        first = asyncio.ensure_future(f(x))  # holds its 2 nb while it runs (on the pool)
        await until(started.is_set)
        try:
            with pytest.raises(at.ResourceExhaustedError, match="inside an expression"):
                await ((x * 2.0) + (x * 3.0))  # 3 nb: with x and the fused run's, over 5 nb
        finally:
            release.set()
        np.testing.assert_array_equal(await one(await first).numpy(), np.full(n, 3.0))
        np.testing.assert_array_equal(await ((x * 2.0) + (x * 3.0)).eval(), np.full(n, 5.0))
