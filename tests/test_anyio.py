"""Cancellation from anyio cancel scopes, in the middle of ops, on asyncio and uvloop.

anyio's scopes are level-triggered: once cancelled, every await inside the scope is
cancelled again, including the ones ``close()`` makes on the way out. Each test checks
that nothing leaks (``assert_no_leaks`` against a baseline, then an empty session after
close) and that the session still computes the right numbers afterwards.

The sessions get a one-worker pool of their own: kernels run in submission order, so
one more op after a cancellation is a barrier behind every abandoned kernel.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import aiotensor as at
from aiotensor.testing import assert_no_leaks

N = 64


class Gate:
    """A kernel that blocks its worker until released, so a test can cancel it mid-run."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def kernel(self, x: Any) -> Any:
        self.started.set()
        if not self.release.wait(10):
            raise RuntimeError("the test never released the gate")
        return x * 2.0

    async def wait_started(self) -> None:
        assert await anyio.to_thread.run_sync(self.started.wait, 10)


@pytest.fixture
async def own_pool_session(strategy: at.ResourceCleanupStrategy) -> AsyncIterator[at.AsyncEagerSession]:
    async with at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(max_workers=1)) as s:
        yield s
    assert s.stats().live_tensors == 0
    assert s.stats().live_bytes == 0


async def barrier(s: at.AsyncEagerSession) -> None:
    """Wait until every kernel submitted before has finished and been adopted."""
    await s.apply(np.copy, np.zeros(1))


async def check_clean_and_usable(s: at.AsyncEagerSession, x: at.Tensor, baseline: at.SessionStats) -> None:
    await barrier(s)
    await assert_no_leaks(s, baseline)
    if s.cleanup is not at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
        assert s.stats().live_bytes == baseline.live_bytes  # the abandoned result was freed
    y = await s.add(await s.multiply(x, 3.0), 1.0)
    np.testing.assert_array_equal(await y.numpy(), np.arange(N) * 3.0 + 1.0)


async def test_move_on_after_expiring_mid_kernel(own_pool_session: at.AsyncEagerSession) -> None:
    s = own_pool_session
    x = await s.constant(np.arange(N, dtype=np.float64), name="x")
    baseline = s.stats()
    gate = Gate()
    scope = anyio.move_on_after(60)

    async def expire_once_running() -> None:
        await gate.wait_started()
        scope.deadline = anyio.current_time()  # the deadline passes while the kernel runs

    async with anyio.create_task_group() as tg:
        tg.start_soon(expire_once_running)
        with scope:
            await s.apply(gate.kernel, x)
            pytest.fail("the op should have been cancelled")
    assert scope.cancelled_caught
    gate.release.set()
    await check_clean_and_usable(s, x, baseline)


async def test_fail_after_mid_chain(own_pool_session: at.AsyncEagerSession) -> None:
    s = own_pool_session
    x = await s.constant(np.arange(N, dtype=np.float64), name="x")
    baseline = s.stats()
    gate = Gate()
    scopes: list[anyio.CancelScope] = []

    async def chain() -> None:
        with anyio.fail_after(60) as scope:
            scopes.append(scope)
            y = await s.add(x, 1.0)
            z = await s.apply(gate.kernel, y)
            assert isinstance(z, at.Tensor)
            await s.add(z, 1.0)

    async def expire_once_running() -> None:
        await gate.wait_started()
        scopes[0].deadline = anyio.current_time()

    async with anyio.create_task_group() as tg:
        tg.start_soon(expire_once_running)
        with pytest.raises(TimeoutError):
            await chain()
    gate.release.set()
    await check_clean_and_usable(s, x, baseline)


