"""Helpers for testing code built on aiotensor, with any test framework.

``await assert_no_leaks(session)`` checks that the code under test left no tensor
handle alive in ``session`` (beyond a baseline), after giving the session's cleanup
strategy its chance to free what was dropped. The pytest plugin
(``aiotensor.pytest_plugin``) adds an ``eager_session`` fixture on top.
"""

from __future__ import annotations

import gc

import anyio

from ._config import ResourceCleanupStrategy
from ._registry import SessionStats
from ._session import AsyncEagerSession
from ._tensor import Tensor

__all__ = ["assert_no_leaks", "live_handles"]

_LISTED = 10


def live_handles(session: AsyncEagerSession) -> list[Tensor]:
    """The tensor handles of ``session`` that are still referenced somewhere, oldest first.

    Found through the garbage collector (every handle refers to its session's engine), which
    walks the whole heap: meant for test failures, not for production code.
    """
    found = [o for o in gc.get_referrers(session._engine) if isinstance(o, Tensor) and o.session is session]
    found.sort(key=lambda t: t._rid)
    return found


async def _settle(session: AsyncEagerSession, timeout: float) -> None:  # noqa: ASYNC109 -- assert_no_leaks explains its timeout
    # Finalizers of unreachable handles run in gc.collect(); their buffers become pending.
    gc.collect()
    if session.closed:
        return
    if session.cleanup is ResourceCleanupStrategy.IN_BACKGROUND:
        try:
            with anyio.fail_after(timeout):
                while session.stats().pending:  # noqa: ASYNC110 -- no event to wait on: polling stats is public API
                    await anyio.sleep(0.001)
        except TimeoutError:
            raise AssertionError(
                f"the background cleanup of {session!r} did not free {session.stats().pending} pending"
                f" buffers within {timeout} s"
            ) from None
    elif session.cleanup is ResourceCleanupStrategy.ON_SAFE_POINTS:
        await session.run([])  # a safe point: frees what is pending


async def assert_no_leaks(
    session: AsyncEagerSession,
    baseline: SessionStats | None = None,
    *,
    # A deadline that turns into an AssertionError, not a cancellation: a helper's own setting.
    timeout: float = 2.0,  # noqa: ASYNC109
) -> None:
    """Fail unless every tensor handle made since ``baseline`` is gone, and its buffer freed.

    First collects garbage and lets the strategy free dropped buffers: waits (up to
    ``timeout`` seconds) for ``IN_BACKGROUND`` to drain; passes a safe point under
    ``ON_SAFE_POINTS``. Then compares the handles still alive (``live_tensors -
    pending``) and, when nothing is pending, ``live_bytes`` with ``baseline`` (a
    ``session.stats()`` taken before the code under test; ``None`` means an empty
    session). Under ``ON_SESSION_CLOSE`` dropped buffers stay until close by design:
    they are not counted as leaks, but handles still alive are.

    Handles the test itself still holds (a local variable) count as live: ``del``
    them first, or take the baseline after creating them.

    Raises:
        AssertionError: with the count, the bytes and the first handles still alive
            (name, dtype, shape, bytes).
    """
    await _settle(session, timeout)
    stats = session.stats()
    held = stats.live_tensors - stats.pending
    base_held = 0 if baseline is None else baseline.live_tensors - baseline.pending
    base_bytes = 0 if baseline is None else baseline.live_bytes
    problems = []
    if held > base_held:
        problems.append(f"{held - base_held} tensor handle(s) still alive ({held} now, {base_held} at the baseline)")
    if stats.pending == 0 and (baseline is None or baseline.pending == 0) and stats.live_bytes > base_bytes:
        problems.append(
            f"{stats.live_bytes - base_bytes} bytes still held ({stats.live_bytes} now, {base_bytes} at the baseline)"
        )
    if not problems:
        return
    raise AssertionError(f"{session!r} leaks: " + "; ".join(problems) + _describe_live(session))


def _describe_live(session: AsyncEagerSession) -> str:
    # A function of its own so that no handle stays in a frame of the traceback: a
    # caller catching the AssertionError must be able to drop the handles and retry.
    handles = live_handles(session)
    lines = [f"\n  {t.name}: {t.dtype}{list(t.shape)}, {t.nbytes} bytes on {t.device}" for t in handles[:_LISTED]]
    if len(handles) > _LISTED:
        lines.append(f"\n  ... and {len(handles) - _LISTED} more")
    return "".join(lines)
