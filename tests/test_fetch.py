"""Tests for aiotensor._engine._fetch: the fetch without a coroutine (``fetch_now``) and its loop check."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a test extra
    uvloop = None  # type: ignore[assignment]

LOOPS: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
if uvloop is not None:
    LOOPS.append(uvloop.new_event_loop)


def _in_thread_loop(factory: Callable[[], asyncio.AbstractEventLoop], fn: Callable[[], Any]) -> Any:
    """``fn()`` called from a coroutine of a loop made by ``factory``, run in a thread of its own."""
    out: list[Any] = []

    def main() -> None:
        loop = factory()
        try:

            async def call() -> None:
                out.append(fn())

            loop.run_until_complete(call())
        finally:
            loop.close()

    thread = threading.Thread(target=main)
    thread.start()
    thread.join()
    return out[0]


async def test_fetch_now_gives_an_owned_copy_on_the_session_loop(s: at.AsyncEagerSession) -> None:
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = await s.constant(value)
    out = s._engine.fetch_now(t)
    assert out is not None
    np.testing.assert_array_equal(out, value)
    assert out.flags.writeable
    assert not np.shares_memory(out, np.asarray(t))
    np.testing.assert_array_equal(await t.numpy(), value)


@pytest.mark.parametrize("factory", LOOPS, ids=lambda f: f.__module__.split(".")[0])
async def test_fetch_now_declines_on_another_loop_in_another_thread(
    s: at.AsyncEagerSession, factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    # The session's loop runs in this thread; a loop of another thread is not its loop,
    # whichever kind either is: fetch_now leaves it to fetch, which raises.
    t = await s.constant(np.ones((2, 2), np.float32))
    assert _in_thread_loop(factory, lambda: s._engine.fetch_now(t)) is None
    assert s._engine.fetch_now(t) is not None  # (and still takes it on its own loop)


@pytest.mark.parametrize("factory", LOOPS, ids=lambda f: f.__module__.split(".")[0])
def test_fetch_now_follows_the_session_loop_to_another_thread(factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    # A loop may stop and run again in another thread: the fetch is taken there, and not
    # in a loop of its own that the thread which ran the session's loop first runs now.
    loop = factory()
    other = factory()
    try:

        async def make() -> tuple[at.AsyncEagerSession, at.Tensor]:
            session = at.AsyncEagerSession()
            await session.__aenter__()
            return session, await session.constant(np.ones(3, np.float32))

        session, t = loop.run_until_complete(make())
        engine = session._engine
        seen: list[Any] = []

        async def fetch() -> None:
            seen.append(engine.fetch_now(t))

        thread = threading.Thread(target=loop.run_until_complete, args=(fetch(),))
        thread.start()
        thread.join()
        other.run_until_complete(fetch())  # this thread, another loop
        assert seen[0] is not None
        assert seen[1] is None
        np.testing.assert_array_equal(seen[0], np.ones(3, np.float32))
        loop.run_until_complete(session.close())
    finally:
        other.close()
        loop.close()