async def test_task_group_cancelled_like_a_client_disconnect(own_pool_session: at.AsyncEagerSession) -> None:
    # Starlette runs the handler next to a task listening for http.disconnect, and
    # cancels the task group when it comes; here many handlers' ops are in flight.
    s = own_pool_session
    x = await s.constant(np.arange(N, dtype=np.float64), name="x")
    baseline = s.stats()
    gate = Gate()
    finished: list[int] = []

    async def handler(i: int) -> None:
        y: Any = x
        for _ in range(20):
            y = await s.apply(np.add, y, 1.0)  # apply always goes to the pool, never inline
        finished.append(i)

    async def gated() -> None:
        await s.apply(gate.kernel, x)

    async def disconnect(tg: anyio.abc.TaskGroup) -> None:
        await gate.wait_started()
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(gated)  # holds the only worker: every handler is mid-op when cancelled
        for i in range(8):
            tg.start_soon(handler, i)
        tg.start_soon(disconnect, tg)
    assert tg.cancel_scope.cancel_called
    assert finished == []
    gate.release.set()
    await check_clean_and_usable(s, x, baseline)


async def test_closing_inside_a_cancelled_scope_frees_everything(strategy: at.ResourceCleanupStrategy) -> None:
    gate = Gate()
    holder: list[at.Tensor] = []
    with anyio.CancelScope() as scope:
        async with at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(max_workers=1)) as s:
            x = await s.constant(np.ones(N), name="x")
            holder.append(x)
            dropped = await s.add(x, 1.0)
            del dropped
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.apply, gate.kernel, x)
                await gate.wait_started()
                scope.cancel()  # level-triggered from here on: __aexit__ and close() run cancelled
                await anyio.sleep(math.inf)
    assert scope.cancelled_caught
    gate.release.set()
    assert s.closed
    stats = s.stats()
    assert stats.live_tensors == 0
    assert stats.live_bytes == 0
    assert stats.pending == 0
    with pytest.raises(at.SessionClosedError):
        await holder[0].numpy()
    # the session's own pool was shut down too, not left with a thread behind
    backend = s.backend
    assert isinstance(backend, at.LocalBackend)
    with pytest.raises(RuntimeError, match="shutdown"):
        backend.executor.submit(print)


class _SlowStartBackend(at.LocalBackend):
    """A local backend whose start() suspends, as a remote backend's connect would."""

    async def start(self) -> None:
        await anyio.lowlevel.checkpoint()


async def test_cancelled_while_the_session_opens(strategy: at.ResourceCleanupStrategy) -> None:
    s = at.AsyncEagerSession(cleanup=strategy, backend=_SlowStartBackend())
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with s:
            await s.ones((3,))
    assert scope.cancelled_caught
    # __aexit__ never ran (__aenter__ raised): the session closes itself in a task of its own
    with anyio.fail_after(5):
        while not s.closed:
            await anyio.sleep(0.001)
    await s.close()
    assert s.stats().live_tensors == 0


def test_trio_is_refused_with_a_clear_error() -> None:
    trio = pytest.importorskip("trio", reason="trio is not a dependency; install it to check the refusal")

    async def main() -> None:
        async with at.AsyncEagerSession() as s:
            await s.ones((2,))

    with pytest.raises(at.WrongEventLoopError, match="trio is not supported"):
        anyio.run(main, backend="trio")
    assert trio is not None


def test_no_running_asyncio_loop_is_a_clear_error() -> None:
    # What trio hits, without trio: the session's coroutine driven by something that is not asyncio.
    s = at.AsyncEagerSession()
    coro = s.__aenter__()
    with pytest.raises(at.WrongEventLoopError, match="needs a running asyncio event loop"):
        coro.send(None)
    assert not s.closed  # nothing was opened: the session can still be used on a loop


async def test_cancelled_scope_around_a_local_session(strategy: at.ResourceCleanupStrategy) -> None:
    # Opening a local session does not suspend, so the cancellation lands wherever the
    # block first suspends (or nowhere): either way the session ends closed and empty.
    s = at.AsyncEagerSession(cleanup=strategy)
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with s:
            t = await s.ones((3,))
            await anyio.lowlevel.checkpoint()
            del t
    assert scope.cancelled_caught
    assert s.closed
    assert s.stats().live_tensors == 0
