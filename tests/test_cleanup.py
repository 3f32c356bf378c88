"""The three cleanup strategies: when dropped buffers are freed, and the seeds' n x m loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._registry import Registry

from .conftest import settle

IB = at.ResourceCleanupStrategy.IN_BACKGROUND
SP = at.ResourceCleanupStrategy.ON_SAFE_POINTS
SC = at.ResourceCleanupStrategy.ON_SESSION_CLOSE


def _hook_armed(registry: Registry) -> bool:
    return registry.hook_armed  # (read through a call: mypy would narrow the attribute)


def _cleanup_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "aiotensor-cleanup" and not t.done()]


async def test_in_background_frees_a_drop_without_further_ops() -> None:
    async with at.AsyncEagerSession(cleanup=IB) as s:
        t = await s.zeros(1000)
        assert s.stats().live_tensors == 1
        del t
        await settle(s)  # no op runs: only the background task can free it
        stats = s.stats()
        assert (stats.live_tensors, stats.live_bytes, stats.freed) == (0, 0, 1)


async def test_in_background_frees_a_drop_from_another_thread() -> None:
    async with at.AsyncEagerSession(cleanup=IB) as s:
        holder = [await s.ones(10)]
        worker = threading.Thread(target=holder.clear)  # the last reference dies on that thread
        worker.start()
        worker.join()
        await settle(s)
        assert s.stats().live_tensors == 0


async def test_in_background_a_burst_of_drops_calls_the_hook_once_and_each_burst_is_freed() -> None:
    # While a wake-up is scheduled the registry queues drops without calling the hook;
    # the wake-up re-arms it, so the next burst schedules one again and is freed too.
    async with at.AsyncEagerSession(cleanup=IB) as s:
        registry = s._engine.registry
        hook = registry.on_drop
        assert hook is not None
        calls = {"n": 0}

        def counting() -> None:
            calls["n"] += 1
            hook()

        registry.on_drop = counting
        for burst in range(3):
            held = [await s.zeros(4) for _ in range(5)]
            calls["n"] = 0
            held.clear()  # five drops in one go, no op in between
            assert calls["n"] == 1, burst
            assert _hook_armed(registry)
            await settle(s)
            assert not _hook_armed(registry)
            assert s.stats().live_tensors == 0, burst


async def test_in_background_runs_exactly_one_task_per_session_and_stops_it_at_close() -> None:
    before = len(_cleanup_tasks())
    async with at.AsyncEagerSession(cleanup=IB) as s1, at.AsyncEagerSession(cleanup=IB) as s2:
        await s1.zeros(1)
        assert _cleanup_tasks() == []  # opening spawns nothing: the first drop does
        for _ in range(3):
            for s in (s1, s2):
                await s.zeros(1)  # dropped at once
                await settle(s)
        assert len(_cleanup_tasks()) == before + 2
    assert len(_cleanup_tasks()) == before


@pytest.mark.parametrize("strategy", [SP, SC], ids=["ON_SAFE_POINTS", "ON_SESSION_CLOSE"])
async def test_other_strategies_start_no_task(strategy: at.ResourceCleanupStrategy) -> None:
    before = len(asyncio.all_tasks())
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        await s.zeros(3)
        assert len(asyncio.all_tasks()) == before
        assert _cleanup_tasks() == []


async def test_on_safe_points_frees_at_the_next_op_and_only_then() -> None:
    async with at.AsyncEagerSession(cleanup=SP) as s:
        t = await s.zeros(100)
        del t
        gc.collect()
        await asyncio.sleep(0.02)
        assert s.stats().pending == 1  # nothing runs between safe points
        u = await s.ones(1)  # the safe point before dispatch frees it
        stats = s.stats()
        assert (stats.pending, stats.freed, stats.live_tensors) == (0, 1, 1)
        del u


async def test_on_safe_points_frees_around_fetches() -> None:
    async with at.AsyncEagerSession(cleanup=SP) as s:
        keep = await s.ones(3)
        drop = await s.zeros(3)
        del drop
        assert s.stats().pending == 1
        np.testing.assert_array_equal(await keep.numpy(), np.ones(3))
        assert s.stats().pending == 0
        drop2 = await s.zeros(3)
        del drop2
        assert await s.run([keep]) is not None
        assert s.stats().pending == 0


async def test_on_session_close_frees_nothing_before_close() -> None:
    async with at.AsyncEagerSession(cleanup=SC) as s:
        for _ in range(5):
            await s.zeros(10)  # each result is dropped at once
        await asyncio.sleep(0.02)
        gc.collect()
        keep = await s.ones(1)
        stats = s.stats()
        assert stats.freed == 0
        assert stats.live_tensors == 6
        assert stats.pending == 5
        del keep
    assert s.stats().live_tensors == 0
    assert s.stats().freed == 6


async def _seeds_loop(s: at.AsyncEagerSession, n: int, m: int, size: int) -> tuple[int, int]:
    """n ops in a loop of m iterations, keeping only the last result; returns (peak bytes, tensor bytes)."""
    x = await s.random_normal((size,), dtype="float32", seed=1)
    last = x
    for _ in range(m):
        y = x
        for _ in range(n):
            y = await s.add(y, 1.0)
        last = y
    np.testing.assert_allclose(await last.numpy(), await x.numpy() + n, rtol=1e-5)
    return s.stats().peak_bytes, x.nbytes


@pytest.mark.parametrize("m", [10, 40])
async def test_seeds_loop_peak_is_constant_in_m_for_freeing_strategies(
    strategy: at.ResourceCleanupStrategy, m: int
) -> None:
    n, size = 5, 256
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        peak, per_tensor = await _seeds_loop(s, n, m, size)
    if strategy is SC:
        # every intermediate is kept: x plus n*m results
        assert peak == (n * m + 1) * per_tensor
    else:
        # x, the previous iteration's last result, the current input and output, plus
        # (in the background) a couple not yet collected: a constant, whatever m is.
        assert peak <= 8 * per_tensor, peak // per_tensor
    assert s.stats().live_bytes == 0


async def test_background_task_failure_is_logged_counted_and_restarted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = Registry.collect
    calls = {"n": 0}

    def flaky_collect(self: Registry) -> int:
        # The first collect with something to free fails: the task's (inline ops also
        # collect before they run, but these run before anything is dropped).
        if self.pending:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected cleanup fault")
        return original(self)

    monkeypatch.setattr(Registry, "collect", flaky_collect)
    caplog.set_level(logging.ERROR, logger="aiotensor")
    async with at.AsyncEagerSession(cleanup=IB) as s:
        t = await s.zeros(8)
        del t
        await settle(s)  # the first task died; its replacement frees the buffer
        stats = s.stats()
        assert stats.cleanup_failures == 1
        assert (stats.live_tensors, stats.freed, stats.allocated) == (0, 1, 1)
        assert len(_cleanup_tasks()) == 1
    assert "background cleanup task failed" in caplog.text


async def test_background_task_holds_no_reference_to_the_session() -> None:
    s = at.AsyncEagerSession(cleanup=IB)
    await s.zeros(4)
    registry = s._engine.registry
    with pytest.warns(ResourceWarning, match="unclosed"):
        del s
        gc.collect()
    await asyncio.sleep(0.01)  # the finalizer handed the shutdown to the loop
    assert registry.closed
    assert registry.live_tensors == 0
    assert _cleanup_tasks() == []


async def _blocking_apply(s: at.AsyncEagerSession, started: threading.Event, release: threading.Event) -> None:
    def slow(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        started.set()
        release.wait(5)
        return x + 1

    await s.apply(slow, np.zeros(16))


async def test_cancelled_op_result_is_freed_by_the_strategy(strategy: at.ResourceCleanupStrategy) -> None:
    started, release = threading.Event(), threading.Event()
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        task = asyncio.create_task(_blocking_apply(s, started, release))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        async with asyncio.timeout(5):
            while s.stats().allocated == 0:  # the kernel finishes and hands its result over
                await asyncio.sleep(0.001)
        if strategy is IB:
            await settle(s)
            assert s.stats().live_tensors == 0
        elif strategy is SP:
            assert s.stats().pending == 1
            await s.zeros(1)  # a safe point
            assert s.stats().freed == 1
        else:
            await asyncio.sleep(0.01)
            assert s.stats().live_tensors == 1
        # the session is still usable
        np.testing.assert_array_equal(await (await s.add(np.ones(2), 1)).numpy(), [2.0, 2.0])
    assert s.stats().live_tensors == 0
    assert s.stats().allocated == s.stats().freed
