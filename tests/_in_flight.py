"""Work run while another task has a request in flight, as the web middleware counts one (busy-loop placement tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiotensor as at
from aiotensor import _loopload


async def request_in_flight(work: Callable[[], Awaitable[None]]) -> None:
    """``work`` while another task has a request in flight; checked to leave none in flight after."""
    began, done = asyncio.Event(), asyncio.Event()

    async def request() -> None:
        _loopload.enter()
        try:
            began.set()
            await done.wait()
        finally:
            _loopload.leave()

    other = asyncio.create_task(request())
    await began.wait()
    try:
        await work()
    finally:
        done.set()
        await other
    assert at.loop_load().requests == 0
