"""Helpers for testing code built on aiotensor, with any test framework.

``await assert_no_leaks(session)`` checks that the code under test left no tensor
handle alive in ``session`` (beyond a baseline), after giving the session's cleanup
strategy its chance to free what was dropped. :class:`RecordingBackend` is a backend
for tests (as httpx's ``MockTransport``): pass it as ``backend=`` and it records what
the session asked of it (kernels submitted, buffers released) and lets a test inject
faults, with no private attribute swapped. :data:`OPS` and :func:`op_names` give the
op table, read-only, to a test that must cover every op. The pytest plugin
(``aiotensor.pytest_plugin``) adds an ``eager_session`` fixture on top.
"""

from __future__ import annotations

import collections
import gc
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import anyio

from ._backends._base import LocalBackend, PendingKernel
from ._config import ResourceCleanupStrategy
from ._opdef import ALIASES, OpDef
from ._opdef import OPS as _OPS
from ._registry import SessionStats
from ._session import AsyncEagerSession
from ._tensor import Tensor

__all__ = ["OPS", "RecordingBackend", "Submitted", "assert_no_leaks", "live_handles", "op_names"]

_LISTED = 10

OPS: Mapping[str, OpDef] = MappingProxyType(_OPS)
"""The op table, read-only: each op's name -> its definition.

It is the one source the session methods, the module functions, the operators, fused
``ops`` and ``aiotensor.xp`` are generated from. An entry's ``spec`` has the op's
signature and docstring; ``prepare`` runs the spec's argument checks; ``elementwise``,
``cost`` (a ``Cost`` member), ``returns`` and ``data`` (how many leading arguments are
tensor values) describe it. For a test that must cover every op (a parity suite)
instead of a list kept by hand.
"""


def op_names(*, aliases: bool = False) -> list[str]:
    """The names of every op of :data:`OPS`, sorted; with ``aliases``, their other names too (``asarray``).

    Each is a session method and a module function (``s.<name>``, ``aiotensor.<name>``).
    """
    return sorted([*_OPS, *ALIASES] if aliases else _OPS)


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


@dataclass(frozen=True, slots=True)
class Submitted:
    """A kernel a session submitted to a :class:`RecordingBackend` (not those run inline on the loop).

    Attributes:
        name: The kernel's name (``add``, ``function(f)``, ``expr_...``, ``apply(f)``).
        kernel: The callable itself.
        device: The device it was placed on.
        blas: Whether the session said it calls BLAS.
    """

    name: str
    kernel: Callable[..., Any]
    device: str
    blas: bool


class RecordingBackend(LocalBackend):
    """The local backend, recording what a session asks of it: for tests, passed as ``backend=``.

    Kernels run where the local backend runs them (the pool, or inline on the loop
    when cheap; ``inline=False`` sends every kernel to the pool), each whole on one
    worker (a large element-wise op is not split across workers, so that the handler
    sees every kernel). Each submitted kernel
    is recorded in :attr:`submitted`, and the name of the thread it ran on in
    :attr:`threads`; each release in :attr:`released`, keeping the released buffer
    alive so that ``id()`` values are not reused while the test runs.

    Args:
        handler: Called with each submitted kernel, ``handler(kernel, args, kwargs)``,
            on the thread that runs it, before it runs; raise in it to inject a
            kernel failure (its exception reaches the op as the kernel's would).
        inline: Whether cheap kernels may run inline on the loop (as ``LocalBackend``).
        **kwargs: As :class:`~aiotensor.LocalBackend` (``executor=``, ``priority=``).
    """

    releases = True  # (the registry calls release() so that it is recorded)

    def __init__(
        self,
        handler: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], object] | None = None,
        *,
        inline: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.inline_small_ops = self.inline_small_ops and inline
        self.handler = handler
        #: The kernels submitted so far, in order.
        self.submitted: list[Submitted] = []
        #: The threads the submitted kernels ran on, in the order they ran.
        self.threads: list[str] = []
        #: How many times each buffer (by ``id``) was released.
        self.released: collections.Counter[int] = collections.Counter()
        self._keep: list[Any] = []

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        device: str,
        blas: bool = False,
    ) -> PendingKernel:
        """Record the kernel, then submit it as :class:`~aiotensor.LocalBackend` does."""
        self.submitted.append(Submitted(getattr(fn, "__name__", type(fn).__name__), fn, device, blas))
        return super().submit(_Recorded(self, fn), args, kwargs, device=device, blas=blas)

    def release(self, handle: Any) -> None:
        """Record the release (and keep the buffer alive), then release it."""
        self.released[id(handle)] += 1
        self._keep.append(handle)
        super().release(handle)

    def was_released(self, handle: Any) -> bool:
        """Whether ``handle`` (a buffer) was released at least once."""
        return self.released[id(handle)] > 0

    def double_releases(self) -> list[int]:
        """The ids of buffers released more than once (a bug if not empty)."""
        return [k for k, n in self.released.items() if n > 1]


class _Recorded:
    """A submitted kernel that records its thread and calls the handler first (picklable as its kernel is)."""

    __slots__ = ("backend", "fn")

    def __init__(self, backend: RecordingBackend, fn: Callable[..., Any]) -> None:
        self.backend = backend
        self.fn = fn

    @property
    def __name__(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        backend = self.backend
        backend.threads.append(threading.current_thread().name)
        if backend.handler is not None:
            backend.handler(self.fn, args, kwargs)
        return self.fn(*args, **kwargs)
