"""A session whose event loop first ran in this thread and then runs in another one (wrong-loop tests)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

import numpy as np

import aiotensor as at

#: Event loop factories: asyncio's and, where installed, uvloop's.
NEW_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
with contextlib.suppress(ImportError):  # (uvloop is a test extra)
    import uvloop

    NEW_LOOPS["uvloop"] = uvloop.new_event_loop


@contextlib.contextmanager
def moved_session(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> Iterator[tuple[at.AsyncEagerSession, at.Tensor, asyncio.AbstractEventLoop]]:
    """(a session, its tensor ``arange(3.0)``, its loop): made on a new loop in this thread, then run in another.

    The loop is stopped, its thread joined and the loop closed at the end.
    """
    loop = new_loop()
    s = at.AsyncEagerSession()

    async def make() -> at.Tensor:
        return await s.constant(np.arange(3.0))

    t = loop.run_until_complete(make())
    worker = threading.Thread(target=loop.run_forever)
    worker.start()
    try:
        yield s, t, loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        worker.join(10)
        loop.close()
