"""Issue 14: hostile cases that once hung the runtime or were misread, one regression test each."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import pickle
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._results import one


def _stop(x: Any) -> Any:
    return next(iter(()))  # raises StopIteration


def _cancelled(x: Any) -> Any:
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.cancel()
    return fut.result()  # raises concurrent.futures.CancelledError, an ordinary Exception


@pytest.mark.parametrize("kernel", [_stop, _cancelled], ids=["StopIteration", "concurrent-CancelledError"])
async def test_case_1_and_8a_every_kernel_exception_reaches_its_caller(
    strategy: at.ResourceCleanupStrategy, kernel: Any
) -> None:
    async with asyncio.timeout(5), at.AsyncEagerSession(cleanup=strategy) as s:
        x = await s.constant([1.0])
        with pytest.raises(at.KernelError) as info:
            await s.apply(kernel, x)
        assert type(info.value.__cause__) in (StopIteration, concurrent.futures.CancelledError)

        @at.function
        def fused(ops: at.FusedOps, v: Any) -> Any:
            return kernel(v)

        with pytest.raises(at.KernelError):
            await fused(x)
        assert s.stats().in_flight == 0
        del x


async def test_case_1_with_an_executor_of_ones_own() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        async with asyncio.timeout(5), at.AsyncEagerSession(executor=pool) as s:
            x = await s.constant([1.0])
            with pytest.raises(at.KernelError):
                await s.apply(_stop, x)
            del x


async def test_case_2_a_tensor_cannot_be_copied_or_pickled(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1.0])
    with pytest.raises(TypeError, match="second owner"):
        copy.copy(t)
    with pytest.raises(TypeError):
        copy.deepcopy(t)
    with pytest.raises(TypeError, match=r"await t.numpy\(\)"):  # case 8b
        pickle.dumps(t)
    assert s.stats().pending == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda s: s.constant(["1", "2"], dtype="float32"),
        lambda s: s.constant("3", dtype="float64"),
        lambda s: s.constant(None, dtype="float64"),
        lambda s: s.constant([None, 1.0], dtype="float64"),
        lambda s: s.constant(b"7", dtype="int64"),
        lambda s: s.constant(np.array([None, 1.0], dtype=object), dtype="float64"),
        lambda s: s.constant(np.array(["1.5"]), dtype="float64"),
        lambda s: s.full((2,), np.str_("1"), dtype="float32"),
    ],
    ids=["str-list", "str", "None", "None-in-list", "bytes", "object-array", "str-array", "np.str_-fill"],
)
async def test_case_3_creation_ops_never_parse_strings_or_none(s: at.AsyncEagerSession, make: Any) -> None:
    with pytest.raises(at.InvalidArgumentError):
        await make(s)
    assert s.stats().live_tensors == 0


@pytest.mark.parametrize(
    "strategy", [at.ResourceCleanupStrategy.IN_BACKGROUND, at.ResourceCleanupStrategy.ON_SAFE_POINTS]
)
async def test_case_4_fused_functions_and_expressions_see_reclaimed_memory(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    config = at.SessionConfig(memory_limit=100_000)
    async with at.AsyncEagerSession(cleanup=strategy, config=config) as s:
        small = await s.zeros(1000)  # 8,000 bytes
        big = await s.zeros(11_000)  # 88,000 bytes: the session is full
        del big  # pending, not freed yet under either strategy until a reclaim

        @at.function
        def f(ops: at.FusedOps, v: Any) -> Any:
            return (v + 1.0) * 2.0

        y = one(await f(small))
        np.testing.assert_array_equal(await y.numpy(), np.full(1000, 2.0))
        z = await ((small + 1.0) * 2.0)
        np.testing.assert_array_equal(await z.numpy(), np.full(1000, 2.0))
        del small, y, z


async def test_case_5_closing_a_session_that_owns_its_pool_does_not_cancel_a_fetch() -> None:
    started, release = threading.Event(), threading.Event()

    def block(v: Any) -> Any:
        started.set()
        release.wait(5)
        return v

    s = at.AsyncEagerSession(config=at.SessionConfig(max_workers=1))
    async with asyncio.timeout(10):
        await s.__aenter__()
        big = await s.zeros(1 << 18)  # 2 MiB: copied on the pool
        blocked = asyncio.create_task(s.apply(block, np.zeros(1)))
        await asyncio.to_thread(started.wait, 5)
        blocked.cancel()
        fetch = asyncio.create_task(big.numpy())
        await asyncio.sleep(0.01)
        closing = asyncio.create_task(s.close())
        await asyncio.sleep(0.01)
        release.set()
        await closing
        try:
            value = await fetch
        except at.SessionClosedError:
            pass  # also acceptable: a clear error, not a bare cancellation
        else:
            assert value.shape == (1 << 18,)
        with pytest.raises(asyncio.CancelledError):
            await blocked


async def test_case_6_a_result_check_counts_what_is_reserved() -> None:
    started, release = threading.Event(), threading.Event()

    def slow_200_bytes(v: Any) -> Any:
        started.set()
        release.wait(5)
        return np.zeros(25)  # 200 bytes

    config = at.SessionConfig(memory_limit=1000, max_workers=1)
    async with asyncio.timeout(10), at.AsyncEagerSession(config=config) as s:
        pending = asyncio.create_task(s.apply(slow_200_bytes, np.zeros(1)))
        await asyncio.to_thread(started.wait, 5)
        zeros = asyncio.create_task(s.zeros(112))  # reserves 896 bytes before its kernel queues
        await asyncio.sleep(0.05)
        release.set()
        with pytest.raises(at.ResourceExhaustedError, match="reserved"):
            await pending
        z = await zeros
        assert z.nbytes == 896
        del z


async def test_case_7_a_request_that_can_never_be_served_fails_at_once() -> None:
    started, release = threading.Event(), threading.Event()

    def block(v: Any) -> Any:
        started.set()
        release.wait(5)
        return v

    config = at.SessionConfig(memory_limit=1000, memory_wait=30.0, max_workers=1, inline_threshold_us=0)
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE, config=config) as s:
        blocker = asyncio.create_task(s.apply(block, np.zeros(1)))  # holds the only worker
        await asyncio.to_thread(started.wait, 5)
        first = asyncio.create_task(s.zeros(100))  # 800 bytes reserved, queued behind it
        await asyncio.sleep(0.01)
        second = asyncio.create_task(s.zeros(50))  # 400 more: waits, since 800 are only reserved
        await asyncio.sleep(0.01)
        assert not second.done()
        loop = asyncio.get_running_loop()
        start = loop.time()
        release.set()  # the 800 bytes become live: nothing can free them before close
        with pytest.raises(at.ResourceExhaustedError, match="frees nothing before close"):
            async with asyncio.timeout(5):
                await second
        assert loop.time() - start < 5  # at once, not at the end of memory_wait
        t, b = await first, await blocker
        del t, b


async def test_case_8c_run_of_cyclic_or_deep_structures_is_invalid(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1.0])
    cyclic: list[Any] = [t]
    cyclic.append(cyclic)
    with pytest.raises(at.InvalidArgumentError, match="contains itself"):
        await s.run(cyclic)
    deep: list[Any] = [t]
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(at.InvalidArgumentError, match="nest at most"):
        await s.run(deep)


_REPL_EXIT = textwrap.dedent(
    """
import asyncio, gc, warnings
import aiotensor as at

loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)


async def first() -> None:
    global s1
    s1 = at.InteractiveSession()
    t = await at.constant([1.0, 2.0])
    del t
    gc.collect()
    await asyncio.sleep(0.01)  # the cleanup task is spawned and frees the buffer


async def second() -> None:
    global s2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "another InteractiveSession is open": documented
        s2 = at.InteractiveSession()
    t = await at.constant([3.0])
    del t
    gc.collect()
    await asyncio.sleep(0.01)


loop.run_until_complete(first())
loop.run_until_complete(second())
# like `python -m asyncio`: the loop is left open, nothing is closed, the interpreter exits
    """
)


def test_case_9_open_interactive_sessions_end_cleanly_at_interpreter_exit() -> None:
    # The shape of a `python -m asyncio` REPL: the loop is never closed, nothing is
    # closed, and a second InteractiveSession replaced the first.
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", _REPL_EXIT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Task was destroyed but it is pending" not in done.stderr
    assert "ResourceWarning" not in done.stderr
