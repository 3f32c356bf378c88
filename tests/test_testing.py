"""``aiotensor.testing.assert_no_leaks``: it passes on clean code and fails, usefully, on leaks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor.testing import RecordingBackend, assert_no_leaks, live_handles

CLOSE = at.ResourceCleanupStrategy.ON_SESSION_CLOSE


async def test_clean_code_passes(session: at.AsyncEagerSession) -> None:
    x = await session.constant(np.arange(6.0), name="x")
    y = await session.multiply(await session.add(x, 1.0), 2.0)
    np.testing.assert_array_equal(await y.numpy(), (np.arange(6.0) + 1) * 2)
    del x, y
    await assert_no_leaks(session)
    if session.cleanup is not CLOSE:
        assert session.stats().live_bytes == 0  # dropped buffers were really freed, not just counted


async def test_a_held_handle_is_reported_by_name(session: at.AsyncEagerSession) -> None:
    kept = [await session.zeros((3, 4), dtype="float32", name="forgotten")]
    tmp = await session.ones((5,))
    del tmp
    with pytest.raises(AssertionError) as info:
        await assert_no_leaks(session)
    message = str(info.value)
    assert "1 tensor handle(s) still alive" in message
    assert "forgotten: float32[3, 4], 48 bytes on /cpu:0" in message
    assert [t.name for t in live_handles(session)] == ["forgotten"]
    kept.clear()
    await assert_no_leaks(session)


async def test_baseline_allows_what_was_live_before(session: at.AsyncEagerSession) -> None:
    weights = await session.constant([[1.0, 2.0], [3.0, 4.0]], name="weights")
    baseline = session.stats()
    out = await session.matmul(weights, weights)
    np.testing.assert_array_equal(await out.numpy(), [[7.0, 10.0], [15.0, 22.0]])
    with pytest.raises(AssertionError, match="matmul"):
        await assert_no_leaks(session, baseline)
    del out
    await assert_no_leaks(session, baseline)
    with pytest.raises(AssertionError, match="weights"):
        await assert_no_leaks(session)  # against an empty session, the weights are live


async def test_a_closed_session_has_no_leaks(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        kept = await s.ones((2,))
    await assert_no_leaks(s)  # close freed the buffer even though the handle lives on
    assert kept.shape == (2,)


async def test_the_plugin_fixture_works_in_this_suite(
    eager_session: at.AsyncEagerSession, eager_session_strategy: at.ResourceCleanupStrategy
) -> None:
    # The plugin is loaded through its entry point next to our conftest; the names do not clash.
    assert eager_session.cleanup is eager_session_strategy is at.ResourceCleanupStrategy.IN_BACKGROUND
    t = await eager_session.arange(4)
    assert (await t.numpy()).tolist() == [0, 1, 2, 3]
    del t
    await assert_no_leaks(eager_session)


async def test_the_recording_backend_records_kernels_and_releases() -> None:
    backend = RecordingBackend(inline=False)
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.constant(np.arange(3.0))
        y = await s.add(x, 1.0)
        np.testing.assert_array_equal(await y.numpy(), [1.0, 2.0, 3.0])
        assert [k.name for k in backend.submitted] == ["constant", "add"]
        assert all(k.device == "/cpu:0" for k in backend.submitted)
        assert len(backend.threads) == 2
        del x, y
    assert sum(backend.released.values()) == 2  # both buffers, each once, at the latest at close
    assert not backend.double_releases()


async def test_the_recording_backend_injects_faults() -> None:
    def fail_adds(kernel: Any, args: Any, kwargs: Any) -> None:
        if getattr(kernel, "__name__", "") == "add":
            raise MemoryError("injected")

    async with at.AsyncEagerSession(backend=RecordingBackend(fail_adds, inline=False)) as s:
        x = await s.constant([1.0])
        with pytest.raises(at.ResourceExhaustedError, match="injected"):
            await s.add(x, 1.0)
        np.testing.assert_array_equal(await (await s.multiply(x, 2.0)).numpy(), [2.0])
        assert s.stats().live_tensors == 2


async def test_the_recording_backend_runs_cheap_kernels_inline_by_default() -> None:
    backend = RecordingBackend()
    async with at.AsyncEagerSession(backend=backend) as s:
        await s.add(await s.constant([1.0]), 1.0)
    assert backend.submitted == []
