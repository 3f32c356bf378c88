"""Load: 10,000 concurrent tasks on one session, 1,000 concurrent request-scoped sessions.

Small tensors keep each run within a few seconds; correctness is checked against
numpy for every task, and every buffer is accounted for (tracking oracle). A
deadlock would trip the ``asyncio.timeout`` rather than hang the suite.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._results import one
from ._tracking import check_accounting, check_all_released, tracked_session

TASKS = 10_000
SESSIONS = 1_000


def _affine(x: Any, scale: float) -> Any:
    return np.asarray(x) * scale + 1.0


@pytest.mark.slow
async def test_ten_thousand_concurrent_tasks_on_one_session(strategy: at.ResourceCleanupStrategy) -> None:
    s, registry, backend = tracked_session(strategy)
    async with s:
        base = await s.arange(3.0)

        async def task(i: int) -> None:
            a = await s.constant([float(i), 1.0, -1.0])
            b = await s.multiply(a, base)  # inline-sized: runs on the loop
            if i % 10 == 0:
                b = one(await s.apply(_affine, b, 2.0))  # user kernel: always on the pool
                expected = (np.array([i, 1.0, -1.0]) * np.arange(3.0)) * 2.0 + 1.0
            else:
                expected = np.array([i, 1.0, -1.0]) * np.arange(3.0)
            await asyncio.sleep(0)  # let the other tasks interleave while this one holds tensors
            np.testing.assert_array_equal(await b.numpy(), expected)

        async with asyncio.timeout(50):
            await asyncio.gather(*(task(i) for i in range(TASKS)))
        st = s.stats()
        assert st.in_flight == 0
        # all tasks held their tensors at once: this was concurrency, not a queue
        assert st.peak_bytes >= TASKS * 24
        assert st.allocated == 1 + 2 * TASKS + TASKS // 10
        check_accounting(registry, backend)
        if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
            assert st.freed == 0
    check_all_released(registry, backend)


@pytest.mark.slow
async def test_one_thousand_concurrent_request_sessions() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4))
    strategies = list(at.ResourceCleanupStrategy)
    app = at.AsyncEagerSession()
    requests: list[at.AsyncEagerSession] = []
    async with app:
        weights = await app.constant(w, name="W")

        async def request(i: int) -> None:
            row = rng.standard_normal(4)
            # a request-scoped child session per request, as a web handler would open
            async with at.AsyncEagerSession(parent=app, cleanup=strategies[i % 3]) as req:
                requests.append(req)
                x = await req.constant(row)
                y = await req.matmul(x, weights)  # reads the parent's tensor without a copy
                await asyncio.sleep(0)
                z = await req.relu(y)
                np.testing.assert_allclose(await z.numpy(), np.maximum(row @ w, 0.0), rtol=1e-12)
                assert z.session is req

        async with asyncio.timeout(50):
            await asyncio.gather(*(request(i) for i in range(SESSIONS)))
        assert app.stats().live_tensors == 1  # only the weights: nothing leaked into the parent
        np.testing.assert_array_equal(await weights.numpy(), w)
    assert len(requests) == SESSIONS
    for req in requests:
        st = req.stats()
        assert req.closed
        assert (st.live_tensors, st.live_bytes, st.in_flight) == (0, 0, 0)
        assert st.allocated == st.freed == 3
