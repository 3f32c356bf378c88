"""AsyncEagerSession: a facade holding its engine, registry, cleanup policy and backend.

The op path, lifecycle state and fetches live in :class:`~aiotensor._engine._core.Engine`;
the op methods are generated from the op table (``_generated_session_ops.py``). This module keeps
the public surface: construction, ``async with``, ``close``, ``run``, devices,
defaults and ``stats``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self, cast

from . import _defaults
from ._backends._allocator import BufferCache, malloc_trim
from ._backends._base import Backend, LocalBackend
from ._backends._pool import WorkerPool
from ._cleanup import make_policy
from ._config import ResourceCleanupStrategy, SessionConfig
from ._devices import canonical_device
from ._engine._core import Engine
from ._engine._lifecycle import State
from ._errors import InvalidArgumentError
from ._expr import Expr
from ._fusion._function import FusedFunction
from ._generated_session_ops import SessionOps
from ._registry import Registry, SessionStats
from ._structure import flatten, unflatten
from ._tensor import Tensor

if TYPE_CHECKING:
    from ._types import Fetches

__all__ = ["AsyncEagerSession", "get_default_session"]

#: The backend of sessions on the shared pool, one per worker priority.
_shared_local: dict[object, LocalBackend] = {}
# Below 1 MiB glibc reuses freed memory without faults once its mmap threshold has
# adapted, and the cache's bookkeeping (a few µs) would cost more than it saves.
_CACHE_MIN_BYTES = 1 << 20
_CACHE_PER_KEY = 4
_DEFAULT_CONFIG = SessionConfig()  # frozen: one instance serves every session made without config=
# States as tuples made once (an enum member looked up on its class costs ~80 ns).
_ENDED = (State.CLOSING, State.CLOSED)
_LIVE = (State.OPEN, State.CLOSING)


def _is_fetch(x: Any) -> bool:
    return type(x) is Tensor or type(x) is Expr


class AsyncEagerSession(SessionOps):
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
        config = _DEFAULT_CONFIG if config is None else config
        if not isinstance(config, SessionConfig):
            raise InvalidArgumentError(f"config must be a SessionConfig, got {type(config).__name__}")
        if executor is not None and backend is not None:
            raise InvalidArgumentError("pass executor= or backend=, not both")
        self._owns_backend = False
        self._entered = False
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
                pool = WorkerPool(config.max_workers, priority=config.worker_priority)
                backend = LocalBackend(pool, owns_executor=True)
                self._owns_backend = True
            else:
                priority = config.worker_priority
                backend = _shared_local.get(priority)
                if backend is None:
                    backend = _shared_local.setdefault(priority, LocalBackend(priority=priority))
        self._cleanup = cleanup
        self._config = config
        cache: BufferCache | None
        if parent is not None:
            cache = parent._engine.registry.cache  # request sessions recycle into the app's
        elif backend.in_process and config.buffer_cache_bytes:
            cache = BufferCache(config.buffer_cache_bytes, min_bytes=_CACHE_MIN_BYTES, per_key=_CACHE_PER_KEY)
        else:
            cache = None
        self._engine = Engine(
            self,
            backend,
            make_policy(cleanup),
            Registry(
                backend.release if backend.releases else None,
                config.memory_limit,
                config.memory_wait,
                cache,
                owns_cache=parent is None,
            ),
            inline_us=config.inline_threshold_us,
            log_placement=config.log_device_placement,
            soft_placement=config.allow_soft_placement,
            parent=None if parent is None else parent._engine,
        )

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
        return self._engine.backend

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun: no new op is accepted."""
        return self._engine.state in _ENDED

    async def __aenter__(self) -> Self:
        if self._entered and not self.closed:
            # A second ``async with`` on an open session would close it when its inner
            # block exits, under the outer block's feet.
            raise RuntimeError(f"{self!r} is already open in an `async with` block; nest a child session instead")
        try:
            await self._engine.open()
        except asyncio.CancelledError:
            # __aexit__ will not run, yet the shielded start goes on: close in a task of its
            # own, outside the caller's (possibly level-triggered, as in anyio) cancellation.
            self._abort_close = asyncio.get_running_loop().create_task(self.close())
            raise
        self._entered = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._engine.close(self._close_backend if self._owns_backend else None)  # (close(), one frame less)

    async def close(self) -> None:
        """Refuse new ops, let in-flight ops settle, stop cleanup and free every buffer.

        Idempotent. Ops still waiting for their kernel when close begins get
        ``SessionClosedError`` once the kernel finishes (a running kernel cannot
        be interrupted; close waits for those with a caller still awaiting them). If
        ``close`` itself is cancelled, everything is still freed before it re-raises.
        """
        await self._engine.close(self._close_backend if self._owns_backend else None)

    async def aclose(self) -> None:
        """The same as :meth:`close` (for ``contextlib.aclosing`` and anyio's resources)."""
        await self.close()

    async def _close_backend(self) -> None:
        if self._owns_backend:
            await self._engine.backend.aclose()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        engine = getattr(self, "_engine", None)
        if engine is None or engine.state not in _LIVE:
            return
        _warn(f"unclosed {self!r}: its buffers are freed now", ResourceWarning, source=self, stacklevel=1)
        engine.finalize_unclosed()

    def __repr__(self) -> str:
        engine = self._engine
        return (
            f"<{type(self).__name__} cleanup={self._cleanup.name} state={engine.state.value}"
            f" live={engine.registry.live_tensors}>"
        )

    # -- introspection ----------------------------------------------------------------
    def stats(self) -> SessionStats:
        """An immutable snapshot of the buffers this session holds (see :class:`SessionStats`)."""
        engine = self._engine
        return engine.registry.stats(engine.inflight, engine.policy.failures)

    def trim(self) -> int:
        """Let go of the buffers the buffer cache keeps for reuse; return how many bytes that was.

        The cache is shared with child sessions (a root session's). Afterwards the C
        allocator is asked to return free memory to the system (glibc's
        ``malloc_trim``, where available), so a service can shrink after a burst.
        """
        cache = self._engine.registry.cache
        released = 0 if cache is None else cache.clear()
        malloc_trim()
        return released

    def list_devices(self) -> list[str]:
        """The devices ops may be placed on, e.g. ``["/cpu:0"]``; the first is the default."""
        return list(self._engine.backend.devices())

    def device(self, name: str) -> contextlib.AbstractContextManager[str]:
        """Place the ops of this session run inside ``with s.device(name):`` on device ``name``.

        A malformed name raises :class:`InvalidDeviceError` here; whether the device
        exists is checked when an op runs: an unknown one raises
        :class:`InvalidDeviceError`, unless ``allow_soft_placement`` is set.
        """
        return self._device_scope(canonical_device(name))

    @contextlib.contextmanager
    def _device_scope(self, name: str) -> Iterator[str]:
        token = self._engine.use_device(name)
        try:
            yield name
        finally:
            self._engine.device_var.reset(token)

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Self]:
        """Make this the default session of the current context (module-level ops use it)."""
        token = _defaults.current.set(self)
        try:
            yield self
        finally:
            _defaults.current.reset(token)

    # -- fetches ----------------------------------------------------------------------
    async def run(self, fetches: Fetches) -> Any:
        """TF1's ``sess.run``: the numpy value of a tensor or expression, or of a nested list/tuple/dict of them.

        The structure is kept; each value is a copy owned by the caller. The
        expressions in it are evaluated together, in one program: a subexpression
        they share is computed once.
        """
        leaves = flatten(fetches, _is_fetch)
        values = await self._engine.run_values(leaves, "run")
        return unflatten(fetches, _is_fetch, iter(values))

    def function(self, fn: Callable[..., Any], /) -> FusedFunction:
        """``fn(ops, *args)`` as one op of this session: its ops run synchronously on one worker.

        See :func:`aiotensor.function` (the same, with the session found from the arguments).
        """
        return FusedFunction(fn, self)


def get_default_session() -> AsyncEagerSession | None:
    """The session module-level ops use when no tensor argument names one.

    The context's default (``with s.as_default():``) if set, else the open
    ``InteractiveSession``, else ``None``.
    """
    return cast("AsyncEagerSession | None", _defaults.get_default_session())
