"""Injected faults: failing kernels, a failing cleanup task, close under load and under
cancellation, an executor shut down under the session, and finalizers racing the loop.

Each ends in a documented state (see docs/reliability.md) with nothing leaked, nothing
freed twice (the tracking oracle of ``tests/_tracking.py``) and no hang (every wait is
bounded by ``asyncio.timeout``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import queue
import threading
import time
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._tracking import TrackingBackend, TrackingRegistry, check_accounting, check_all_released, tracked_session
from .conftest import settle

S = at.ResourceCleanupStrategy


def _boom(x: Any, y: Any) -> Any:
    raise RuntimeError("kernel exploded")


def _oom(x: Any) -> Any:
    raise MemoryError("cannot allocate 1 TiB")


def _slow(x: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return np.asarray(x) + 1


async def drain(registry: TrackingRegistry, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while registry.pending:
            await asyncio.sleep(0.001)


# -- kernels that raise ---------------------------------------------------------------------
async def test_kernel_error_names_the_op_and_input_shapes(strategy: at.ResourceCleanupStrategy) -> None:
    s, registry, backend = tracked_session(strategy)
    async with s:
        a = await s.zeros((2, 3))
        b = await s.ones(4, dtype=np.float32)
        with pytest.raises(at.KernelError) as info:
            await s.apply(_boom, a, b)
        message = str(info.value)
        assert "apply(_boom)(float64[2, 3], float32[4])" in message
        assert "RuntimeError: kernel exploded" in message
        assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(at.InvalidArgumentError, match=r"matmul\(float64\[2, 3\], float64\[2, 3\]\)"):
            await s.matmul(a, a)
        with pytest.raises(at.ResourceExhaustedError, match=r"apply\(_oom\)\(float64\[2, 3\]\): out of memory") as oom:
            await s.apply(_oom, a)
        assert isinstance(oom.value.__cause__, MemoryError)
        assert isinstance(oom.value, MemoryError)  # callers catching MemoryError still do
        st = s.stats()
        assert (st.live_tensors, st.allocated, st.in_flight) == (2, 2, 0)
        check_accounting(registry, backend)
    check_all_released(registry, backend)


# -- the background cleanup task fails ---------------------------------------------------------
def _inject_collect_faults(registry: TrackingRegistry, failures: int, free_first: bool) -> list[int]:
    """Make the cleanup task's collect() fail ``failures`` times (after freeing one buffer if asked)."""
    original = registry.collect
    raised: list[int] = []

    def faulty() -> int:
        task = asyncio.current_task()
        if len(raised) < failures and task is not None and task.get_name() == "aiotensor-cleanup":
            raised.append(1)
            if free_first and registry._dropped:
                registry.free(registry._dropped.popleft())  # half-way through a drain
            raise RuntimeError("injected cleanup failure")
        return original()

    registry.collect = faulty  # type: ignore[method-assign]
    return raised


@pytest.mark.parametrize("free_first", [False, True], ids=["before-drain", "mid-drain"])
@pytest.mark.parametrize("failures", [1, 5])
async def test_cleanup_task_failure_is_restarted_logged_counted(
    caplog: pytest.LogCaptureFixture, failures: int, free_first: bool
) -> None:
    s, registry, backend = tracked_session(S.IN_BACKGROUND, at.SessionConfig(inline_threshold_us=0))
    async with s:
        raised = _inject_collect_faults(registry, failures, free_first)
        keep = await s.constant([1.0, 2.0])
        with caplog.at_level(logging.ERROR, logger="aiotensor"):
            for round_ in range(failures + 2):
                batch = [await s.full(3, float(round_)) for _ in range(4)]
                del batch
                await drain(registry)
        assert len(raised) == failures
        assert s.stats().cleanup_failures == failures
        records = [r for r in caplog.records if "background cleanup task failed; restarting it" in r.getMessage()]
        assert len(records) == failures
        assert all(r.exc_info is not None and "injected cleanup failure" in str(r.exc_info[1]) for r in records)
        st = s.stats()
        assert (st.live_tensors, st.pending) == (1, 0)  # nothing lost: every drop was freed
        check_accounting(registry, backend)
        np.testing.assert_array_equal(await keep.numpy(), [1.0, 2.0])
    check_all_released(registry, backend)


