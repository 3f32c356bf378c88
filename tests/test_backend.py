"""The local backend and the executor seam, driven directly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends._base import default_executor
from aiotensor._backends._pool import WorkerPool
from aiotensor._kernels import KernelResult


def test_the_default_pool_is_one_per_process_and_sized_to_the_cores() -> None:
    pool = default_executor()
    assert pool is default_executor()
    assert at.LocalBackend().executor is pool
    assert pool._max_workers >= 1


async def test_submit_fetch_peek_release() -> None:
    backend = at.LocalBackend()
    assert backend.devices() == ["/cpu:0"]
    result = await backend.submit(np.add, (np.ones(3), 2.0), {}, device="/cpu:0")
    (buf,) = result.buffers
    assert (buf.shape, buf.dtype, buf.nbytes) == ((3,), np.dtype(np.float64), 24)
    view = backend.peek(buf.handle)
    assert view is not None
    assert not view.flags.writeable
    (copy,) = await backend.fetch([buf.handle])
    assert copy.flags.writeable
    np.testing.assert_array_equal(copy, [3.0, 3.0, 3.0])
    backend.release(buf.handle)


async def test_large_fetches_copy_off_the_loop_and_match() -> None:
    backend = at.LocalBackend()
    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: copied on the pool
    result = await backend.submit(np.negative, (big,), {}, device="/cpu:0")
    (copy,) = await backend.fetch([result.buffers[0].handle])
    np.testing.assert_array_equal(copy, -big)


async def test_abandon_before_start_cancels_the_kernel() -> None:
    gate = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        backend = at.LocalBackend(pool)
        ran: list[str] = []

        def block() -> np.ndarray[Any, Any]:
            gate.wait(5)
            return np.zeros(1)

        def queued_kernel() -> np.ndarray[Any, Any]:
            ran.append("queued")
            return np.ones(3)

        blocker = backend.submit(block, (), {}, device="/cpu:0")  # occupies the only worker
        queued = backend.submit(queued_kernel, (), {}, device="/cpu:0")
        adopted: list[KernelResult] = []
        queued.abandon(adopted.append)
        gate.set()
        await blocker
        pool.submit(lambda: None).result()  # anything queued after it has run by now
        await asyncio.sleep(0.01)
        assert ran == []
        assert adopted == []


async def test_abandon_after_start_hands_the_result_to_the_loop() -> None:
    started, gate = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()
    adopted: list[tuple[KernelResult, int]] = []

    def kernel() -> np.ndarray[Any, Any]:
        started.set()
        gate.wait(5)
        return np.zeros(2)

    backend = at.LocalBackend()
    pending = backend.submit(kernel, (), {}, device="/cpu:0")
    await asyncio.to_thread(started.wait, 5)
    pending.abandon(lambda result: adopted.append((result, threading.get_ident())))
    gate.set()
    async with asyncio.timeout(5):
        while not adopted:
            await asyncio.sleep(0.001)
    result, thread = adopted[0]
    assert thread == loop_thread  # adopt runs on the loop thread, where the registry lives
    assert result.buffers[0].shape == (2,)


async def test_inline_executor_runs_on_the_calling_thread() -> None:
    seen: list[int] = []

    def kernel() -> np.ndarray[Any, Any]:
        seen.append(threading.get_ident())
        return np.ones(1)

    backend = at.LocalBackend(at.InlineExecutor())
    await backend.submit(kernel, (), {}, device="/cpu:0")
    assert seen == [threading.get_ident()]
    failing = at.InlineExecutor().submit(int, "x")
    with pytest.raises(ValueError, match="invalid literal"):
        failing.result()


async def test_an_owned_executor_is_shut_down_by_aclose() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    await at.LocalBackend(pool, owns_executor=True).aclose()
    with pytest.raises(RuntimeError):
        pool.submit(print)
    other = concurrent.futures.ThreadPoolExecutor(1)
    await at.LocalBackend(other).aclose()  # not owned: left running
    assert other.submit(lambda: 2).result() == 2
    other.shutdown()


async def test_a_cancelled_large_fetch_drops_its_copy_if_it_has_not_started() -> None:
    pool = WorkerPool(1)
    backend = at.LocalBackend(pool)
    started, release = threading.Event(), threading.Event()

    def occupy() -> None:  # occupies the only worker
        started.set()
        release.wait(5)

    try:
        pool.spawn(occupy)
        assert await asyncio.to_thread(started.wait, 5)
        big = np.zeros(1 << 18)  # 2 MiB: copied on the pool
        fetching = asyncio.ensure_future(backend.fetch([big]))
        await asyncio.sleep(0.01)
        (job,) = _queued(pool)
        fetching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetching
        assert job.token == []  # dropped: the worker will skip it
        assert job.fn is None  # and it let go of the handles already
    finally:
        release.set()
        pool.shutdown()


def _queued(pool: WorkerPool) -> list[Any]:
    # The pool's queue, read without taking anything off it for good.
    items = []
    while not pool._queue.empty():
        items.append(pool._queue.get_nowait())
    for item in items:
        pool._queue.put(item)
    return items
