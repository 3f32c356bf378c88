"""AsyncEagerSession: lifecycle, the default session, devices and ``run`` (the op path is in ``_dispatch``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Self

from . import _defaults
from ._backend import Backend, LocalBackend
from ._cleanup import make_policy
from ._config import ResourceCleanupStrategy, SessionConfig
from ._devices import canonical_device
from ._dispatch import Dispatcher, State
from ._errors import (
    InvalidArgumentError,
    InvalidDeviceError,
    SessionClosedError,
    WrongEventLoopError,
)
from ._function import FusedFunction
from ._registry import Registry, SessionStats
from ._structure import flatten, unflatten
from ._tensor import Tensor
from ._types import Fetches

__all__ = ["AsyncEagerSession"]

_OPEN = State.OPEN
_shared_local = LocalBackend()


class AsyncEagerSession(Dispatcher):
    """A session that owns every tensor buffer it creates; every op is a coroutine.

    Use it as ``async with AsyncEagerSession() as s:``; leaving the block frees every
    buffer, even on error or cancellation. The constructor needs no running loop: the
    session binds to the loop of its first use and starts its machinery then.

    Args:
        cleanup: When buffers of dropped handles are freed (see
            :class:`ResourceCleanupStrategy`).
        config: Placement, logging, pool and memory options.
        executor: A ``concurrent.futures.Executor`` to run kernels on, instead of the
            process-wide pool. Not shut down by the session.
        backend: Where kernels run and buffers live (e.g. ``DaskBackend``). Not closed
            by the session.
        parent: A session whose tensors this one may read without copying (e.g. an
            app-lifetime session holding model weights, read by request sessions). The
            parent must stay open while this session uses its tensors.
    """

    def __init__(
        self,
        *,
        cleanup: ResourceCleanupStrategy = ResourceCleanupStrategy.IN_BACKGROUND,
        config: SessionConfig | None = None,
        executor: concurrent.futures.Executor | None = None,
        backend: Backend | None = None,
        parent: AsyncEagerSession | None = None,
    ) -> None:
        if not isinstance(cleanup, ResourceCleanupStrategy):
            raise InvalidArgumentError(
                f"cleanup must be a ResourceCleanupStrategy"
                f" ({', '.join(s.name for s in ResourceCleanupStrategy)}), got {cleanup!r}"
            )
        config = SessionConfig() if config is None else config
        if not isinstance(config, SessionConfig):
            raise InvalidArgumentError(f"config must be a SessionConfig, got {type(config).__name__}")
        if executor is not None and backend is not None:
            raise InvalidArgumentError("pass executor= or backend=, not both")
        self._owns_backend = False
        if parent is not None:
            if not isinstance(parent, AsyncEagerSession):
                raise InvalidArgumentError(f"parent must be an AsyncEagerSession, got {type(parent).__name__}")
            if (backend is not None and backend is not parent.backend) or executor is not None:
                raise InvalidArgumentError("a child session runs on its parent's backend; drop executor=/backend=")
            backend = parent.backend
        elif backend is None:
            if executor is not None:
                backend = LocalBackend(executor)
            elif config.max_workers is not None:
                pool = concurrent.futures.ThreadPoolExecutor(config.max_workers, thread_name_prefix="aiotensor")
                backend = LocalBackend(pool, owns_executor=True)
                self._owns_backend = True
            else:
                backend = _shared_local
        self._cleanup = cleanup
        self._config = config
        self._backend: Backend = backend
        local = isinstance(backend, LocalBackend) and backend.inline_small_ops
        self._inline_us = config.inline_threshold_us if local else 0.0
        self._inline_streak = 0
        self._ancestors: tuple[AsyncEagerSession, ...] = () if parent is None else (parent, *parent._ancestors)
        self._policy = make_policy(cleanup)
        self._registry = Registry(backend.release, config.memory_limit, config.memory_wait)
        self._state = State.UNOPENED
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._opening: asyncio.Task[None] | None = None
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._closed_event: asyncio.Event | None = None
        self._device_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("aiotensor_device", default=None)

    # -- lifecycle ------------------------------------------------------------------
    @property
    def cleanup(self) -> ResourceCleanupStrategy:
        """The cleanup strategy."""
        return self._cleanup

    @property
    def config(self) -> SessionConfig:
        """The configuration."""
        return self._config

    @property
    def backend(self) -> Backend:
        """Where this session's kernels run and buffers live."""
        return self._backend

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun: no new op is accepted."""
        return self._state in (State.CLOSING, State.CLOSED)

    async def __aenter__(self) -> Self:
        try:
            await self._open()
        except asyncio.CancelledError:
            # __aexit__ will not run, yet the shielded start goes on: close in a task of its
            # own, outside the caller's (possibly level-triggered, as in anyio) cancellation.
            self._abort_close = asyncio.get_running_loop().create_task(self.close())
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _open(self) -> None:
        state = self._state
        if state is _OPEN:
            return
        if state is State.UNOPENED:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # e.g. trio, directly or through anyio
                raise WrongEventLoopError(
                    f"{self!r} needs a running asyncio event loop (asyncio or uvloop, also through"
                    " anyio's asyncio backend); none runs in this thread. trio is not supported: kernel"
                    " results come back as asyncio futures and IN_BACKGROUND frees from an asyncio task."
                ) from None
            if type(self._backend).start is Backend.start:
                # Nothing to await (the local backend): open now, without a task or a
                # trip through the loop, which is most of a request session's cost.
                self._bind(loop)
                self._policy.start(self._registry, loop)
                self._state = _OPEN
                return
            self._state = State.OPENING
            self._opening = loop.create_task(self._start())
        elif state is not State.OPENING:
            raise SessionClosedError(f"{self!r} is closed")
        assert self._opening is not None
        await asyncio.shield(self._opening)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed_event = asyncio.Event()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._bind(loop)
        assert self._closed_event is not None
        try:
            await self._backend.start()
        except BaseException:
            self._state = State.CLOSED
            self._closed_event.set()
            raise
        self._policy.start(self._registry, loop)
        if self._state is State.OPENING:
            self._state = _OPEN

    def _check_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise WrongEventLoopError(
                f"{self!r} is bound to the event loop it first ran on (thread {self._loop_thread});"
                " it was used from another loop or thread. Create one session per event loop."
            )

    async def close(self) -> None:
        """Refuse new ops, let in-flight ops settle, stop cleanup and free every buffer.

        Idempotent. Ops still waiting for their kernel when close begins get
        :class:`SessionClosedError` once the kernel finishes (a running kernel cannot
        be interrupted; close waits for those with a caller still awaiting them). If
        ``close`` itself is cancelled, everything is still freed before it re-raises.
        """
        state = self._state
        if state is State.CLOSED:
            return
        if state is State.CLOSING:
            assert self._closed_event is not None
            await self._closed_event.wait()
            return
        if state is State.UNOPENED:
            self._state = State.CLOSED
            _defaults.replace_interactive(self, None)
            await self._close_backend()
            return
        if state is State.OPENING:
            assert self._opening is not None
            with contextlib.suppress(Exception):
                await asyncio.shield(self._opening)
            if self._state is State.CLOSED:
                return
        self._check_loop()
        self._state = State.CLOSING
        try:
            if self._inflight:
                assert self._idle is not None
                await self._idle.wait()
        finally:
            stopping = self._shutdown_now()
            try:
                if stopping is not None:
                    await asyncio.wait([stopping])
            finally:  # also when that wait is cancelled (anyio cancels every await in a scope)
                await self._close_backend()

    def _shutdown_now(self) -> asyncio.Task[None] | None:
        stopping = self._policy.stop()
        self._registry.close()
        self._state = State.CLOSED
        _defaults.replace_interactive(self, None)
        if self._closed_event is not None:
            self._closed_event.set()
        return stopping

    async def _close_backend(self) -> None:
        if self._owns_backend:
            await self._backend.aclose()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_state", None) not in (_OPEN, State.CLOSING):
            return
        _warn(f"unclosed {self!r}: its buffers are freed now", ResourceWarning, source=self, stacklevel=1)
        policy, registry, loop = self._policy, self._registry, self._loop

        def finalize() -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                policy.stop()
            registry.close()

        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finalize)
                return
        finalize()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} cleanup={self._cleanup.name} state={self._state.value}"
            f" live={self._registry.live_tensors}>"
        )

    # -- introspection ----------------------------------------------------------------
    def stats(self) -> SessionStats:
        """An immutable snapshot of the buffers this session holds (see :class:`SessionStats`)."""
        return self._registry.stats(self._inflight, self._policy.failures)

    def list_devices(self) -> list[str]:
        """The devices ops may be placed on, e.g. ``["/cpu:0"]``; the first is the default."""
        return list(self._backend.devices())

    def device(self, name: str) -> contextlib.AbstractContextManager[str]:
        """Place the ops of this session run inside ``with s.device(name):`` on device ``name``.

        A malformed name raises :class:`InvalidDeviceError` here; whether the device
        exists is checked when an op runs: an unknown one raises
        :class:`InvalidDeviceError`, unless ``allow_soft_placement`` is set.
        """
        return self._device_scope(canonical_device(name))

    @contextlib.contextmanager
    def _device_scope(self, name: str) -> Iterator[str]:
        token = self._device_var.set(name)
        try:
            yield name
        finally:
            self._device_var.reset(token)

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Self]:
        """Make this the default session of the current context (module-level ops use it)."""
        token = _defaults.current.set(self)
        try:
            yield self
        finally:
            _defaults.current.reset(token)

    def _place(self, op: str) -> str:
        requested = self._device_var.get()
        if requested is None:  # the common case: no list of devices needed
            return self._backend.default_device
        devices = self._backend.devices()
        if requested in devices:
            return requested
        if self._config.allow_soft_placement:
            return devices[0]
        raise InvalidDeviceError(
            f"{op}: no device {requested!r}; this session has {devices}."
            f" Set SessionConfig(allow_soft_placement=True) to fall back to {devices[0]!r}"
        )

    # -- fetches ----------------------------------------------------------------------
    async def run(self, fetches: Fetches) -> Any:
        """TF1's ``sess.run``: the numpy value of a tensor, or of a nested list/tuple/dict of tensors.

        The structure is kept; each value is a copy owned by the caller.
        """
        leaves: list[Tensor] = []
        flatten(fetches, leaves)
        values = await self._fetch(leaves, "run")
        return unflatten(fetches, iter(values))

    def function(self, fn: Callable[..., Any], /) -> FusedFunction:
        """``fn(ops, *args)`` as one op of this session: its ops run synchronously on one worker.

        See :func:`aiotensor.function` (the same, with the session found from the arguments).
        """
        return FusedFunction(fn, self)