async def test_cleanup_task_cancelled_from_outside_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    # Regression: code that cancels every task (a shutdown helper, a test harness)
    # cancelled the cleanup task for good: IN_BACKGROUND then freed nothing before close.
    s, registry, backend = tracked_session(S.IN_BACKGROUND, at.SessionConfig(inline_threshold_us=0))
    async with s:
        first = await s.zeros(1)
        del first  # the first drop spawns the cleanup task
        await drain(registry)
        cleanup = [t for t in asyncio.all_tasks() if t.get_name() == "aiotensor-cleanup"]
        assert len(cleanup) == 1
        with caplog.at_level(logging.WARNING, logger="aiotensor"):
            cleanup[0].cancel()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert cleanup[0].cancelled()
            for round_ in range(3):
                batch = [await s.full(3, float(round_)) for _ in range(4)]
                del batch
                await drain(registry)
        assert s.stats().cleanup_failures == 1
        assert s.stats().pending == 0
        assert any("cleanup task was cancelled" in r.getMessage() for r in caplog.records)
        check_accounting(registry, backend)
    check_all_released(registry, backend)


async def test_failing_backend_release_keeps_accounting(caplog: pytest.LogCaptureFixture) -> None:
    class FlakyRelease(TrackingBackend):
        def release(self, handle: Any) -> None:
            super().release(handle)
            raise OSError("release hiccup")

    s, registry, backend = tracked_session(S.ON_SAFE_POINTS, backend=FlakyRelease())
    with caplog.at_level(logging.ERROR, logger="aiotensor"):
        async with s:
            t = await s.zeros(3)
            del t
            await s.zeros(1)  # a safe point frees the dropped buffer
            assert s.stats().freed >= 1
            check_accounting(registry, backend)
    check_all_released(registry, backend)
    assert any("releasing a buffer failed" in r.getMessage() for r in caplog.records)


# -- close under load and under cancellation -----------------------------------------------------
async def test_close_with_hundreds_of_ops_in_flight(strategy: at.ResourceCleanupStrategy) -> None:
    s, registry, backend = tracked_session(strategy)
    async with asyncio.timeout(20):
        await s.__aenter__()
        x = await s.constant([1.0, 2.0])
        tasks = [asyncio.ensure_future(s.apply(_slow, x, 0.0005)) for _ in range(300)]
        tasks += [asyncio.ensure_future(s.add(x, float(i))) for i in range(100)]
        await asyncio.sleep(0.002)  # some finish, most are queued on the pool
        await s.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    done = [r for r in results if isinstance(r, at.Tensor)]
    refused = [r for r in results if isinstance(r, at.SessionClosedError)]
    assert len(done) + len(refused) == 400, [r for r in results if not isinstance(r, at.Tensor | at.SessionClosedError)]
    for t in done:
        with pytest.raises(at.SessionClosedError):
            np.asarray(t)
    assert s.stats().in_flight == 0
    check_all_released(registry, backend)


async def test_close_from_a_cancelled_task(strategy: at.ResourceCleanupStrategy) -> None:
    s, registry, backend = tracked_session(strategy)
    await s.__aenter__()
    x = await s.constant([1.0])
    ops = [asyncio.ensure_future(s.apply(_slow, x, 0.02)) for _ in range(4)]
    await asyncio.sleep(0)
    closer = asyncio.ensure_future(s.close())
    await asyncio.sleep(0.001)
    assert not closer.done()  # close() is waiting for the in-flight kernels
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    # Documented state: closed at once, everything freed; ops still running get SessionClosedError.
    assert s.closed
    assert s.stats().live_tensors == 0
    async with asyncio.timeout(10):
        results = await asyncio.gather(*ops, return_exceptions=True)
    assert all(isinstance(r, at.Tensor | at.SessionClosedError) for r in results), results
    await s.close()  # idempotent
    check_all_released(registry, backend)


