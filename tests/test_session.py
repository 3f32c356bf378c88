"""AsyncEagerSession: lifecycle, close semantics, loop binding, stats, run, defaults and devices."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from tests._moved_loop import NEW_LOOPS, moved_session

IB = at.ResourceCleanupStrategy.IN_BACKGROUND


def test_constructor_needs_no_running_loop() -> None:
    s = at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS)
    assert not s.closed
    assert s.cleanup is at.ResourceCleanupStrategy.ON_SAFE_POINTS
    assert s.config == at.SessionConfig()
    assert s.list_devices() == ["/cpu:0"]


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(at.InvalidArgumentError, match="ResourceCleanupStrategy"):
        at.AsyncEagerSession(cleanup="IN_BACKGROUND")  # type: ignore[arg-type]
    with pytest.raises(at.InvalidArgumentError, match="SessionConfig"):
        at.AsyncEagerSession(config={"max_workers": 2})  # type: ignore[arg-type]
    with pytest.raises(at.InvalidArgumentError, match="not both"):
        at.AsyncEagerSession(executor=at.InlineExecutor(), backend=at.LocalBackend())


async def test_machinery_starts_lazily_on_first_use_without_async_with(strategy: at.ResourceCleanupStrategy) -> None:
    s = at.AsyncEagerSession(cleanup=strategy)
    t = await s.constant([1, 2, 3])
    np.testing.assert_array_equal(await t.numpy(), [1, 2, 3])
    await s.close()
    assert s.closed
    assert s.stats().live_tensors == 0


async def test_close_is_idempotent_and_closed_sessions_refuse_everything(session: at.AsyncEagerSession) -> None:
    t = await session.ones(3)
    await session.close()
    await session.close()
    assert session.closed
    with pytest.raises(at.SessionClosedError):
        await session.ones(3)
    with pytest.raises(at.SessionClosedError):
        await t.numpy()
    with pytest.raises(at.SessionClosedError):
        await (t + 1)
    with pytest.raises(at.SessionClosedError):
        np.asarray(t)
    with pytest.raises(at.SessionClosedError):
        async with session:
            pass


async def test_closing_an_unused_session_is_fine() -> None:
    s = at.AsyncEagerSession()
    await s.close()
    assert s.closed
    with pytest.raises(at.SessionClosedError):
        await s.zeros(1)


async def test_aexit_frees_everything_and_reraises_on_error(strategy: at.ResourceCleanupStrategy) -> None:
    s = at.AsyncEagerSession(cleanup=strategy)
    with pytest.raises(KeyError, match="boom"):
        async with s:
            await s.zeros(100)
            raise KeyError("boom")
    assert s.closed
    assert s.stats().live_bytes == 0


async def test_aexit_frees_everything_when_the_block_is_cancelled(strategy: at.ResourceCleanupStrategy) -> None:
    s = at.AsyncEagerSession(cleanup=strategy)
    entered = asyncio.Event()

    async def body() -> None:
        async with s:
            await s.zeros(100)
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.closed
    assert s.stats().live_tensors == 0


async def test_stats_snapshot_is_immutable_and_consistent(session: at.AsyncEagerSession) -> None:
    a = await session.zeros(10, dtype="float32")
    b = await session.ones((2, 5))
    stats = session.stats()
    assert stats.live_tensors == 2
    assert stats.live_bytes == a.nbytes + b.nbytes == 40 + 80
    assert stats.peak_bytes >= stats.live_bytes
    assert stats.allocated - stats.freed == stats.live_tensors
    with pytest.raises(AttributeError):
        stats.live_bytes = 0  # type: ignore[misc]
    del a, b


async def test_run_keeps_the_structure(s: at.AsyncEagerSession) -> None:
    a = await s.constant([1.0, 2.0])
    b = await s.constant(3)
    out = await s.run({"a": a, "pair": (a, [b])})
    assert set(out) == {"a", "pair"}
    np.testing.assert_array_equal(out["a"], [1.0, 2.0])
    assert isinstance(out["pair"], tuple)
    assert isinstance(out["pair"][1], list)
    assert out["pair"][1][0] == 3
    single = await s.run(a)
    assert isinstance(single, np.ndarray)
    with pytest.raises(at.InvalidArgumentError, match="run: fetches"):
        await s.run([a, 3])


async def test_as_default_is_per_context() -> None:
    async with at.AsyncEagerSession() as s1, at.AsyncEagerSession() as s2:
        seen: dict[str, object] = {}
        barrier = asyncio.Event()

        async def use(name: str, s: at.AsyncEagerSession) -> None:
            with s.as_default():
                await barrier.wait()  # both defaults are set at the same time
                t = await at.zeros(2)
                seen[name] = t.session

        tasks = [asyncio.create_task(use("one", s1)), asyncio.create_task(use("two", s2))]
        await asyncio.sleep(0)
        barrier.set()
        await asyncio.gather(*tasks)
        assert seen == {"one": s1, "two": s2}
        assert at.get_default_session() is None


async def test_devices_and_placement(caplog: pytest.LogCaptureFixture) -> None:
    async with at.AsyncEagerSession() as s:
        assert s.list_devices() == ["/cpu:0"]
        with s.device("CPU:0"):
            t = await s.zeros(2)
        assert t.device == "/cpu:0"
        with s.device("/gpu:0"), pytest.raises(at.InvalidDeviceError, match="allow_soft_placement"):
            await s.zeros(2)
        with pytest.raises(at.InvalidDeviceError, match="malformed"):
            s.device("not a device!")
        assert s.stats().live_tensors == 1

    config = at.SessionConfig(allow_soft_placement=True, log_device_placement=True)
    caplog.set_level(logging.INFO, logger="aiotensor")
    async with at.AsyncEagerSession(config=config) as s:
        with s.device("/gpu:1"):
            t = await s.ones(2, name="w")
        assert t.device == "/cpu:0"
    assert "ones: w on /cpu:0" in caplog.text


async def test_session_is_bound_to_its_loop() -> None:
    s = at.AsyncEagerSession()
    await s.zeros(1)

    def other_loop() -> None:
        async def use() -> None:
            await s.zeros(1)

        asyncio.run(use())

    with pytest.raises(at.WrongEventLoopError, match="bound to the event loop"):
        await asyncio.to_thread(other_loop)
    await s.close()


@pytest.mark.parametrize("new_loop", list(NEW_LOOPS.values()), ids=list(NEW_LOOPS))
def test_a_loop_moved_to_another_thread_keeps_its_session_from_the_thread_it_left(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    # A session's loop first ran in this thread, then runs in another one; this thread
    # runs a loop of its own: reading the session's tensor from it is the wrong loop,
    # though this thread opened the session and its loop is running (elsewhere).
    with moved_session(new_loop) as (s, t, loop):

        async def read() -> Any:
            return await t.numpy()

        with pytest.raises(at.WrongEventLoopError, match="bound to the event loop"):
            asyncio.run(read())
        # On its own loop, now in the other thread, the tensor reads as it was.
        value = asyncio.run_coroutine_threadsafe(read(), loop).result(10)
        np.testing.assert_array_equal(value, np.arange(3.0))
        asyncio.run_coroutine_threadsafe(s.close(), loop).result(10)


async def test_close_settles_in_flight_ops(strategy: at.ResourceCleanupStrategy) -> None:
    release = threading.Event()
    started = threading.Barrier(3)

    def slow(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        started.wait(5)
        release.wait(5)
        return x * 2

    s = at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(max_workers=2))
    await s.zeros(1)
    ops = [asyncio.create_task(s.apply(slow, np.ones(4))) for _ in range(2)]
    await asyncio.to_thread(started.wait, 5)
    closing = asyncio.create_task(s.close())
    await asyncio.sleep(0.01)
    assert not closing.done()  # close waits for kernels whose callers still await them
    assert s.closed
    with pytest.raises(at.SessionClosedError):
        await s.zeros(1)
    release.set()
    await closing
    for op in ops:
        with pytest.raises(at.SessionClosedError, match="closed while the op ran"):
            await op
    assert s.stats().live_tensors == 0


async def test_cancelled_close_still_frees_everything() -> None:
    release = threading.Event()

    def slow(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        release.wait(5)
        return x

    s = at.AsyncEagerSession(config=at.SessionConfig(max_workers=1))
    await s.zeros(1000)
    op = asyncio.create_task(s.apply(slow, np.ones(2)))
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(s.close())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert s.closed
    assert s.stats().live_bytes == 0
    release.set()
    with pytest.raises(at.SessionClosedError):
        await op


async def test_own_pool_and_custom_executor() -> None:
    names: list[str] = []

    def where(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        names.append(threading.current_thread().name)
        return x

    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=1)) as s:
        await s.apply(where, np.ones(1))
        pool = s.backend.executor  # type: ignore[attr-defined]
    assert names[-1].startswith("aiotensor")
    with pytest.raises(RuntimeError):
        pool.submit(print)  # shut down with the session that owned it

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mine") as mine:
        async with at.AsyncEagerSession(executor=mine) as s:
            await s.apply(where, np.ones(1))
        assert names[-1].startswith("mine")
        assert mine.submit(lambda: 1).result() == 1  # not shut down: the caller owns it

    async with at.AsyncEagerSession(executor=at.InlineExecutor()) as s:
        await s.apply(where, np.ones(1))
    assert names[-1] == threading.current_thread().name


async def test_shut_down_executor_gives_backend_error() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    async with at.AsyncEagerSession(executor=pool) as s:
        kept = await s.zeros(1)
        pool.shutdown()
        with pytest.raises(at.BackendError, match="cannot run kernels"):
            await s.zeros(1)
        assert s.stats().allocated == 1  # the failed op allocated nothing
        del kept


request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


async def test_kernels_see_the_callers_context_variables(s: at.AsyncEagerSession) -> None:
    def tag(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.full(x.shape, len(request_id.get()))

    request_id.set("abcd")
    t = await s.apply(tag, np.zeros(2))
    assert isinstance(t, at.Tensor)
    np.testing.assert_array_equal(await t.numpy(), [4, 4])


async def test_child_session_reads_parent_tensors_without_copying() -> None:
    async with at.AsyncEagerSession() as app:
        weights = await app.random_normal((4, 4), seed=0)
        allocated = app.stats().allocated
        async with at.AsyncEagerSession(parent=app) as request:
            y = await request.matmul(weights, weights)
            assert y.session is request
            assert request._engine.buffer(weights, "read") is app._engine.buffer(weights, "read")  # the same buffer
            expected = await weights.numpy() @ await weights.numpy()
            np.testing.assert_allclose(await y.numpy(), expected)
        assert app.stats().allocated == allocated  # nothing was copied into the parent
        async with at.AsyncEagerSession() as stranger:
            with pytest.raises(at.InvalidArgumentError, match="another session"):
                await stranger.add(weights, 1)
        with pytest.raises(at.InvalidArgumentError, match="parent"):
            at.AsyncEagerSession(parent=app, executor=at.InlineExecutor())


@pytest.mark.slow
async def test_big_kernels_do_not_stall_the_loop() -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(0.001)
            ticks += 1

    async with at.AsyncEagerSession() as s:
        a = await s.random_uniform((1800, 1800), dtype="float32", seed=0)
        tick_task = asyncio.create_task(ticker())
        await asyncio.sleep(0.005)
        before = ticks
        products = await asyncio.gather(*(s.matmul(a, a) for _ in range(4)))
        during = ticks - before
        stop.set()
        await tick_task
        ref = np.asarray(a)[:8] @ np.asarray(a)
        np.testing.assert_allclose(np.asarray(products[0])[:8], ref, rtol=1e-4)
    # Had the kernels run on the loop thread the ticker could not have ticked at all.
    assert during >= 3, during


def test_asyncio_run_returns_promptly_with_an_unclosed_session() -> None:
    script = textwrap.dedent(
        """
        import asyncio, aiotensor as at
        s = None
        async def main():
            global s
            s = at.AsyncEagerSession()
            await s.zeros(10)
        asyncio.run(main())
        print("returned")
        """
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "returned" in proc.stdout
    assert "Task was destroyed" not in proc.stderr
    assert time.monotonic() - start < 30


async def test_memory_limit_reclaims_pending_then_raises(strategy: at.ResourceCleanupStrategy) -> None:
    config = at.SessionConfig(memory_limit=1000)
    async with at.AsyncEagerSession(cleanup=strategy, config=config) as s:
        keep = await s.zeros(50)  # 400 bytes
        dropped = await s.zeros(50)
        del dropped  # 400 bytes pending
        if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
            with pytest.raises(at.ResourceExhaustedError, match=r"requested 400 bytes with 800 bytes live"):
                await s.zeros(50)
            assert s.stats().live_bytes == 800  # nothing was reclaimed, nothing allocated
        else:
            more = await s.zeros(50)  # fits once the pending buffer is reclaimed
            assert s.stats().live_bytes <= 800
            del more
        with pytest.raises(at.ResourceExhaustedError, match=r"memory_limit=1000"):
            await s.zeros(200)
        # ops whose output size is only known afterwards are checked after the kernel
        with pytest.raises(at.ResourceExhaustedError, match=r"result of 1600 bytes"):
            await s.broadcast_to(keep, (4, 50))
        np.testing.assert_array_equal(await keep.numpy(), np.zeros(50))  # still usable


async def test_absurd_requests_fail_before_any_allocation(s: at.AsyncEagerSession) -> None:
    with pytest.raises(at.ResourceExhaustedError, match="more than this machine"):
        await s.zeros((10**8, 10**7))
    with pytest.raises(at.InvalidArgumentError, match="negative"):
        await s.ones((3, -1))
    assert s.stats().allocated == 0


async def test_a_closed_session_is_freed_without_the_garbage_collector() -> None:
    # A web service closes one child session per request: freed by reference counting
    # once closed and dropped, not left in a cycle for a garbage collection.
    async with at.AsyncEagerSession() as app:
        w = await app.constant(np.arange(4.0))
        gc.disable()
        try:
            s = at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS, parent=app)
            x = await s.add(np.ones((2, 4)), w)
            assert x.session is s
            np.testing.assert_array_equal(await x.numpy(), np.ones((2, 4)) + np.arange(4.0))
            await s.close()
            assert x.session is s  # still there while someone holds the session
            gone = weakref.ref(s)
            del s
            assert gone() is None
            with pytest.raises(at.SessionClosedError):
                x.session  # noqa: B018  (closed and dropped: no session to name)
            with pytest.raises(at.SessionClosedError):
                await x.numpy()
        finally:
            gc.enable()


async def test_an_open_session_stays_alive_while_its_tensors_do() -> None:
    s = at.AsyncEagerSession()
    x = await s.constant(np.arange(3.0))
    gone = weakref.ref(s)
    del s
    gc.collect()
    assert gone() is not None  # the tensor's engine holds its open session
    assert x.session is gone()
    await x.session.close()
