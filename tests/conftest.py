"""Shared fixtures: every async test runs on asyncio and, where installed, uvloop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest

import aiotensor as at

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a test extra; skip its runs without it
    uvloop = None  # type: ignore[assignment]

STRATEGIES = list(at.ResourceCleanupStrategy)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run each async test on the default asyncio loop and on uvloop."""
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.fixture(params=STRATEGIES, ids=[s.name for s in STRATEGIES])
def strategy(request: pytest.FixtureRequest) -> at.ResourceCleanupStrategy:
    """Each of the three cleanup strategies."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def session(strategy: at.ResourceCleanupStrategy) -> AsyncIterator[at.AsyncEagerSession]:
    """An open session per strategy, closed (and checked empty) after the test."""
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        yield s
    stats = s.stats()
    assert stats.live_tensors == 0
    assert stats.live_bytes == 0


@pytest.fixture
async def s() -> AsyncIterator[at.AsyncEagerSession]:
    """An open session with the default strategy, for tests of ops rather than of cleanup."""
    async with at.AsyncEagerSession() as session:
        yield session


@pytest.fixture(scope="module")
def loop_session() -> Iterator[tuple[asyncio.AbstractEventLoop, at.AsyncEagerSession]]:
    """A session on an event loop of its own, for synchronous (hypothesis) tests: one per module."""
    loop = asyncio.new_event_loop()
    session = at.AsyncEagerSession()
    loop.run_until_complete(session.__aenter__())
    yield loop, session
    loop.run_until_complete(session.__aexit__(None, None, None))
    loop.close()


async def settle(session: at.AsyncEagerSession, timeout: float = 2.0) -> None:
    """Collect garbage and wait until the background task has nothing pending."""
    gc.collect()
    async with asyncio.timeout(timeout):
        while session.stats().pending:
            await asyncio.sleep(0.001)


@pytest.fixture(scope="module")
def strict_2024_12() -> Iterator[None]:
    """array-api-strict speaking the standard aiotensor.xp implements, for one module's tests.

    array-api-strict defaults to a later version; a module-level ``set_array_api_strict_flags``
    would leak into every other test module of the run (``isin`` is a 2025.12 function).
    """
    strict = pytest.importorskip("array_api_strict")
    with strict.ArrayAPIStrictFlags(api_version="2024.12"):
        yield


@pytest.fixture
def fresh_recycler() -> Iterator[None]:
    """Nothing kept or learned by the interpreter's recycler in an earlier test (on this thread)."""
    from aiotensor._programs import _recycler
    from aiotensor._programs._interpreter import RECYCLER

    def clear() -> None:
        RECYCLER.clear()
        _recycler.SPECS.clear()
        _recycler.WANTED.clear()

    clear()
    yield
    clear()


@pytest.fixture
def layouts_run(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every blocked run's ``Layout`` as it runs, in order (so a test knows, and sees, the blocked path ran)."""
    from aiotensor._programs import _blocked_layout

    seen: list[Any] = []
    real = _blocked_layout.Layout.run

    def run(self: Any, inputs: Any, flagged: Any) -> Any:
        seen.append(self)
        return real(self, inputs, flagged)

    monkeypatch.setattr(_blocked_layout.Layout, "run", run)
    return seen