async def test_aexit_itself_cancelled(strategy: at.ResourceCleanupStrategy) -> None:
    s, registry, backend = tracked_session(strategy)
    ops: list[asyncio.Future[Any]] = []

    async def body() -> None:
        async with s:
            x = await s.constant([1.0])
            ops.extend(asyncio.ensure_future(s.apply(_slow, x, 0.02)) for _ in range(4))
            await asyncio.sleep(0)
        # __aexit__ -> close() waits for the kernels; it is cancelled there

    task = asyncio.ensure_future(body())
    async with asyncio.timeout(10):
        while not s.closed:
            await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.closed
    assert s.stats().live_tensors == 0
    async with asyncio.timeout(10):
        results = await asyncio.gather(*ops, return_exceptions=True)
    assert all(isinstance(r, at.Tensor | at.SessionClosedError) for r in results), results
    check_all_released(registry, backend)


# -- the executor goes away ---------------------------------------------------------------------
async def test_executor_shut_down_under_the_session() -> None:
    # Regression: kernels cancelled by the executor's shutdown raised a bare
    # CancelledError in callers nobody had cancelled, ending their tasks silently.
    pool = concurrent.futures.ThreadPoolExecutor(1)
    s, registry, backend = tracked_session(S.IN_BACKGROUND, backend=TrackingBackend(executor=pool))
    async with s:
        x = await s.constant([1.0])
        started, release = threading.Event(), threading.Event()

        def first(x: Any) -> Any:
            started.set()
            release.wait(5)
            return np.asarray(x) + 1

        ops = [asyncio.ensure_future(s.apply(first, x))]
        ops += [asyncio.ensure_future(s.apply(_slow, x, 0.0)) for _ in range(4)]
        async with asyncio.timeout(5):
            while not started.is_set():  # the first kernel runs, the others are queued
                await asyncio.sleep(0.001)
        pool.shutdown(wait=False, cancel_futures=True)
        release.set()
        async with asyncio.timeout(10):
            results = await asyncio.gather(*ops, return_exceptions=True)
        assert isinstance(results[0], at.Tensor)
        for r in results[1:]:
            assert isinstance(r, at.BackendError), r
            assert "executor shut down" in str(r)
        with pytest.raises(at.BackendError, match="cannot schedule new futures after shutdown"):
            await s.apply(_slow, x, 0.0)
        np.testing.assert_array_equal(await results[0].numpy(), [2.0])  # what exists stays readable
        check_accounting(registry, backend)
    check_all_released(registry, backend)


# -- finalizers racing the loop -------------------------------------------------------------------
async def test_finalizers_on_threads_and_in_gc_while_the_loop_mutates(strategy: at.ResourceCleanupStrategy) -> None:
    """Threads drop handles (directly and through cycles they collect) while the loop runs ops.

    A deadlock here would be a lock a finalizer waits on while its own thread holds
    it; the whole exchange is bounded by a timeout, so it would fail, not hang.
    """
    s, registry, backend = tracked_session(strategy)
    handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()
    stop = object()
    dropped = [0]

    def dropper(seed: int) -> None:
        n = 0
        while True:
            item = handoff.get()
            if item is stop:
                return
            n += 1
            if (n + seed) % 3 == 0:
                cycle: list[Any] = [item]
                cycle.append(cycle)
                del item, cycle
                if n % 4 == 0:
                    gc.collect(0)  # finalizers run inside GC, on this thread (the cycle is young)
            else:
                del item
            dropped[0] += 1

    threads = [threading.Thread(target=dropper, args=(i,), daemon=True) for i in range(3)]
    for th in threads:
        th.start()
    async with s:
        base = await s.arange(4.0)
        async with asyncio.timeout(30):
            for i in range(600):
                t = await s.add(base, float(i))
                if i % 50 == 0:
                    np.testing.assert_array_equal(await t.numpy(), np.arange(4.0) + i)
                handoff.put(t)
                del t
                if i % 100 == 0:
                    gc.collect()  # and on the loop thread, while threads drop
                    check_accounting(registry, backend)
            for _ in threads:
                handoff.put(stop)
            while any(th.is_alive() for th in threads):
                await asyncio.sleep(0.001)
        gc.collect()
        if strategy is S.IN_BACKGROUND:
            await settle(s)
            assert s.stats().live_tensors == 1
        elif strategy is S.ON_SAFE_POINTS:
            await s.zeros(0)
            assert s.stats().live_tensors <= 2  # base, and the zeros(0) result until the next safe point
        else:
            assert s.stats().live_tensors == 601
            assert s.stats().pending == 600
        check_accounting(registry, backend)
    assert dropped[0] == 600
    check_all_released(registry, backend)
